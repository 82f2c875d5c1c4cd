// Validation of the MHA prefill arguments (shapes, dtypes, strides, options), forward and
// backward, shared by the CPU references and the GPU entry points; the prefix sums' values are
// device data that only the references can read (they check them themselves).
#pragma once

#include <cstdint>

#include "common/mha_prefill_shape.h"
#include "mlakit/mha_prefill.h"

namespace mlakit::detail {

// (d_qk, d_v) one of (64, 64), (128, 128), (192, 128), (256, 256).
bool is_supported_head_dims(int d_qk, int d_v);

Status validate_mha_prefill_args(const char* op, const MhaPrefillArgs& args, bool allow_float_out,
                                 MhaPrefillShape* shape);

// The backward's arguments: q, k, v, the prefix sums, max_seqlen_* and the scale by the
// forward's rules (same checks, same messages), then dout and out [total_q, h_q, d_v], lse
// [h_q, total_q] float32 (required), dq / dk / dv shaped as q / k / v, each in q's dtype;
// `allow_float`: out, dq, dk and dv may also be float32 (the CPU reference). The outputs dq,
// dk, dv own their elements and overlap neither each other nor any input.
Status validate_mha_prefill_backward_args(const char* op, const MhaPrefillBackwardArgs& args, bool allow_float,
                                          MhaPrefillShape* shape);

// Rows of `t` start at multiples of `bytes` (base pointer and the two outer strides, those of
// size-1 dimensions included); an empty tensor passes. The error names `name` and the rule.
Status check_mha_row_alignment(const char* op, const char* name, const TensorRef& t, int64_t bytes);

}  // namespace mlakit::detail
