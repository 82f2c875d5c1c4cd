// Validation of the sparse MLA prefill arguments: what every implementation needs (shared by
// the GPU entry point and the CPU reference), then what the GPU kernel adds.
#pragma once

#include <cstdint>

#include "mlakit/mla_sparse_prefill.h"

namespace mlakit::detail {

struct SparsePrefillShape {
  int64_t s_q = 0;
  int64_t s_kv = 0;
  int h_q = 0;
  int d_qk = 0;
  int topk = 0;
};

// s_q or h_q of 0: the empty result, nothing to compute. The other size may then be anything
// the tensors allow (q has no elements), so no loop may run over it.
inline bool is_empty_problem(const SparsePrefillShape& s) { return s.s_q == 0 || s.h_q == 0; }

Status validate_mla_sparse_prefill_args(const char* op, const MlaSparsePrefillArgs& args, bool allow_float_out,
                                        SparsePrefillShape* shape);

// What the portable kernel needs beyond the arguments' meaning (host-only, checked before any
// device query): q and kv rows 16-byte aligned (16-byte cp.async), out rows 4-byte aligned
// (bf16 pairs), 4-byte aligned int32/float tensors, and a grid of
// s_q * ceil(h_q / rows_per_cta) CTAs within the 2^31 - 1 limit of gridDim.x.
Status validate_mla_sparse_prefill_kernel_args(const char* op, const MlaSparsePrefillArgs& args,
                                               const SparsePrefillShape& shape, int rows_per_cta);

}  // namespace mlakit::detail
