// Launcher of the Hopper sparse FP8 decode (q and out bf16, SPEC 2), then the combine.
#include <cuda_bf16.h>

#include <array>
#include <atomic>

#include "kernels/portable/launch.h"
#include "kernels/sm90/launch.h"
#include "kernels/sm90/mla_sparse_decode_sm90_kernel.cuh"

namespace mlakit::detail {
namespace {

template <int kShare>
cudaLaunchConfig_t attention_config(const MlaDecodeParams& params, int row_tiles, cudaStream_t stream,
                                    cudaLaunchAttribute* cluster) {
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(row_tiles, 1, params.num_parts);
  config.blockDim = dim3(sm90::Sm90DecodeConfig::kThreads);
  config.dynamicSmemBytes = sm90::kSm90SmemBytes;
  config.stream = stream;
  *cluster = {};
  cluster->id = cudaLaunchAttributeClusterDimension;
  cluster->val.clusterDim.x = kShare;
  cluster->val.clusterDim.y = 1;
  cluster->val.clusterDim.z = 1;
  config.attrs = cluster;
  config.numAttrs = 1;
  return config;
}

template <int kShare>
cudaError_t launch_attention(const MlaDecodeParams& params, int row_tiles, cudaStream_t stream) {
  auto kernel = &sm90::mla_sparse_decode_sm90_kernel<kShare>;
  const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, sm90::kSm90SmemBytes);
  if (err != cudaSuccess) return err;
  cudaLaunchAttribute cluster;
  const cudaLaunchConfig_t config = attention_config<kShare>(params, row_tiles, stream, &cluster);
  return cudaLaunchKernelEx(&config, kernel, params);
}

// Clusters of two CTAs that the current device can hold at once (0 if it cannot tell), cached
// per device: the crossover is used only when the plan's grid fits in one wave of them (a
// GPC with an odd number of free SMs holds one CTA fewer than the plan counted on).
int resident_crossover_clusters() {
  static std::array<std::atomic<int>, 64> cached{};  // per ordinal, 0: not asked yet; -1: none
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= static_cast<int>(cached.size())) return 0;
  int clusters = cached[device].load();
  if (clusters != 0) return clusters > 0 ? clusters : 0;
  auto kernel = &sm90::mla_sparse_decode_sm90_kernel<2>;
  cudaLaunchAttribute cluster;
  MlaDecodeParams probe{};
  probe.num_parts = 1;
  const cudaLaunchConfig_t config = attention_config<2>(probe, 2, nullptr, &cluster);
  clusters = 0;
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, sm90::kSm90SmemBytes) !=
          cudaSuccess ||
      cudaOccupancyMaxActiveClusters(&clusters, kernel, &config) != cudaSuccess) {
    (void)cudaGetLastError();  // a refusal here only means no crossover
    clusters = 0;
  }
  cached[device].store(clusters > 0 ? clusters : -1);
  return clusters;
}

}  // namespace

cudaError_t launch_mla_sparse_decode_sm90(const MlaDecodeParams& params, cudaStream_t stream) {
  using C = sm90::Sm90DecodeConfig;
  const int row_tiles = (params.rows + C::kRows - 1) / C::kRows;
  // The two row tiles of a token share their K/V tiles (crossover) when all clusters fit at once.
  const bool crossover = row_tiles == 2 && resident_crossover_clusters() >= params.num_parts;
  cudaError_t err = crossover ? launch_attention<2>(params, row_tiles, stream)
                              : launch_attention<1>(params, row_tiles, stream);
  if (err != cudaSuccess) return err;
  return launch_mla_decode_combine<__nv_bfloat16>(params, stream);
}

}  // namespace mlakit::detail
