// GPU unit tests of the Hopper primitive layer (src/device/sm90) against plain CPU loops:
// wgmma SS and RS forms with 128B-swizzled descriptors (K-major and N-major B), TMA loads of a paged
// cache through the kernels' tensor map with mbarrier completion, named barriers and
// setmaxnreg, stmatrix. Each kernel is compiled for sm_90a only; the tests skip on other GPUs.
#include <cuda_bf16.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "device/sm90/matrix_store.cuh"
#include "device/sm90/swizzle.cuh"
#include "device/sm90/sync.cuh"
#include "device/sm90/wgmma.cuh"
#include "device/sm90/wgmma_fragment.cuh"
#include "dispatch/tma_tensor.h"
#include "gpu_test_util.h"
#include "kernels/sm90/launch.h"
#include "reference/host_numeric.h"

namespace mlakit::testing {

// Byte offset of element (r, c) of a [rows][64] 16-bit slab in the 128-byte swizzle
// (docs/hopper.md, Swizzle; device/sm90/swizzle.cuh): element c is in 16-byte chunk c / 8.
__host__ __device__ inline int sw128_offset(int r, int c) {
  return device::sm90::sw128_offset(r, c / 8) + 2 * (c % 8);
}

namespace {

namespace dev = mlakit::device::sm90;

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define SM90_KERNEL_BODY 1
#else
#define SM90_KERNEL_BODY 0
#endif

#define SKIP_WITHOUT_HOPPER()                                              \
  do {                                                                     \
    MLAKIT_SKIP_WITHOUT_GPU();                                             \
    if (!is_hopper()) GTEST_SKIP() << "needs a compute capability 9.0 GPU"; \
  } while (0)


std::vector<uint16_t> random_bf16(std::size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = host::float_to_bf16(dist(rng));
  return v;
}

#if SM90_KERNEL_BODY
// RS A-fragment of k-step kk of a row-major [64][k] 16-bit matrix for thread t (docs/hopper.md,
// wgmma fragments): register r holds row 16w + l/4 + 8 (r & 1), columns 16kk + 2 (l % 4) + 8 (r >> 1)
// and the next one.
__device__ void load_a_fragment(const uint16_t* a, int k, int kk, uint32_t (&frag)[4]) {
  const int t = threadIdx.x % 128, w = t / 32, l = t % 32;
  for (int r = 0; r < 4; ++r) {
    const int row = 16 * w + l / 4 + 8 * (r & 1), col = 16 * kk + 2 * (l % 4) + 8 * (r >> 1);
    frag[r] = a[row * k + col] | (uint32_t{a[row * k + col + 1]} << 16);
  }
}
#endif

// ---- wgmma m64n64k16, A and B K-major: D[64][64] = A[64][64] * B[64][64]^T ----
// k-steps 0, 1 take A from shared memory (SS), k-steps 2, 3 from registers (RS), in one chain.

__global__ void wgmma_n64_kernel(const uint16_t* a, const uint16_t* b, float* d) {
#if SM90_KERNEL_BODY
  __shared__ __align__(1024) uint8_t sa[64 * 128];
  __shared__ __align__(1024) uint8_t sb[64 * 128];
  const int t = threadIdx.x;
  for (int i = t; i < 64 * 64; i += 128) *reinterpret_cast<uint16_t*>(&sa[sw128_offset(i / 64, i % 64)]) = a[i];
  for (int i = t; i < 64 * 64; i += 128) *reinterpret_cast<uint16_t*>(&sb[sw128_offset(i / 64, i % 64)]) = b[i];
  uint32_t frag[2][4];
  load_a_fragment(a, 64, 2, frag[0]);
  load_a_fragment(a, 64, 3, frag[1]);
  dev::fence_proxy_async_smem();
  __syncthreads();
  float acc[32];
  dev::wgmma_fence();
  for (int kk = 0; kk < 4; ++kk) {
    const uint64_t desc_b = dev::make_sw128_desc(dev::smem_u32(sb) + 32 * kk, 16, 1024);
    if (kk < 2) {
      dev::wgmma_ss_m64n64k16_bf16<0>(acc, dev::make_sw128_desc(dev::smem_u32(sa) + 32 * kk, 16, 1024), desc_b, kk > 0);
    } else {
      dev::wgmma_rs_m64n64k16_bf16<0>(acc, frag[kk - 2], desc_b, true);
    }
  }
  dev::wgmma_commit();
  dev::wgmma_wait<0>();
  dev::fence_registers(acc);
  dev::fence_registers(frag);
  for (int i = 0; i < 32; ++i) d[dev::acc_row(t, i) * 64 + dev::acc_col(t, i)] = acc[i];
#endif
}

TEST(Sm90Primitives, WgmmaM64N64K16SsAndRsKMajorMatchCpu) {
  SKIP_WITHOUT_HOPPER();
  const auto a = random_bf16(64 * 64, 1), b = random_bf16(64 * 64, 2);
  DeviceBuffer da(a), db(b), dd(64 * 64 * 4);
  wgmma_n64_kernel<<<1, 128>>>(static_cast<uint16_t*>(da.get()), static_cast<uint16_t*>(db.get()),
                               static_cast<float*>(dd.get()));
  MLAKIT_ASSERT_CUDA(cudaDeviceSynchronize());
  const auto d = dd.download<float>();
  for (int r = 0; r < 64; ++r) {
    for (int c = 0; c < 64; ++c) {
      double ref = 0;
      for (int k = 0; k < 64; ++k) ref += double(host::bf16_to_float(a[r * 64 + k])) * host::bf16_to_float(b[c * 64 + k]);
      ASSERT_NEAR(d[r * 64 + c], ref, 1e-4 + 1e-5 * std::fabs(ref)) << "row " << r << " col " << c;
    }
  }
}

// ---- wgmma m64n256k16, B N-major (V as [keys][d]): D[64][256] = P[64][64] * V[64][256] ----
// V is stored as 4 slabs of [64 keys][64 d], LBO = 8192 (next 64 d), SBO = 1024 (next 8 keys).
// k-steps 0, 1 take P from shared memory (SS), k-steps 2, 3 from registers (RS).

__global__ void wgmma_n256_kernel(const uint16_t* p, const uint16_t* v, float* d) {
#if SM90_KERNEL_BODY
  extern __shared__ uint8_t raw[];
  uint8_t* base = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t{1023});
  uint8_t* sp = base;             // 8 KB
  uint8_t* sv = base + 64 * 128;  // 4 x 8 KB
  const int t = threadIdx.x;
  for (int i = t; i < 64 * 64; i += 128) *reinterpret_cast<uint16_t*>(&sp[sw128_offset(i / 64, i % 64)]) = p[i];
  for (int i = t; i < 64 * 256; i += 128) {
    const int key = i / 256, col = i % 256;
    *reinterpret_cast<uint16_t*>(&sv[(col / 64) * 8192 + sw128_offset(key, col % 64)]) = v[i];
  }
  dev::fence_proxy_async_smem();
  __syncthreads();
  uint32_t frag[2][4];
  load_a_fragment(p, 64, 2, frag[0]);
  load_a_fragment(p, 64, 3, frag[1]);
  float acc[128];
  for (int i = 0; i < 128; ++i) acc[i] = 0.f;
  dev::wgmma_fence();
  for (int kk = 0; kk < 4; ++kk) {
    const uint64_t desc_v = dev::make_sw128_desc(dev::smem_u32(sv) + 2048 * kk, 8192, 1024);
    if (kk < 2) {
      dev::wgmma_ss_m64n256k16_bf16<1>(acc, dev::make_sw128_desc(dev::smem_u32(sp) + 32 * kk, 16, 1024), desc_v, true);
    } else {
      dev::wgmma_rs_m64n256k16_bf16<1>(acc, frag[kk - 2], desc_v, true);
    }
  }
  dev::wgmma_commit();
  dev::wgmma_wait<0>();
  dev::fence_registers(acc);
  dev::fence_registers(frag);
  for (int i = 0; i < 128; ++i) d[dev::acc_row(t, i) * 256 + dev::acc_col(t, i)] = acc[i];
#endif
}

TEST(Sm90Primitives, WgmmaM64N256K16SsAndRsNMajorBMatchCpu) {
  SKIP_WITHOUT_HOPPER();
  const auto p = random_bf16(64 * 64, 3), v = random_bf16(64 * 256, 4);
  DeviceBuffer dp(p), dv(v), dd(64 * 256 * 4);
  constexpr int kSmem = 5 * 8192 + 1024;
  MLAKIT_ASSERT_CUDA(cudaFuncSetAttribute(wgmma_n256_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  wgmma_n256_kernel<<<1, 128, kSmem>>>(static_cast<uint16_t*>(dp.get()), static_cast<uint16_t*>(dv.get()),
                                       static_cast<float*>(dd.get()));
  MLAKIT_ASSERT_CUDA(cudaDeviceSynchronize());
  const auto d = dd.download<float>();
  for (int r = 0; r < 64; ++r) {
    for (int c = 0; c < 256; ++c) {
      double ref = 0;
      for (int k = 0; k < 64; ++k) ref += double(host::bf16_to_float(p[r * 64 + k])) * host::bf16_to_float(v[k * 256 + c]);
      ASSERT_NEAR(d[r * 256 + c], ref, 1e-4 + 1e-5 * std::fabs(ref)) << "row " << r << " col " << c;
    }
  }
}

// ---- TMA 4D load of a paged cache + mbarrier completion ----
// Cache [blocks 5][page 16][h_kv 2][576] bf16; four 16-row boxes of head 1, columns 64..127,
// from physical blocks {3, 0, 4, 1}, stacked into one [64][64] swizzled slab.

__global__ void tma_paged_kernel(const __grid_constant__ CUtensorMap map, uint16_t* out) {
#if SM90_KERNEL_BODY
  __shared__ __align__(1024) uint8_t slab[64 * 128];
  __shared__ uint64_t full;
  const int blocks[4] = {3, 0, 4, 1};
  if (threadIdx.x == 0) {
    dev::mbarrier_init(&full, 1);
    dev::fence_mbarrier_init();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    dev::mbarrier_expect_tx(&full, 4 * 16 * 128);
    for (int j = 0; j < 4; ++j) dev::tma_load_4d(&slab[j * 16 * 128], &map, &full, 64, 1, 0, blocks[j]);
    dev::mbarrier_arrive(&full);
  }
  dev::mbarrier_wait(&full, 0);
  for (int i = threadIdx.x; i < 64 * 64; i += blockDim.x) {
    out[i] = *reinterpret_cast<const uint16_t*>(&slab[sw128_offset(i / 64, i % 64)]);
  }
#endif
}

TEST(Sm90Primitives, TmaPagedLoadCompletesOnMbarrierInSwizzledLayout) {
  SKIP_WITHOUT_HOPPER();
  constexpr int kBlocks = 5, kPage = 16, kHeads = 2, kD = 576;
  const auto cache = random_bf16(std::size_t{kBlocks} * kPage * kHeads * kD, 5);
  DeviceBuffer dc(cache), dout(64 * 64 * 2);
  const TensorRef ref = make_tensor(dc.get(), DType::kBF16, {kBlocks, kPage, kHeads, kD});
  CUtensorMap map;
  std::string why;
  ASSERT_TRUE(detail::make_kv_tensor_map(detail::tma_tensor(ref), kPage, &map, &why)) << why;
  tma_paged_kernel<<<1, 128>>>(map, static_cast<uint16_t*>(dout.get()));
  MLAKIT_ASSERT_CUDA(cudaDeviceSynchronize());
  const auto out = dout.download<uint16_t>();
  const int blocks[4] = {3, 0, 4, 1};
  for (int r = 0; r < 64; ++r) {
    for (int c = 0; c < 64; ++c) {
      const std::size_t src = ((std::size_t(blocks[r / 16]) * kPage + r % 16) * kHeads + 1) * kD + 64 + c;
      ASSERT_EQ(out[r * 64 + c], cache[src]) << "row " << r << " col " << c;
    }
  }
}

// ---- named barriers between two warpgroups after setmaxnreg ----

__global__ void __launch_bounds__(384, 1) named_barrier_kernel(int* out) {
#if SM90_KERNEL_BODY
  __shared__ int value[256];
  if (threadIdx.x < 128) {
    dev::setmaxnreg_dec<40>();
  } else {
    dev::setmaxnreg_inc<232>();
    const int t = threadIdx.x - 128;
    value[t] = 1000 + t;
    dev::named_barrier_sync(1, 256);  // the producer warpgroup does not take part
    out[t] = value[(t + 128) % 256];  // the other consumer warpgroup's value
  }
#endif
}

TEST(Sm90Primitives, NamedBarrierSyncsTwoWarpgroupsAfterSetmaxnreg) {
  SKIP_WITHOUT_HOPPER();
  DeviceBuffer dout(256 * 4);
  dout.fill32(0);
  named_barrier_kernel<<<1, 384>>>(static_cast<int*>(dout.get()));
  MLAKIT_ASSERT_CUDA(cudaDeviceSynchronize());
  const auto out = dout.download<int>();
  for (int t = 0; t < 256; ++t) ASSERT_EQ(out[t], 1000 + (t + 128) % 256) << "thread " << t;
}

// ---- stmatrix: four 8 x 8 tiles from the accumulator fragment layout ----

// Value of element (row r, column c) of tile m: distinct for every element.
__host__ __device__ inline uint16_t stmatrix_value(int m, int r, int c) { return static_cast<uint16_t>(1000 * m + 8 * r + c); }

// One warp stores tiles 0..3 into a [4][8][8] row-major buffer, rows given in reverse order
// (lane t addresses row 7 - t % 8 of tile t / 8 at that row's place) so the per-lane addresses
// are really used; the buffer is then copied out.
__global__ void stmatrix_kernel(uint16_t* out) {
#if SM90_KERNEL_BODY
  __shared__ __align__(16) uint16_t tiles[4][8][8];
  const int t = threadIdx.x;
  uint32_t reg[4];
  for (int m = 0; m < 4; ++m) {
    const int r = t / 4, c = 2 * (t % 4);
    reg[m] = stmatrix_value(m, r, c) | (uint32_t{stmatrix_value(m, r, c + 1)} << 16);
  }
  // Lane t gives the address of the row it names; rows are stored mirrored: row r of tile m at
  // tiles[m][7 - r].
  const int m = t / 8, r = t % 8;
  dev::stmatrix_x4(dev::smem_u32(&tiles[m][7 - r][0]), reg[0], reg[1], reg[2], reg[3]);
  __syncwarp();
  for (int i = t; i < 4 * 8 * 8; i += 32) out[i] = (&tiles[0][0][0])[i];
#endif
}

TEST(Sm90Primitives, StmatrixX4StoresAccumulatorFragmentsAtLaneAddresses) {
  SKIP_WITHOUT_HOPPER();
  DeviceBuffer dout(4 * 8 * 8 * 2);
  dout.fill16(0xffff);
  stmatrix_kernel<<<1, 32>>>(static_cast<uint16_t*>(dout.get()));
  MLAKIT_ASSERT_CUDA(cudaDeviceSynchronize());
  const auto out = dout.download<uint16_t>();
  for (int m = 0; m < 4; ++m) {
    for (int r = 0; r < 8; ++r) {
      for (int c = 0; c < 8; ++c) {
        ASSERT_EQ(out[(m * 8 + 7 - r) * 8 + c], stmatrix_value(m, r, c)) << "tile " << m << " row " << r << " col " << c;
      }
    }
  }
}

}  // namespace
}  // namespace mlakit::testing
