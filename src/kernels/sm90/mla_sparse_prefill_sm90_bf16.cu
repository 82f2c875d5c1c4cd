// Launcher of the Hopper sparse prefill (bf16, the prefill's only dtype: docs/contract.md).
#include <cuda_bf16.h>

#include "kernels/sm90/launch.h"
#include "kernels/sm90/mla_sparse_prefill_sm90_kernel.cuh"

namespace mlakit::detail {

namespace {

template <int kScoreSlabs>
cudaError_t launch_slabs(const SparsePrefillParams& params, const CUtensorMap* q_map, cudaStream_t stream) {
  using C = sm90::Sm90MlaConfig;
  auto kernel = &sm90::mla_sparse_prefill_sm90_kernel<__nv_bfloat16, kScoreSlabs>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, sm90::kSm90SmemBytes);
  if (err != cudaSuccess) return err;
  const int64_t row_tiles = (params.core.rows + C::kRows - 1) / C::kRows;
  kernel<<<static_cast<unsigned>(params.core.b * row_tiles), C::kThreads, sm90::kSm90SmemBytes, stream>>>(
      params, map_or_empty(q_map), q_map != nullptr);
  return cudaGetLastError();
}

}  // namespace

// d_qk 576: every slab; 512: S over slabs 0..7 (the rows' 512 columns), nothing copied into slab 8.
cudaError_t launch_mla_sparse_prefill_sm90(const SparsePrefillParams& params, const CUtensorMap* q_map,
                                           cudaStream_t stream) {
  using C = sm90::Sm90MlaConfig;
  return params.core.d_qk > C::kDv ? launch_slabs<C::kSlabs>(params, q_map, stream)
                                   : launch_slabs<C::kNopeSlabs>(params, q_map, stream);
}

}  // namespace mlakit::detail
