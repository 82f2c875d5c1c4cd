// The sizes of a validated MHA prefill (host validation fills it, the dispatch reads it).
#pragma once

#include <cstdint>

namespace mlakit::detail {

struct MhaPrefillShape {
  int64_t b = 0;
  int64_t total_q = 0, total_k = 0;
  int h_q = 0, h_kv = 1, d_qk = 0, d_v = 0;
};

inline bool is_empty_problem(const MhaPrefillShape& s) { return s.b == 0 || s.total_q == 0 || s.h_q == 0; }

}  // namespace mlakit::detail
