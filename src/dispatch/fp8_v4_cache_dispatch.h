// Dispatch of the DeepSeek V4 FP8 cache tools: validated arguments -> one launch each. Plain
// C++ interface; implemented in CUDA (fp8_v4_cache_dispatch.cu), absent without CUDA.
#pragma once

#include "common/fp8_v4_cache_tools.h"
#include "mlakit/status.h"
#include "mlakit/stream.h"

namespace mlakit::detail {

// `op` names the entry point in a CUDA error.
Status dispatch_convert_mla_fp8_v4(const char* op, V4Convert direction, const V4ConvertArgs& args,
                                   cudaStream_t stream);
Status dispatch_append_mla_fp8_v4(const char* op, const V4AppendArgs& args, cudaStream_t stream);

}  // namespace mlakit::detail
