// Launcher of the whole-sequence (no plan) mode of the portable kernel, for the sparse
// prefill (bf16, its only dtype: docs/contract.md).
#include <cuda_bf16.h>

#include "kernels/portable/launch.h"
#include "kernels/portable/mla_decode_portable_kernel.cuh"

namespace mlakit::detail {

template <typename Elem>
cudaError_t launch_mla_portable_whole_sequence(const MlaDecodeParams& params, cudaStream_t stream) {
  using C = portable::DecodeConfig;
  const int64_t row_tiles = (params.rows + C::kRows - 1) / C::kRows;
  constexpr int kSmem = sizeof(portable::DecodeSmem<Elem>);
  auto kernel = &portable::mla_portable_whole_sequence_kernel<Elem>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  if (err != cudaSuccess) return err;
  dim3 grid(static_cast<unsigned>(params.b * row_tiles), params.h_kv);
  kernel<<<grid, C::kThreads, kSmem, stream>>>(params);
  return cudaGetLastError();
}

template cudaError_t launch_mla_portable_whole_sequence<__nv_bfloat16>(const MlaDecodeParams&, cudaStream_t);

}  // namespace mlakit::detail
