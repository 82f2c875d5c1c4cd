// Validation of the sparse FP8 MLA decode arguments (shared by the reference and the GPU entry
// point): dtypes, ranks, shape agreement (sizes the kernels index with int range-checked),
// contiguity, the token layout (V3.2 or V4, from q's and the caches' last dimensions), the
// optional second cache, scale, outputs (own elements, disjoint from each other and the inputs).
#pragma once

#include <cstdint>

#include "common/fp8_token_layout.h"
#include "mlakit/mla_sparse_decode.h"

namespace mlakit::detail {

// One cache and its index list.
struct SparseCacheShape {
  int topk = 0;  // the indices' last dimension (0: no such cache)
  int64_t num_blocks = 0;
  int64_t page_size = 0;
};

struct SparseDecodeShape {
  int64_t b = 0;
  int s_q = 0;
  int h_q = 0;
  int topk = 0;
  int64_t num_blocks = 0;
  int64_t page_size = 0;
  Fp8TokenLayout layout = Fp8TokenLayout::kV32;
  int d_qk = 576;        // 576 (V3.2) or 512 (V4)
  SparseCacheShape extra;  // the second cache (extra.topk 0: none)
};

// b, s_q or h_q of 0: the empty result, nothing to compute. b may then be anything the tensors
// allow (q has no elements), so no loop may run over it.
inline bool is_empty_problem(const SparseDecodeShape& s) { return s.b == 0 || s.s_q == 0 || s.h_q == 0; }

Status validate_mla_sparse_decode_args(const char* op, const MlaSparseDecodeArgs& args, bool allow_float_out,
                                       SparseDecodeShape* shape);

}  // namespace mlakit::detail
