// Launcher body of the portable split-KV decode, shared by the per-dtype instantiation files.
#pragma once

#include "kernels/portable/launch.h"
#include "kernels/portable/mla_decode_portable_kernel.cuh"

namespace mlakit::detail {

template <typename Elem>
cudaError_t launch_mla_decode_portable(const MlaDecodeParams& params, cudaStream_t stream) {
  using C = portable::DecodeConfig;
  const int row_tiles = (params.rows + C::kRows - 1) / C::kRows;
  constexpr int kSmem = sizeof(portable::DecodeSmem<Elem>);
  auto kernel = &portable::mla_decode_portable_kernel<Elem>;
  // Idempotent and cheap; not a stream operation, so it is allowed during graph capture.
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  if (err != cudaSuccess) return err;
  dim3 grid(row_tiles, params.h_kv, params.num_parts);
  kernel<<<grid, C::kThreads, kSmem, stream>>>(params);
  return cudaGetLastError();
}

}  // namespace mlakit::detail
