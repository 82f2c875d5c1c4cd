// Launcher of the Hopper sparse FP8 decode (q and out bf16, docs/contract.md); the dispatch
// starts the combine after it.
#include <cuda_bf16.h>

#include "kernels/sm90/launch.h"
#include "kernels/sm90/mla_sparse_decode_sm90_kernel.cuh"

namespace mlakit::detail {

namespace {

template <Fp8TokenLayout kLayout>
cudaError_t launch_layout(const SparseDecodeParams& params, const CUtensorMap* q_map, cudaStream_t stream) {
  using C = sm90::Sm90MlaConfig;
  auto kernel = &sm90::mla_sparse_decode_sm90_kernel<kLayout>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, sm90::kSm90SmemBytes);
  if (err != cudaSuccess) return err;
  const int row_tiles = (params.core.rows + C::kRows - 1) / C::kRows;
  dim3 grid(row_tiles, 1, params.schedule.num_parts);
  kernel<<<grid, C::kThreads, sm90::kSm90SmemBytes, stream>>>(params, map_or_empty(q_map), q_map != nullptr);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_mla_sparse_decode_sm90(const SparseDecodeParams& params, const CUtensorMap* q_map,
                                          cudaStream_t stream) {
  return params.layout == Fp8TokenLayout::kV4 ? launch_layout<Fp8TokenLayout::kV4>(params, q_map, stream)
                                              : launch_layout<Fp8TokenLayout::kV32>(params, q_map, stream);
}

}  // namespace mlakit::detail
