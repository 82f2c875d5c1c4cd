// Hopper (sm_90a) split-KV dense MLA decode kernel.
//
// Grid (row tiles, h_kv, num_parts), 384 threads, 1 CTA per SM. A CTA owns kRows = 64 query
// rows of one kv head (one wgmma M) and walks the (sequence, key block) range of its part,
// like the portable kernel, writing final or partial results for the combine kernel.
//
// Warp roles (warpgroup = 128 threads):
//   WG0, warp 0  producer: block-table lookups (one lane per TMA box) and TMA loads of 64-key
//                cache tiles into a 2-stage ring; setmaxnreg.dec to kProducerRegs.
//   WG1, WG2     consumers w = 0, 1 (setmaxnreg.inc to kConsumerRegs). Consumer w computes
//                S_w = Q K[32w .. 32w+31]^T (64 x 32, wgmma m64n32k16 x 36) and owns the output
//                columns O_w = O[:, 256w .. 256w+255] (64 x 256 f32, 128 registers/thread),
//                accumulated with wgmma m64n256k16 over the full 64-key P tile.
//
// Per tile (both consumers in lockstep):
//   wait full[s] -> zero cache rows past the segment (partial last tile only) -> S_w ->
//   row max of the half -> exchange (smem + named barrier 1) -> P_w = exp2(S - m) written to
//   the shared P tile (128B-swizzled) -> fence.proxy.async + named barrier 2 -> O_w *= alpha
//   -> O_w += P V_w -> wait -> arrive empty[s].
// Barrier protocol: full[s] (count 1: producer arrive + TMA bytes via expect_tx per box),
// empty[s] (count 2: one thread per consumer warpgroup after its P.V finished). Consumers
// start waiting full with parity 0, the producer waits empty with parity 1 (first lap passes).
//
// Shared memory (1024-aligned, 128B swizzle everywhere):
//   Q       9 slabs x [64 rows][128 B]          73728 B
//   KV      2 stages x 9 slabs x [64][128 B]    147456 B  (V = slabs 0..7 of the same tile)
//   P       [64 rows][64 keys] bf16/fp16          8192 B
//   row max / row sum exchange, barriers, bad flags ~1 KB
// Register budget: 40 x 128 (producer) + 232 x 256 (consumers) = 64512 <= 65536.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "device/cp_async.cuh"
#include "device/numeric.cuh"
#include "device/sm90/sync.cuh"
#include "device/sm90/wgmma.cuh"
#include "kernels/decode_rows.cuh"
#include "kernels/mla_decode_params.h"

namespace mlakit::detail::sm90 {

namespace dev = mlakit::device::sm90;

struct Sm90DecodeConfig {
  static constexpr int kRows = 64;    // query rows per CTA (wgmma M)
  static constexpr int kKeys = 64;    // keys per pipeline stage (= scheduling block)
  static constexpr int kDqk = 576;
  static constexpr int kDv = 512;
  static constexpr int kSlabCols = 64;  // 128 bytes of bf16: one 128B-swizzle row
  static constexpr int kSlabs = kDqk / kSlabCols;
  static constexpr int kSlabBytes = kKeys * 128;
  static constexpr int kStages = 2;
  static constexpr int kThreads = 384;
  static constexpr int kConsumerThreads = 256;
  static constexpr int kProducerRegs = 40;
  static constexpr int kConsumerRegs = 232;
  static constexpr int kSKeysPerConsumer = kKeys / 2;    // S columns of one consumer
  static constexpr int kVColsPerConsumer = kDv / 2;      // O columns of one consumer
  static constexpr int kQkSteps = kDqk / 16;
  static constexpr int kPvSteps = kKeys / 16;
  static constexpr uint32_t kBarExchange = 1;  // named barriers of the two consumer WGs
  static constexpr uint32_t kBarPReady = 2;

  static_assert(kRows == 64, "one wgmma M per CTA");
  static_assert(kSlabs * kSlabCols == kDqk && kDv == 8 * kSlabCols, "V = slabs 0..7");
  static_assert(kProducerRegs * 128 + kConsumerRegs * kConsumerThreads <= 65536, "register budget");
};

struct Sm90DecodeSmem {
  using C = Sm90DecodeConfig;
  uint8_t q[C::kSlabs][C::kSlabBytes];
  uint8_t kv[C::kStages][C::kSlabs][C::kSlabBytes];
  uint8_t p[C::kRows * 128];
  float row_max[2][C::kRows];
  float row_sum[2][C::kRows];
  uint64_t full[C::kStages];
  uint64_t empty[C::kStages];
  int stage_bad[C::kStages];
};
inline constexpr int kSm90SmemBytes = sizeof(Sm90DecodeSmem) + 1024;  // + alignment slack
static_assert(kSm90SmemBytes <= 232448, "fits the 227 KB opt-in shared memory of sm90");

// Number of 64-key tiles a segment needs for this CTA's rows (producer and consumers must
// agree exactly).
__device__ __forceinline__ int segment_tiles(const MlaDecodeParams& p, int hk, int tile, int L,
                                             int key_begin, int key_end) {
  using C = Sm90DecodeConfig;
  const int end = tile_keys_end(p, hk, tile * C::kRows, C::kRows, L, key_end);
  return end > key_begin ? (end - key_begin + C::kKeys - 1) / C::kKeys : 0;
}

// ---------------------------------------------------------------------------------------
// Producer: warp 0 of warpgroup 0.
// ---------------------------------------------------------------------------------------
__device__ __forceinline__ void produce(const MlaDecodeParams& p, const CUtensorMap& kv_map,
                                        int box_rows, Sm90DecodeSmem& sm) {
  using C = Sm90DecodeConfig;
  const int lane = threadIdx.x % 32;
  const int hk = blockIdx.y, tile = blockIdx.x;
  const int boxes = C::kKeys / box_rows;
  const uint32_t box_bytes = static_cast<uint32_t>(box_rows) * 128 * C::kSlabs;
  if (lane == 0) dev::tma_prefetch_descriptor(&kv_map);
  int stage = 0;
  uint32_t phase = 0;
  for_each_segment(p, p.part_ranges[blockIdx.z], [&](int seq, int L, int key_begin, int key_end, int) {
    const int tiles = segment_tiles(p, hk, tile, L, key_begin, key_end);
    // Lane j looks up box j of a tile; entries past the segment are never read.
    auto lookup = [&](int tile_start, int32_t* block, bool* bad) {
      const int key0 = tile_start + lane * box_rows;
      bool valid = lane < boxes && key0 < key_end;
      *bad = false;
      *block = 0;
      if (valid) {
        const int logical = key0 / p.page_size;
        *block = logical < p.max_blocks_per_seq ? p.block_table[seq * p.block_table_stride_b + logical] : -1;
        *bad = *block < 0 || *block >= p.num_blocks;
        valid = !*bad;
      }
      return valid;
    };
    for (int i = 0; i < tiles; ++i) {
      const int tile_start = key_begin + i * C::kKeys;
      int32_t block;
      bool bad;
      bool valid = lookup(tile_start, &block, &bad);
      const bool any_bad = __any_sync(0xffffffffu, bad);
      dev::mbarrier_wait(&sm.empty[stage], phase ^ 1);
      // Each lane issues its own box (16-row pages: 4 lanes at once).
      if (valid) {
        const int row_in_page = (tile_start + lane * box_rows) % p.page_size;
        dev::mbarrier_expect_tx(&sm.full[stage], box_bytes);
#pragma unroll
        for (int s = 0; s < C::kSlabs; ++s) {
          dev::tma_load_4d(&sm.kv[stage][s][lane * box_rows * 128], &kv_map, &sm.full[stage], s * C::kSlabCols, hk,
                           row_in_page, block);
        }
      }
      __syncwarp();  // every expect_tx before the arrive that can complete the phase
      if (lane == 0) {
        sm.stage_bad[stage] = any_bad ? 1 : 0;
        dev::mbarrier_arrive(&sm.full[stage]);  // release: the flag is visible to the waiters
      }
      stage ^= 1;
      phase ^= stage == 0 ? 1u : 0u;
    }
  });
}

// ---------------------------------------------------------------------------------------
// Consumers: warpgroups 1 and 2.
// ---------------------------------------------------------------------------------------
template <typename Elem>
class Sm90Consumer {
  using C = Sm90DecodeConfig;
  using Ops = device::ElemOps<Elem>;

 public:
  __device__ Sm90Consumer(const MlaDecodeParams& p, Sm90DecodeSmem& sm)
      : p_(p), sm_(sm), w_(threadIdx.x / 128 - 1), t_(threadIdx.x - 128), lane_(threadIdx.x % 32),
        r0_(16 * ((threadIdx.x % 128) / 32) + (threadIdx.x % 32) / 4), hk_(blockIdx.y), tile_(blockIdx.x) {}

  __device__ void run_segment(int seq, int L, int key_begin, int key_end, int split) {
    load_q(seq);
    const int lim0 = row_limit(r0_, L, key_end), lim1 = row_limit(r0_ + 8, L, key_end);
#pragma unroll
    for (int j = 0; j < 128; ++j) o_[j] = 0.f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
    bool bad = false;
    const int tiles = segment_tiles(p_, hk_, tile_, L, key_begin, key_end);
    // A stage is held only from its S to its P.V: with two stages, the load of tile i+2
    // overlaps the whole of tile i+1. Measured alternatives (docs/kernels/mla_decode_sm90.md):
    // S(i+1) before the softmax of tile i (slower), S(i+1) queued behind P.V(i) (no gain).
    for (int i = 0; i < tiles; ++i) {
      const int tile_start = key_begin + i * C::kKeys;
      bad |= acquire_stage(stage_, phase_, tile_start, key_end);
      float s[16];
      issue_scores(s, stage_);
      dev::wgmma_wait<0>();
      dev::fence_registers(s);
      softmax_to_p(s, tile_start, lim0, lim1, &m0, &m1, &l0, &l1);
      issue_values();
      dev::wgmma_wait<0>();
      dev::fence_registers(o_);
      if (t_ % 128 == 0) dev::mbarrier_arrive(&sm_.empty[stage_]);
      stage_ ^= 1;
      phase_ ^= stage_ == 0 ? 1u : 0u;
    }
    store(seq, split, m0, m1, l0, l1, bad);
  }

 private:
  // Visible-key bound of tile row r (0 for padding rows).
  __device__ int row_limit(int r, int L, int key_end) const {
    const int row = tile_ * C::kRows + r;
    if (row >= p_.rows) return 0;
    return min(key_end, visible_keys(p_, L, row_coord(p_, hk_, row).t));
  }

  // Q tile into 9 swizzled slabs with 16-byte cp.async (all in flight at once); padding rows
  // are zero.
  __device__ void load_q(int seq) {
    const Elem* q = static_cast<const Elem*>(p_.q);
    constexpr int kChunksPerRow = C::kDqk / 8;
    for (int c = t_; c < C::kRows * kChunksPerRow; c += C::kConsumerThreads) {
      const int r = c / kChunksPerRow, k = c % kChunksPerRow;
      const int slab = k / 8, chunk = k % 8;
      const int row = tile_ * C::kRows + r;
      uint8_t* dst = &sm_.q[slab][r * 128 + ((chunk ^ (r & 7)) * 16)];
      if (row < p_.rows) {
        const RowCoord rc = row_coord(p_, hk_, row);
        device::cp_async_16(dst, q + seq * p_.q_stride_b + rc.t * p_.q_stride_s + rc.head * p_.q_stride_h + k * 8);
      } else {
        *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
      }
    }
    device::cp_async_wait_all();
    dev::fence_proxy_async_smem();
    dev::named_barrier_sync(C::kBarExchange, C::kConsumerThreads);
  }

  // Cache rows [valid_rows, 64) of the current stage hold data past the segment (stale, or
  // NaN past the sequence end): zero them so 0-weight P entries cannot meet NaN in P.V.
  __device__ void zero_rows(int stage, int valid_rows) {
    const int chunks = (C::kKeys - valid_rows) * C::kSlabs * 8;
    for (int c = t_; c < chunks; c += C::kConsumerThreads) {
      const int r = valid_rows + c / (C::kSlabs * 8), k = c % (C::kSlabs * 8);
      *reinterpret_cast<uint4*>(&sm_.kv[stage][k / 8][r * 128 + (k % 8) * 16]) = make_uint4(0, 0, 0, 0);
    }
    dev::fence_proxy_async_smem();
    dev::named_barrier_sync(C::kBarExchange, C::kConsumerThreads);
  }

  // Waits for a stage's tile, zeroes its rows past the segment; returns its bad flag.
  __device__ bool acquire_stage(int stage, uint32_t phase, int tile_start, int key_end) {
    dev::mbarrier_wait(&sm_.full[stage], phase);
    const int valid_rows = min(C::kKeys, key_end - tile_start);
    if (valid_rows < C::kKeys) zero_rows(stage, valid_rows);
    return sm_.stage_bad[stage] != 0;
  }

  // Issues S_w = Q K[32w .. 32w+31]^T over d_qk (K-major A and B, 128B swizzle, SBO 1024)
  // as one committed group.
  __device__ void issue_scores(float (&s)[16], int stage) {
    const uint64_t q_desc = dev::make_sw128_desc(dev::smem_u32(&sm_.q[0][0]), 16, 1024);
    const uint64_t k_desc =
        dev::make_sw128_desc(dev::smem_u32(&sm_.kv[stage][0][0]) + C::kSKeysPerConsumer * 128 * w_, 16, 1024);
    dev::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < C::kQkSteps; ++kk) {
      const uint32_t offset = (kk / 4) * C::kSlabBytes + (kk % 4) * 32;
      dev::Wgmma<32, Elem>::template run<0>(s, dev::advance_desc(q_desc, offset), dev::advance_desc(k_desc, offset),
                                            kk > 0);
    }
    dev::wgmma_commit();
  }

  // Online softmax of the 64 x 64 tile split over the two consumers; writes P (q's dtype)
  // into the shared P tile and leaves alpha applied to O.
  __device__ void softmax_to_p(float (&s)[16], int tile_start, int lim0, int lim1, float* m0, float* m1,
                               float* l0, float* l1) {
    const int col_base = C::kSKeysPerConsumer * w_ + 2 * (lane_ % 4);
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const int key = tile_start + col_base + 8 * (i >> 2) + (i & 1);
      const bool hi = (i >> 1) & 1;
      s[i] = key < (hi ? lim1 : lim0) ? s[i] * p_.scale_log2 : -INFINITY;
      if (hi) mx1 = fmaxf(mx1, s[i]); else mx0 = fmaxf(mx0, s[i]);
    }
#pragma unroll
    for (int x = 1; x < 4; x *= 2) {
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, x));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, x));
    }
    if (lane_ % 4 == 0) {
      sm_.row_max[w_][r0_] = mx0;
      sm_.row_max[w_][r0_ + 8] = mx1;
    }
    dev::named_barrier_sync(C::kBarExchange, C::kConsumerThreads);
    const float n0 = fmaxf(*m0, fmaxf(mx0, sm_.row_max[1 - w_][r0_]));
    const float n1 = fmaxf(*m1, fmaxf(mx1, sm_.row_max[1 - w_][r0_ + 8]));
    // A row with no visible key so far keeps max -inf: P = 0, O unchanged.
    const float a0 = n0 == -INFINITY ? 1.f : device::fast_exp2(*m0 - n0);
    const float a1 = n1 == -INFINITY ? 1.f : device::fast_exp2(*m1 - n1);
    float sum0 = 0.f, sum1 = 0.f;
#pragma unroll
    for (int i = 0; i < 16; i += 2) {
      const bool hi = (i >> 1) & 1;
      const float n = hi ? n1 : n0;
      const float e0 = n == -INFINITY ? 0.f : device::fast_exp2(s[i] - n);
      const float e1 = n == -INFINITY ? 0.f : device::fast_exp2(s[i + 1] - n);
      (hi ? sum1 : sum0) += e0 + e1;
      const int r = r0_ + (hi ? 8 : 0);
      const int col = col_base + 8 * (i >> 2);
      *reinterpret_cast<uint32_t*>(&sm_.p[r * 128 + ((2 * col) ^ ((r & 7) << 4))]) = Ops::pack(e0, e1);
    }
    *l0 = *l0 * a0 + sum0;
    *l1 = *l1 * a1 + sum1;
    *m0 = n0;
    *m1 = n1;
    // Once a row's running max settles, alpha is 1: skip the 128 multiplies (warp-uniform).
    if (__any_sync(0xffffffffu, a0 != 1.f || a1 != 1.f)) {
#pragma unroll
      for (int j = 0; j < 128; ++j) o_[j] *= ((j >> 1) & 1) ? a1 : a0;
    }
    dev::fence_proxy_async_smem();
    dev::named_barrier_sync(C::kBarPReady, C::kConsumerThreads);
  }

  // Issues O_w += P (64 x 64, K-major) V[:, 256w ..] (V N-major: LBO = slab, SBO = 8 keys).
  __device__ void issue_values() {
    const uint64_t p_desc = dev::make_sw128_desc(dev::smem_u32(&sm_.p[0]), 16, 1024);
    const uint64_t v_desc = dev::make_sw128_desc(dev::smem_u32(&sm_.kv[stage_][4 * w_][0]), C::kSlabBytes, 1024);
    dev::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < C::kPvSteps; ++kk) {
      dev::Wgmma<256, Elem>::template run<1>(o_, dev::advance_desc(p_desc, kk * 32), dev::advance_desc(v_desc, kk * 16 * 128),
                                             true);
    }
    dev::wgmma_commit();
  }

  __device__ void store(int seq, int split, float m0, float m1, float l0, float l1, bool bad) {
#pragma unroll
    for (int x = 1; x < 4; x *= 2) {
      l0 += __shfl_xor_sync(0xffffffffu, l0, x);
      l1 += __shfl_xor_sync(0xffffffffu, l1, x);
    }
    if (lane_ % 4 == 0) {
      sm_.row_sum[w_][r0_] = l0;
      sm_.row_sum[w_][r0_ + 8] = l1;
    }
    dev::named_barrier_sync(C::kBarExchange, C::kConsumerThreads);
    const float sum[2] = {sm_.row_sum[0][r0_] + sm_.row_sum[1][r0_], sm_.row_sum[0][r0_ + 8] + sm_.row_sum[1][r0_ + 8]};
    const float row_max[2] = {m0, m1};
    const bool direct = p_.split_prefix[seq + 1] - p_.split_prefix[seq] == 1;
    const int64_t slot_row0 =
        (static_cast<int64_t>(direct ? 0 : p_.partial_prefix[seq] + split) * p_.h_kv + hk_) * p_.rows;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = r0_ + 8 * half;
      const int row = tile_ * C::kRows + r;
      if (row >= p_.rows) continue;
      const bool empty = sum[half] == 0.f;
      const float inv = bad ? NAN : (empty ? 0.f : 1.f / sum[half]);
      const float lse2 = bad ? NAN : (empty ? -INFINITY : row_max[half] + log2f(sum[half]));
      const RowCoord rc = row_coord(p_, hk_, row);
      Elem* out = static_cast<Elem*>(p_.out) + seq * p_.out_stride_b + rc.t * p_.out_stride_s +
                  rc.head * p_.out_stride_h;
      float* partial = p_.partial_out + (slot_row0 + row) * C::kDv;
#pragma unroll
      for (int j = 2 * half; j < 128; j += 4) {
        const int col = C::kVColsPerConsumer * w_ + 8 * (j >> 2) + 2 * (lane_ % 4);
        const float v0 = o_[j] * inv, v1 = o_[j + 1] * inv;
        if (direct) {
          *reinterpret_cast<uint32_t*>(out + col) = Ops::pack(v0, v1);
        } else {
          *reinterpret_cast<float2*>(partial + col) = make_float2(v0, v1);
        }
      }
      if (w_ == 0 && lane_ % 4 == 0) {
        if (direct) {
          p_.lse[seq * p_.lse_stride_b + rc.head * p_.lse_stride_h + rc.t * p_.lse_stride_s] =
              lse2 == -INFINITY ? INFINITY : lse2 * device::kLn2;
        } else {
          p_.partial_lse[slot_row0 + row] = lse2;
        }
      }
    }
    // row_sum and the Q tile are rewritten by the next segment.
    dev::named_barrier_sync(C::kBarExchange, C::kConsumerThreads);
  }

  const MlaDecodeParams& p_;
  Sm90DecodeSmem& sm_;
  const int w_, t_, lane_, r0_, hk_, tile_;
  int stage_ = 0;
  uint32_t phase_ = 0;
  float o_[128];
};

template <typename Elem>
__global__ void __launch_bounds__(Sm90DecodeConfig::kThreads, 1)
    mla_decode_sm90_kernel(const __grid_constant__ MlaDecodeParams p, const __grid_constant__ CUtensorMap kv_map,
                           const int box_rows) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using C = Sm90DecodeConfig;
  extern __shared__ uint8_t smem_raw[];
  auto& sm = *reinterpret_cast<Sm90DecodeSmem*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  if (threadIdx.x == 0) {
    for (int s = 0; s < C::kStages; ++s) {
      dev::mbarrier_init(&sm.full[s], 1);
      dev::mbarrier_init(&sm.empty[s], 2);
    }
    dev::fence_mbarrier_init();
  }
  __syncthreads();
  if (threadIdx.x < 128) {
    dev::setmaxnreg_dec<C::kProducerRegs>();
    if (threadIdx.x < 32) produce(p, kv_map, box_rows, sm);
  } else {
    dev::setmaxnreg_inc<C::kConsumerRegs>();
    Sm90Consumer<Elem> consumer(p, sm);
    for_each_segment(p, p.part_ranges[blockIdx.z], [&](int seq, int L, int key_begin, int key_end, int split) {
      consumer.run_segment(seq, L, key_begin, key_end, split);
    });
  }
#endif
}

}  // namespace mlakit::detail::sm90
