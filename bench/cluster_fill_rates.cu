// mlakit-cluster-fill-rates: cycles per 72 KB tile (64 gathered 1152-byte rows in nine 128B-
// swizzled 8 KB slabs, the sparse prefill's stage) when one CTA gathers all 64 rows with
// cp.async (today's kernels) against a 2-CTA cluster where each CTA gathers 32 rows and sends
// them to its peer with shared -> peer-shared bulk copies (DSMEM). At h_q = 128 the two row
// tiles of a token gather the same rows, so the pair halves the gathered bytes per SM if the
// DSMEM copy runs beside the cp.async path instead of competing with it.
//
// One CTA per SM; two stages; a consumer warp waits for each tile, holds it `hold` cycles (the
// math it stands for) and releases it (in a pair, to both CTAs: the peer writes into the
// stage too). Modes:
//   solo         4 warps gather 64 rows;
//   pair/tile    4 warps gather 32 rows; a sender warp waits for the whole half, then sends
//                it as nine 4 KB bulk copies;
//   pair/warp    each gather warp sends its own 8 rows slab by slab (1 KB copies, two slabs
//                behind its cp.async issue);
//   dsmem only   no gather: the sender warp sends 36 KB per tile (the DSMEM path alone);
//   st.async     no gather: the 4 producer warps send 36 KB per tile as 16-byte st.async
//                (the FP8 decode's crossover: each thread sends what it converted);
//   bulk rows    one CTA, no cluster: warp 0 fetches the 64 whole rows with 1152-byte bulk
//                copies (cp.async.bulk, the TMA engine without a tensor map) into plain
//                row-major places, which wgmma cannot read as B: the rate of that path.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "device/cp_async.cuh"
#include "bench/cluster.cuh"
#include "device/sm90/sync.cuh"
#include "bench/rate_tools.cuh"
#include "support/device_array.h"

namespace {

using mlakit::bench_rates::check;
using mlakit::bench_rates::mix;

using mlakit::support::DeviceArray;
namespace sm90 = mlakit::device::sm90;

constexpr int kRows = 8192, kRowBytes = 1152, kTiles = 256, kSlabs = 9, kSlabBytes = 8192;
constexpr int kStageBytes = kSlabs * kSlabBytes, kHalfBytes = kStageBytes / 2;
constexpr int kThreads = 6 * 32;  // warps 0..3 gather, 4 consumes, 5 sends
enum Mode { kSolo, kPairTile, kPairWarp, kDsmemOnly, kStAsyncOnly, kBulkRows };

struct Barriers {
  uint64_t full[2], empty[2], gathered[2];
};

__device__ const uint8_t* row_of(const uint8_t* rows, uint32_t token, int tile, int key) {
  return rows + static_cast<size_t>(mix(token * 0x9e3779b9u + tile * 64 + key) % kRows) * kRowBytes;
}

// One slab of `groups` groups of 4 rows (first row `row0`): lane 8q + c copies chunk c of row
// row0 + 4j + q to its swizzled place.
__device__ void gather_slab(uint8_t* stage, const uint8_t* const* src, int row0, int groups, int slab, int lane) {
  const int q = lane / 8, c = lane % 8;
  for (int j = 0; j < groups; ++j) {
    const int row = row0 + 4 * j + q;
    mlakit::device::cp_async_16(stage + slab * kSlabBytes + row * 128 + ((c ^ (row & 7)) * 16),
                                src[j] + slab * 128 + c * 16);
  }
}

template <Mode kMode>
__global__ void __launch_bounds__(kThreads, 1) fill_kernel(const uint8_t* rows, int hold, long long* spans) {
  constexpr bool kPair = kMode != kSolo && kMode != kBulkRows;
  extern __shared__ __align__(1024) uint8_t smem[];
  uint8_t* stages = smem;
  auto* bars = reinterpret_cast<Barriers*>(smem + 2 * kStageBytes);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const uint32_t rank = kPair ? sm90::cluster_cta_rank() : 0, peer = rank ^ 1;
  const uint32_t token = kPair ? blockIdx.x / 2 : blockIdx.x;
  if (threadIdx.x == 0) {
    for (int s = 0; s < 2; ++s) {
      const uint32_t full_count = kMode == kSolo ? 128 : kMode == kPairWarp ? 129 : 1;  // others: 1
      sm90::mbarrier_init(&bars->full[s], full_count);
      sm90::mbarrier_init(&bars->empty[s], kPair ? 2 : 1);
      sm90::mbarrier_init(&bars->gathered[s], 128);
    }
    sm90::fence_mbarrier_init();
  }
  if (kPair) sm90::cluster_sync();
  __syncthreads();
  const long long start = clock64();
  const int row_base = kPair ? 32 * static_cast<int>(rank) : 0;
  if (warp == 0 && kMode == kBulkRows) {
    for (int t = 0; t < kTiles; ++t) {
      const int s = t % 2;
      if (t >= 2) sm90::mbarrier_wait(&bars->empty[s], ((t / 2) - 1) & 1);
      if (lane == 0) sm90::mbarrier_arrive_expect_tx(&bars->full[s], kStageBytes);
      __syncwarp();
      for (int key = lane; key < 64; key += 32) {
        sm90::bulk_copy_global_to_shared(stages + s * kStageBytes + key * kRowBytes, row_of(rows, token, t, key),
                                         kRowBytes, &bars->full[s]);
      }
    }
  } else if (warp < 4 && kMode != kDsmemOnly && kMode != kStAsyncOnly && kMode != kBulkRows) {
    constexpr int groups = kPair ? 2 : 4;
    const int row0 = row_base + warp * 4 * groups;
    for (int t = 0; t < kTiles; ++t) {
      const int s = t % 2;
      const uint8_t* src[4];
      for (int j = 0; j < groups; ++j) src[j] = row_of(rows, token, t, row0 + 4 * j + lane / 8);
      if (t >= 2) sm90::mbarrier_wait(&bars->empty[s], ((t / 2) - 1) & 1);
      uint8_t* stage = stages + s * kStageBytes;
      if (kMode == kPairWarp) {
        if (warp == 0 && lane == 0) sm90::mbarrier_arrive_expect_tx(&bars->full[s], kHalfBytes);
        const uint32_t remote_bar = sm90::map_to_cta(sm90::smem_u32(&bars->full[s]), peer);
        for (int k = 0; k < kSlabs + 2; ++k) {
          if (k < kSlabs) gather_slab(stage, src, row0, groups, k, lane);
          asm volatile("cp.async.commit_group;\n" ::: "memory");
          if (k >= 2) {
            asm volatile("cp.async.wait_group 2;\n" ::: "memory");
            sm90::fence_proxy_async_smem();
            __syncwarp();
            if (lane == 0) {
              const uint32_t piece = sm90::smem_u32(stage + (k - 2) * kSlabBytes + row0 * 128);
              sm90::bulk_copy_to_cta(sm90::map_to_cta(piece, peer), piece, 8 * 128, remote_bar);
            }
          }
        }
        mlakit::device::cp_async_mbarrier_arrive_noinc(&bars->full[s]);
      } else {
        for (int k = 0; k < kSlabs; ++k) gather_slab(stage, src, row0, groups, k, lane);
        mlakit::device::cp_async_mbarrier_arrive_noinc(kMode == kSolo ? &bars->full[s] : &bars->gathered[s]);
      }
    }
  } else if (warp < 4 && kMode == kStAsyncOnly) {
    const uint4 value = make_uint4(threadIdx.x, 1, 2, 3);
    for (int t = 0; t < kTiles; ++t) {
      const int s = t % 2;
      if (t >= 2) sm90::mbarrier_wait(&bars->empty[s], ((t / 2) - 1) & 1);
      if (threadIdx.x == 0) sm90::mbarrier_arrive_expect_tx(&bars->full[s], kHalfBytes);
      const uint32_t remote_bar = sm90::map_to_cta(sm90::smem_u32(&bars->full[s]), peer);
      const uint32_t half = sm90::map_to_cta(sm90::smem_u32(stages + s * kStageBytes), peer);
#pragma unroll
      for (int i = 0; i < kHalfBytes / 16 / 128; ++i) {
        const int piece = i * 128 + threadIdx.x, slab = piece / 256, in_slab = piece % 256;
        sm90::st_async_16(half + slab * kSlabBytes + (row_base * 128) + in_slab * 16, value, remote_bar);
      }
    }
  } else if (warp == 4) {
    for (int t = 0; t < kTiles; ++t) {
      const int s = t % 2;
      sm90::mbarrier_wait(&bars->full[s], (t / 2) & 1);
      const long long held = clock64();
      while (clock64() - held < hold) {
      }
      __syncwarp();
      if (lane == 0) {
        sm90::mbarrier_arrive(&bars->empty[s]);
        if (kPair) sm90::mbarrier_arrive_cluster(sm90::map_to_cta(sm90::smem_u32(&bars->empty[s]), peer));
      }
    }
  } else if (warp == 5 && (kMode == kPairTile || kMode == kDsmemOnly) && lane == 0) {
    for (int t = 0; t < kTiles; ++t) {
      const int s = t % 2;
      if (kMode == kPairTile) {
        sm90::mbarrier_wait(&bars->gathered[s], (t / 2) & 1);
        sm90::fence_proxy_async_smem();
      } else if (t >= 2) {
        sm90::mbarrier_wait(&bars->empty[s], ((t / 2) - 1) & 1);
      }
      sm90::mbarrier_arrive_expect_tx(&bars->full[s], kHalfBytes);
      const uint32_t remote_bar = sm90::map_to_cta(sm90::smem_u32(&bars->full[s]), peer);
      for (int k = 0; k < kSlabs; ++k) {
        const uint32_t piece = sm90::smem_u32(stages + s * kStageBytes + k * kSlabBytes + row_base * 128);
        sm90::bulk_copy_to_cta(sm90::map_to_cta(piece, peer), piece, 32 * 128, remote_bar);
      }
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) spans[blockIdx.x] = clock64() - start;
  if (kPair) sm90::cluster_sync();
}

template <Mode kMode>
void measure(const char* name, int sms, int hold, const uint8_t* rows) {
  constexpr bool kPair = kMode != kSolo && kMode != kBulkRows;
  const int smem = 2 * kStageBytes + static_cast<int>(sizeof(Barriers));
  check(cudaFuncSetAttribute(fill_kernel<kMode>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), "smem");
  const int ctas = sms / 2 * 2;
  DeviceArray spans(ctas * sizeof(long long));
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(ctas);
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = smem;
  cudaLaunchAttribute cluster{};
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = kPair ? 2 : 1;
  cluster.val.clusterDim.y = cluster.val.clusterDim.z = 1;
  config.attrs = &cluster;
  config.numAttrs = 1;
  for (int run = 0; run < 2; ++run) {  // the second run is timed: L2 warm
    check(cudaLaunchKernelEx(&config, fill_kernel<kMode>, rows, hold, static_cast<long long*>(spans.get())),
          "fill_kernel launch");
    check(cudaDeviceSynchronize(), "fill_kernel");
  }
  const std::vector<long long> host = spans.download<long long>();
  const double span = static_cast<double>(*std::max_element(host.begin(), host.end()));
  std::printf("%-12s hold %5d  %7.0f cycles per tile  %5.1f B/clk/SM of tile fill\n", name, hold, span / kTiles,
              kStageBytes * kTiles / span);
}

}  // namespace

int main() {
  try {
    cudaDeviceProp prop{};
    check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
    const int sms = prop.multiProcessorCount;
    DeviceArray rows(static_cast<size_t>(kRows) * kRowBytes);
    rows.fill_bytes(1);
    std::setvbuf(stdout, nullptr, _IOLBF, 0);
    std::printf("72 KB gathered tiles, one CTA per SM vs 2-CTA clusters sharing rows over DSMEM, on %s\n", prop.name);
    const auto* data = static_cast<const uint8_t*>(rows.get());
    for (int hold : {0, 2000}) {
      measure<kSolo>("solo", sms, hold, data);
      measure<kPairTile>("pair/tile", sms, hold, data);
      measure<kPairWarp>("pair/warp", sms, hold, data);
      measure<kDsmemOnly>("dsmem only", sms, hold, data);
      measure<kStAsyncOnly>("st.async", sms, hold, data);
      measure<kBulkRows>("bulk rows", sms, hold, data);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mlakit-cluster-fill-rates: %s\n", e.what());
    return 1;
  }
  return 0;
}
