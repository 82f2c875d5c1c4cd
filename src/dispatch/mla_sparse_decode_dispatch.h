// Dispatch of the sparse FP8 MLA decode: plan over (batch, query token) sequences of length
// topk_length / topk (+ the second cache's), then the plan's kernel (Hopper or portable) + combine (none for a plan
// with no_splits: the kernel wrote every output). Plain C++ interface; implemented in CUDA
// (mla_sparse_decode_dispatch.cu), absent without CUDA.
#pragma once

#include "common/decode_schedule.h"
#include "kernels/mla_params.h"
#include "mlakit/mla_decode.h"
#include "mlakit/mla_sparse_decode.h"

namespace mlakit::detail {

Status dispatch_sparse_decode_plan(const MlaDecodePlan& plan, const SeqLengths& lengths, cudaStream_t stream);

// The kernel parameters (mlakit-decode-timeline launches its traced copy of the Hopper kernel
// with them too).
SparseDecodeParams make_sparse_decode_params(const MlaSparseDecodeArgs& args, const MlaDecodePlan& plan,
                                             const SeqLengths& lengths, Fp8TokenLayout layout, float softmax_scale);

Status dispatch_mla_sparse_decode(const MlaSparseDecodeArgs& args, const MlaDecodePlan& plan, const SeqLengths& lengths,
                                  Fp8TokenLayout layout, float softmax_scale, cudaStream_t stream);

}  // namespace mlakit::detail
