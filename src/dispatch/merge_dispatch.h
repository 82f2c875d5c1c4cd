// Dispatch of merge_states: dtypes and layout -> one kernel instance. Plain C++ interface;
// implemented in CUDA (merge_dispatch.cu), absent without CUDA.
#pragma once

#include "common/merge_layout.h"
#include "mlakit/status.h"
#include "mlakit/stream.h"
#include "mlakit/tensor.h"

namespace mlakit::detail {

// A validated layout with rows * d > 0; `in` the states' dtype, `out` the output's. Rows that
// allow it take 16-byte loads, others one value at a time.
Status dispatch_merge_states(const char* op, const MergeLayout& layout, DType in, DType out, int sm_count,
                             cudaStream_t stream);

}  // namespace mlakit::detail
