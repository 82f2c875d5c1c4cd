// Dispatch of the dense MLA decode: validated arguments -> kernel parameters -> launches.
// Plain C++ interface; implemented in CUDA (mla_decode_dispatch.cu), absent without CUDA.
// The sparse FP8 decode's: mla_sparse_decode_dispatch.h.
#pragma once

#include "kernels/mla_params.h"
#include "mlakit/mla_decode.h"

namespace mlakit::detail {

// Runs the device planner of `plan` over `cache_seqlens` ([b] int32, device).
Status dispatch_decode_plan(const MlaDecodePlan& plan, const int32_t* cache_seqlens,
                            cudaStream_t stream);

// Kernel parameters of validated dense-decode arguments and their plan (mlakit-decode-timeline
// launches its traced copy of the Hopper kernel with them too).
DenseDecodeParams make_decode_params(const MlaDecodeArgs& args, const MlaDecodePlan& plan, float softmax_scale);

// Launches attention + combine for validated arguments.
Status dispatch_mla_decode(const MlaDecodeArgs& args, const MlaDecodePlan& plan,
                           float softmax_scale, cudaStream_t stream);

// The combine step alone (it rewrites the outputs of split and empty sequences from the
// partial results in the workspace): the benchmark times it to report the plan + combine
// share of a decoding step.
Status dispatch_mla_decode_combine(const MlaDecodeArgs& args, const MlaDecodePlan& plan,
                                   cudaStream_t stream);

}  // namespace mlakit::detail
