// Launcher of the Hopper sparse FP8 decode (q and out bf16, SPEC 2), then the combine.
#include <cuda_bf16.h>

#include "kernels/portable/launch.h"
#include "kernels/sm90/launch.h"
#include "kernels/sm90/mla_sparse_decode_sm90_kernel.cuh"

namespace mlakit::detail {
namespace {

template <int kShare>
cudaError_t launch_attention(const MlaDecodeParams& params, int row_tiles, cudaStream_t stream) {
  auto kernel = &sm90::mla_sparse_decode_sm90_kernel<kShare>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, sm90::kSm90SmemBytes);
  if (err != cudaSuccess) return err;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(row_tiles, 1, params.num_parts);
  config.blockDim = dim3(sm90::Sm90DecodeConfig::kThreads);
  config.dynamicSmemBytes = sm90::kSm90SmemBytes;
  config.stream = stream;
  cudaLaunchAttribute cluster = {};
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = kShare;
  cluster.val.clusterDim.y = 1;
  cluster.val.clusterDim.z = 1;
  config.attrs = &cluster;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, kernel, params);
}

}  // namespace

cudaError_t launch_mla_sparse_decode_sm90(const MlaDecodeParams& params, cudaStream_t stream) {
  using C = sm90::Sm90DecodeConfig;
  const int row_tiles = (params.rows + C::kRows - 1) / C::kRows;
  // Pairs of row tiles of a token share their K/V tiles (crossover).
  const cudaError_t err = row_tiles % 2 == 0 ? launch_attention<2>(params, row_tiles, stream)
                                             : launch_attention<1>(params, row_tiles, stream);
  if (err != cudaSuccess) return err;
  return launch_mla_decode_combine<__nv_bfloat16>(params, stream);
}

}  // namespace mlakit::detail
