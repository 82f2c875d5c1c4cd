// Validation of the MHA prefill arguments (shapes, dtypes, strides, options), shared by the
// CPU reference and the GPU entry point to come; the prefix sums' values are device data
// that only the reference can read (it checks them itself).
#pragma once

#include <cstdint>

#include "mlakit/mha_prefill.h"

namespace mlakit::detail {

struct MhaPrefillShape {
  int64_t b = 0;
  int64_t total_q = 0, total_k = 0;
  int h_q = 0, h_kv = 1, d_qk = 0, d_v = 0;
};

inline bool is_empty_problem(const MhaPrefillShape& s) { return s.b == 0 || s.total_q == 0 || s.h_q == 0; }

// (d_qk, d_v) one of (64, 64), (128, 128), (192, 128), (256, 256).
bool is_supported_head_dims(int d_qk, int d_v);

Status validate_mha_prefill_args(const char* op, const MhaPrefillArgs& args, bool allow_float_out,
                                 MhaPrefillShape* shape);

}  // namespace mlakit::detail
