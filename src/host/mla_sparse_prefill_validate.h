// Validation of the sparse MLA prefill arguments (the reference now, the GPU entry later).
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

Status validate_mla_sparse_prefill_args(const char* op, const MlaSparsePrefillArgs& args, bool allow_float_out,
                                        SparsePrefillShape* shape);

}  // namespace mlakit::detail
