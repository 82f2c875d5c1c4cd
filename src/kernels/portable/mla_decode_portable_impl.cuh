// Launcher bodies shared by the per-dtype instantiation files.
#pragma once

#include "kernels/portable/launch.h"
#include "kernels/portable/mla_decode_combine.cuh"
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
  err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  return launch_mla_decode_combine<Elem>(params, stream);
}

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

template <typename Elem>
cudaError_t launch_mla_decode_combine(const MlaDecodeParams& params, cudaStream_t stream) {
  // A plan without splits (and so without empty sequences): the attention kernel wrote every
  // output; the combine would only read the split counts and return. Checked here because
  // every attention launcher ends with this call.
  if (params.no_splits) return cudaSuccess;
  using C = portable::CombineConfig;
  const int row_groups = min((params.rows + C::kWarps - 1) / C::kWarps, C::kMaxRowGroups);
  dim3 grid(static_cast<unsigned>(params.b), params.h_kv, row_groups);
  portable::mla_decode_combine_kernel<Elem><<<grid, portable::CombineConfig::kThreads, 0, stream>>>(params);
  return cudaGetLastError();
}

}  // namespace mlakit::detail
