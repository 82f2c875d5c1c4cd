// Dispatch of the GQA decode: validated arguments -> kernel parameters -> launches (the
// planner, the attention with its fused append, the combine). Plain C++ interface, implemented
// in CUDA (gqa_decode_dispatch.cu), absent without CUDA.
#pragma once

#include "dispatch/gqa_decode_shape.h"
#include "mlakit/gqa_decode.h"

namespace mlakit::detail {

// Runs the device planner of `plan` over `cache_seqlens` ([b] int32, device).
Status dispatch_gqa_decode_plan(const GqaDecodePlan& plan, const int32_t* cache_seqlens, cudaStream_t stream);

// Launches the attention (appending k_new / v_new first when given) and the combine.
Status dispatch_gqa_decode(const GqaDecodeArgs& args, const GqaDecodeShape& shape, const GqaDecodePlan& plan,
                           float softmax_scale, cudaStream_t stream);

}  // namespace mlakit::detail
