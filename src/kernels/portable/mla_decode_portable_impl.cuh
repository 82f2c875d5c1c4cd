// Launcher body of the portable split-KV attention (the planned operations), shared by the
// per-operation and per-dtype instantiation files.
#pragma once

#include "kernels/portable/launch.h"
#include "kernels/portable/mla_decode_portable_kernel.cuh"

namespace mlakit::detail {
namespace portable {

// Params: DenseDecodeParams or SparseDecodeParams. Grid (row tiles, h_kv, num_parts).
template <typename Elem, typename Params>
cudaError_t launch_split_kv(const Params& params, cudaStream_t stream) {
  using C = DecodeConfig;
  const int row_tiles = (params.core.rows + C::kRows - 1) / C::kRows;
  constexpr int kSmem = sizeof(DecodeSmem<Elem>);
  auto kernel = &mla_decode_portable_kernel<Elem, Params>;
  // Idempotent and cheap; not a stream operation, so it is allowed during graph capture.
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  if (err != cudaSuccess) return err;
  dim3 grid(row_tiles, params.core.h_kv, params.schedule.num_parts);
  kernel<<<grid, C::kThreads, kSmem, stream>>>(params);
  return cudaGetLastError();
}

}  // namespace portable

template <typename Elem>
cudaError_t launch_mla_decode_portable(const DenseDecodeParams& params, cudaStream_t stream) {
  return portable::launch_split_kv<Elem>(params, stream);
}

}  // namespace mlakit::detail
