// Dispatch of the GQA cache tools (include/mlakit/gqa_cache.h): validated arguments -> kernel
// parameters -> one launch on the instance of their dtypes. Plain C++ interface; implemented
// in CUDA (gqa_cache_dispatch.cu), absent without CUDA. `op` names the entry point in a CUDA
// error.
#pragma once

#include "mlakit/gqa_cache.h"
#include "mlakit/status.h"
#include "mlakit/stream.h"

namespace mlakit::detail {

// Arguments validated by host/gqa_cache_validate.h (shapes, dtypes, scale layouts).
Status dispatch_quantize_gqa_cache(const char* op, const TensorRef& src, const GqaPagedCache& dst, cudaStream_t stream);
Status dispatch_dequantize_gqa_cache(const char* op, const GqaPagedCache& src, const TensorRef& dst,
                                     cudaStream_t stream);
// rotary_dim: resolved by the validation (0 without RoPE).
Status dispatch_gqa_cache_append(const char* op, const GqaCacheAppendArgs& args, int rotary_dim, cudaStream_t stream);

}  // namespace mlakit::detail
