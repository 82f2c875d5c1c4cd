// The launcher of kernels/gqa/gqa_decode_launch.h for one q dtype, included by the two
// translation units that instantiate it (one per dtype, so that they compile in parallel).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "common/gqa_decode_tiling.h"
#include "kernels/gqa/gqa_decode_kernel.cuh"
#include "kernels/gqa/gqa_decode_launch.h"

namespace mlakit::detail {

template <typename Elem, typename CacheT, int D>
cudaError_t launch_gqa_decode_tile(const GqaDecodeParams& params, cudaStream_t stream) {
  using T = GqaDecodeTile<Elem, CacheT, D>;
  auto kernel = gqa_decode_kernel<Elem, CacheT, D>;
  // Idempotent, cheap and capture-safe (no stream work); before every launch so that each
  // device of a multi-GPU process gets it.
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, T::kSmemBytes);
  if (err != cudaSuccess) return err;
  const int row_tiles = (params.core.rows + T::kRows - 1) / T::kRows;
  const dim3 grid(static_cast<unsigned>(params.schedule.num_parts), static_cast<unsigned>(params.core.h_kv),
                  static_cast<unsigned>(row_tiles));
  kernel<<<grid, T::kThreads, T::kSmemBytes, stream>>>(params);
  return cudaGetLastError();
}

template <typename Elem, typename CacheT>
cudaError_t launch_gqa_decode_format(const GqaDecodeParams& params, cudaStream_t stream) {
  switch (params.d) {
    case 64:
      return launch_gqa_decode_tile<Elem, CacheT, 64>(params, stream);
    case 128:
      return launch_gqa_decode_tile<Elem, CacheT, 128>(params, stream);
    case 256:
      return launch_gqa_decode_tile<Elem, CacheT, 256>(params, stream);
    default:
      return cudaErrorInvalidValue;  // validation admits 64, 128 and 256 only
  }
}

template <typename Elem>
cudaError_t launch_gqa_decode(const GqaDecodeParams& params, GqaCacheFormat format, cudaStream_t stream) {
  switch (format) {
    case GqaCacheFormat::kInt8:
      return launch_gqa_decode_format<Elem, int8_t>(params, stream);
    case GqaCacheFormat::kFp8:
      return launch_gqa_decode_format<Elem, __nv_fp8_e4m3>(params, stream);
    default:
      return launch_gqa_decode_format<Elem, Elem>(params, stream);
  }
}

}  // namespace mlakit::detail
