// Launcher of the merge_states kernel (merge_states_kernel.cuh; instances in merge_states.cu).
#pragma once

#include <cuda_runtime.h>

#include "common/merge_layout.h"

namespace mlakit::detail {

// In, Out: float, __nv_bfloat16 or __half. kVec: values per chunk, 16 / sizeof(In) (the caller
// has checked that d is a multiple of it and every row of o and out is aligned to a chunk's
// bytes) or 1 (any layout). sm_count sizes the grid (about one wave of resident CTAs).
template <typename In, typename Out, int kVec>
cudaError_t launch_merge_states(const MergeLayout& layout, int sm_count, cudaStream_t stream);

}  // namespace mlakit::detail
