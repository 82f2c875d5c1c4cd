// Launcher body shared by the per-dtype instantiation files of the Hopper decode.
#pragma once

#include "kernels/sm90/launch.h"
#include "kernels/sm90/mla_decode_sm90_kernel.cuh"

namespace mlakit::detail {

template <typename Elem>
cudaError_t launch_mla_decode_sm90(const DenseDecodeParams& params, const CUtensorMap& kv_map, int box_rows,
                                   const CUtensorMap* q_map, cudaStream_t stream) {
  using C = sm90::Sm90MlaConfig;
  auto kernel = &sm90::mla_decode_sm90_kernel<Elem>;
  // Idempotent and cheap; not a stream operation, so it is allowed during graph capture.
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, sm90::kSm90SmemBytes);
  if (err != cudaSuccess) return err;
  const int row_tiles = (params.core.rows + C::kRows - 1) / C::kRows;
  dim3 grid(row_tiles, params.core.h_kv, params.schedule.num_parts);
  kernel<<<grid, C::kThreads, sm90::kSm90SmemBytes, stream>>>(params, kv_map, box_rows,
                                                                map_or_empty(q_map), q_map != nullptr);
  return cudaGetLastError();
}

}  // namespace mlakit::detail
