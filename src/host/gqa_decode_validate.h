// Validation of the GQA decode arguments (include/mlakit/gqa_decode.h), shared by the CPU
// reference and, later, the GPU entry point, so both accept and reject the same inputs with
// the same messages. Only what the host can see is checked here (dtypes, ranks, shapes,
// strides, scalar options, memory overlap); the data (lengths, block ids) lives in device
// memory for the GPU path and is the reference's own business.
#pragma once

#include <cstdint>

#include "dispatch/gqa_decode_shape.h"
#include "mlakit/gqa_decode.h"

namespace mlakit::detail {


// The rotary embedding's style, theta and rotary_dim (0 or even in [2, d]); `rotary_dim`
// receives the resolved value (0 without RoPE, else rope.rotary_dim or d). Shared by the
// decode and the cache tools.
Status check_rope(const char* op, const RotaryEmbedding& rope, int d, int* rotary_dim);

// Every argument of the call: dtypes, ranks, shape agreement, last dimension contiguous,
// sizes the kernels index with int range-checked, RoPE / ALiBi / scalar options, and outputs
// with own elements disjoint from each other and from the inputs (the caches and per-token
// scales count as outputs when k_new / v_new are appended). Fills `problem`.
// `allow_float_out`: `out` may also be float32 (the CPU reference's unrounded output).
Status validate_gqa_decode_args(const char* op, const GqaDecodeArgs& args, GqaDecodeShape* problem,
                                bool allow_float_out = false);

}  // namespace mlakit::detail
