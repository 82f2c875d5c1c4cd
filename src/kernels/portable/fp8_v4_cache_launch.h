// Launchers of the DeepSeek V4 FP8 cache kernels (any CUDA GPU): one warp per token.
#pragma once

#include <cuda_runtime.h>

#include "common/fp8_v4_cache_tools.h"

namespace mlakit::detail {

cudaError_t launch_quantize_mla_fp8_v4(const V4ConvertArgs& args, cudaStream_t stream);
cudaError_t launch_dequantize_mla_fp8_v4(const V4ConvertArgs& args, cudaStream_t stream);
cudaError_t launch_append_mla_fp8_v4(const V4AppendArgs& args, cudaStream_t stream);

}  // namespace mlakit::detail
