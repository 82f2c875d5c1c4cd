// Per-row pieces of the GQA decode reference (include/mlakit/gqa_decode.h) and of the CPU
// cache tools (include/mlakit/gqa_cache.h): the rotary embedding, the conversion of one cache
// row to and from the cache's format, and the append of one row exactly as the GPU stores it.
// Separate from the decode so tests can check them on hand-made rows.
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

// The rotation of appended key rows, resolved: rotary_dim 0 (or style kNone) rotates nothing.
struct RowRope {
  RopeStyle style = RopeStyle::kNone;
  int rotary_dim = 0;      // the resolved rotary dim (rope.rotary_dim, or d when that is 0)
  double log_theta = 0.0;  // detail::rope_log_theta(rope.theta)
};

// Rotates x[0, rotary_dim) in place at position `pos` in float, as the GPU's append does
// (src/kernels/gqa/cache_append_row.cuh): value e becomes rope_rotate(x[e], x[partner],
// cos, sin, first) with the pair and angle of common/rotary.h, every value from the
// unrotated row. Bit-identical to the GPU (the decode rotates q with it too, then rounds q to
// its dtype; apply_rope is the independent float64 rotation the tests compare with).
void rotate_row_float(float* x, const RowRope& rope, int64_t pos);

// One appended cache row as the GPU stores it: the d values of `src` (bf16 / fp16
// `src_dtype`) from element `src_index` on, read as float, rotated by rotate_row_float at
// `pos`, then store_cache_row(..., dtype, per_tensor, tensor_scale, values, index). Returns
// store_cache_row's scale. The decode's append (keys with the call's rope, values with none)
// and the tools (gqa_cache_append, quantize_gqa_cache) all store rows through it.
float append_cache_row(const void* src, int64_t src_index, DType src_dtype, int d, const RowRope& rope, int64_t pos,
                       DType dtype, bool per_tensor, float tensor_scale, void* values, int64_t index);

// The stored value at element `index` of `values`, before the scale (exact in double).
double load_cache_value(const void* values, int64_t index, DType dtype);

}  // namespace mlakit::reference
