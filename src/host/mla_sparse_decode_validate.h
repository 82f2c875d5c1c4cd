// Validation of the sparse FP8 MLA decode arguments (shared by the reference and the GPU entry
// point): dtypes, ranks, shape agreement (sizes the kernels index with int range-checked),
// contiguity, scale, outputs (own elements, disjoint from each other and the inputs).
#pragma once

#include <cstdint>

#include "mlakit/mla_sparse_decode.h"

namespace mlakit::detail {

struct SparseDecodeShape {
  int64_t b = 0;
  int s_q = 0;
  int h_q = 0;
  int topk = 0;
  int64_t num_blocks = 0;
  int64_t page_size = 0;
};

// b, s_q or h_q of 0: the empty result, nothing to compute. b may then be anything the tensors
// allow (q has no elements), so no loop may run over it.
inline bool is_empty_problem(const SparseDecodeShape& s) { return s.b == 0 || s.s_q == 0 || s.h_q == 0; }

Status validate_mla_sparse_decode_args(const char* op, const MlaSparseDecodeArgs& args, bool allow_float_out,
                                       SparseDecodeShape* shape);

}  // namespace mlakit::detail
