// Dispatch of the sparse MLA prefill: validated arguments -> the Hopper kernel with its
// gathering producer, or the portable kernel's whole-sequence mode with bf16 row gather. Plain C++ interface; implemented in CUDA.
#pragma once

#include "common/sparse_prefill_shape.h"
#include "mlakit/mla_sparse_prefill.h"

namespace mlakit::detail {

// Arguments already validated (validate_mla_sparse_prefill_args and _kernel_args), s_q >= 1;
// `sm_scale` resolved (no NaN default left); `kernel` resolved (kPortable or kSm90).
Status dispatch_mla_sparse_prefill(const MlaSparsePrefillArgs& args, const SparsePrefillShape& shape, float sm_scale,
                                   MlaKernel kernel, cudaStream_t stream);

}  // namespace mlakit::detail
