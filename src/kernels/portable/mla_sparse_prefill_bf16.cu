// Launcher of the whole-sequence (no plan) mode of the portable kernel, for the sparse
// prefill (bf16, its only dtype: docs/contract.md).
#include <cuda_bf16.h>

#include "kernels/portable/launch.h"
#include "kernels/portable/mla_decode_portable_kernel.cuh"

namespace mlakit::detail {

cudaError_t launch_mla_sparse_prefill_portable(const SparsePrefillParams& params, cudaStream_t stream) {
  using Elem = __nv_bfloat16;
  using C = portable::DecodeConfig;
  const int64_t row_tiles = (params.core.rows + C::kRows - 1) / C::kRows;
  constexpr int kSmem = sizeof(portable::DecodeSmem<Elem>);
  auto kernel = &portable::mla_portable_whole_sequence_kernel<Elem, SparsePrefillParams>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  if (err != cudaSuccess) return err;
  dim3 grid(static_cast<unsigned>(params.core.b * row_tiles), params.core.h_kv);
  kernel<<<grid, C::kThreads, kSmem, stream>>>(params);
  return cudaGetLastError();
}

}  // namespace mlakit::detail
