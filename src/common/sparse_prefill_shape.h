// The sizes of a validated sparse MLA prefill: made by host validation
// (host/mla_sparse_prefill_validate.h), read by the dispatch and the CPU reference. Plain
// data in common/ because both the host and the dispatch layer use it and neither may
// include the other's headers in that direction (docs/design.md, Layers).
#pragma once

#include <cstdint>

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

}  // namespace mlakit::detail
