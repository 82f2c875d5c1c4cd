// Per-row pieces of the GQA decode reference (include/mlakit/gqa_decode.h): the rotary
// embedding and the conversion of one cache row to and from the cache's format. Separate from
// the decode so tests can check them on hand-made rows.
#pragma once

#include <cstdint>

#include "mlakit/gqa_decode.h"
#include "mlakit/tensor.h"

namespace mlakit::reference {

// Rotates the first `rotary_dim` values of x (one head of d values) in place, float64: pairs
// (c, c + rotary_dim / 2) for NeoX, (2c, 2c + 1) for GPT-J, c < rotary_dim / 2, by the angle
// pos * theta^(-2c / rotary_dim):  (a, b) -> (a cos - b sin, a sin + b cos).
// RopeStyle::kNone or rotary_dim 0 leaves x as it is.
void apply_rope(double* x, RopeStyle style, double theta, int rotary_dim, double pos);

// Stores row x[0, d) at element `index` of `values` in `dtype` (bf16 / fp16: rounded to
// nearest even; int8 / fp8: common/gqa_cache_quant.h, with `tensor_scale` when `per_tensor`,
// else the row's own scale). Returns the row's scale (what a per-token scale tensor holds; 0
// for the 16-bit dtypes and per-tensor scales, where nothing is stored).
float store_cache_row(const float* x, int d, DType dtype, bool per_tensor, float tensor_scale, void* values,
                      int64_t index);

// The stored value at element `index` of `values`, before the scale (exact in double).
double load_cache_value(const void* values, int64_t index, DType dtype);

}  // namespace mlakit::reference
