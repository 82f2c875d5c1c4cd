// Launcher of the GQA decode kernel (kernels/gqa/gqa_decode_kernel.cuh), one instantiation per
// (q dtype, cache format, head dim): gqa_decode_bf16.cu, gqa_decode_fp16.cu.
#pragma once

#include <cuda_runtime.h>

#include "kernels/gqa/gqa_params.h"

namespace mlakit::detail {

// The stored format of a GQA cache, as the kernels' CacheT: q's dtype, int8 or fp8 e4m3.
enum class GqaCacheFormat { kElem, kInt8, kFp8 };

// Launches the attention (with the fused append) over params.schedule's parts: grid
// (num_parts, h_kv, row tiles). d: 64, 128 or 256. Elem: __nv_bfloat16 or __half.
template <typename Elem>
cudaError_t launch_gqa_decode(const GqaDecodeParams& params, GqaCacheFormat format, cudaStream_t stream);

}  // namespace mlakit::detail
