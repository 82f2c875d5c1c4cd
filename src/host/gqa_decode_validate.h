// Validation of the GQA decode arguments (include/mlakit/gqa_decode.h), shared by the CPU
// reference and, later, the GPU entry point, so both accept and reject the same inputs with
// the same messages. Only what the host can see is checked here (dtypes, ranks, shapes,
// strides, scalar options, memory overlap); the data (lengths, block ids) lives in device
// memory for the GPU path and is the reference's own business.
#pragma once

#include <cstdint>

#include "mlakit/gqa_decode.h"

namespace mlakit::detail {

// How a quantized cache stores its dequantization scales.
enum class GqaScaleLayout {
  kNone,      // the cache holds q's dtype
  kPerToken,  // [num_blocks, page_size, h_kv] float32: int8 or fp8
  kPerTensor  // [1] float32: fp8 only
};

struct GqaDecodeShape {
  int64_t b = 0;
  int s_q = 0;
  int h_q = 0;
  int h_kv = 1;
  int d = 0;
  int64_t num_blocks = 0;
  int64_t page_size = 0;
  int max_blocks_per_seq = 0;
  DType cache_dtype = DType::kBF16;
  GqaScaleLayout scale_layout = GqaScaleLayout::kNone;
  bool append = false;  // k_new / v_new given: the caches (and per-token scales) are written
  int rotary_dim = 0;   // resolved: 0 without RoPE, else rope.rotary_dim or d
};

// b or s_q of 0: no query token, nothing to append or compute. b may then be anything the
// tensors allow (q has no elements), so no loop may run over it. (h_q of 0 is valid too: no
// output row, but k_new is still appended.)
inline bool is_empty_problem(const GqaDecodeShape& p) { return p.b == 0 || p.s_q == 0; }

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
