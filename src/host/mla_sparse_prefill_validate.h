// Validation of the sparse MLA prefill arguments: what every implementation needs (shared by
// the GPU entry point and the CPU reference), then what the GPU kernel adds.
#pragma once

#include "common/sparse_prefill_shape.h"
#include "mlakit/mla_sparse_prefill.h"

namespace mlakit::detail {

Status validate_mla_sparse_prefill_args(const char* op, const MlaSparsePrefillArgs& args, bool allow_float_out,
                                        SparsePrefillShape* shape);

// What the portable kernel needs beyond the arguments' meaning (host-only, checked before any
// device query): q and kv rows 16-byte aligned (16-byte cp.async), out rows 4-byte aligned
// (bf16 pairs), 4-byte aligned int32/float tensors, and a grid of
// s_q * ceil(h_q / rows_per_cta) CTAs within the 2^31 - 1 limit of gridDim.x.
Status validate_mla_sparse_prefill_kernel_args(const char* op, const MlaSparsePrefillArgs& args,
                                               const SparsePrefillShape& shape, int rows_per_cta);

}  // namespace mlakit::detail
