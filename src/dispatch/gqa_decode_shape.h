// The validated shape of a GQA decode call and the plan quantities derived from its problem:
// what the host layer hands the dispatch (src/host/gqa_decode_validate.cpp fills the shape,
// src/host/gqa_decode_layout.cpp lays the plan out with the same functions).
#pragma once

#include <algorithm>
#include <climits>
#include <cstdint>

#include "mlakit/gqa_decode.h"
#include "mlakit/tensor.h"

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

// Query rows per kv head: s_q * h_q / h_kv.
inline int64_t gqa_decode_rows(const GqaDecodeProblem& p) { return static_cast<int64_t>(p.s_q) * (p.h_q / p.h_kv); }

// Keys scheduled per batch entry: with a window only the last window + s_q - 1 positions can
// be seen by any of the s_q tokens (causal or not), so lengths are capped there and the
// kernel reads scheduled key k at position L - min(L, cap) + k. INT_MAX without a window.
inline int32_t gqa_scheduled_cap(const GqaDecodeProblem& p) {
  return p.window > 0 ? static_cast<int32_t>(std::min<int64_t>(INT_MAX, int64_t{p.window} + p.s_q - 1)) : INT_MAX;
}

}  // namespace mlakit::detail
