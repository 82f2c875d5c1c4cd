#include "reference/gqa_cache_ref.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/gqa_cache_quant.h"
#include "common/rotary.h"
#include "reference/host_numeric.h"

namespace mlakit::reference {

void apply_rope(double* x, RopeStyle style, double theta, int rotary_dim, double pos) {
  if (style == RopeStyle::kNone || rotary_dim == 0) return;
  const int half = rotary_dim / 2;
  for (int c = 0; c < half; ++c) {
    const double angle = pos * std::pow(theta, -2.0 * c / rotary_dim);
    const double cs = std::cos(angle), sn = std::sin(angle);
    double& a = style == RopeStyle::kNeox ? x[c] : x[2 * c];
    double& b = style == RopeStyle::kNeox ? x[c + half] : x[2 * c + 1];
    const double a0 = a, b0 = b;
    a = a0 * cs - b0 * sn;
    b = a0 * sn + b0 * cs;
  }
}

float store_cache_row(const float* x, int d, DType dtype, bool per_tensor, float tensor_scale, void* values,
                      int64_t index) {
  if (dtype == DType::kBF16 || dtype == DType::kFP16) {
    for (int c = 0; c < d; ++c) host::store_half(values, index + c, dtype, x[c]);
    return 0.0f;
  }
  float amax = 0.0f;  // fmax skips NaN, as the GPU's max reduction does
  for (int c = 0; c < d; ++c) amax = std::fmax(amax, std::fabs(x[c]));
  if (dtype == DType::kInt8) {
    const float scale = detail::int8_row_scale(amax);
    for (int c = 0; c < d; ++c) host::store_as<int8_t>(values, index + c, detail::int8_quantize(x[c], scale));
    return scale;
  }
  const float scale = per_tensor ? tensor_scale : detail::fp8_row_scale(amax);
  for (int c = 0; c < d; ++c) host::store_as<uint8_t>(values, index + c, detail::fp8_quantize(x[c], scale));
  return per_tensor ? 0.0f : scale;
}

void rotate_row_float(float* x, const RowRope& rope, int64_t pos) {
  if (rope.style == RopeStyle::kNone || rope.rotary_dim == 0) return;
  const int style = static_cast<int>(rope.style);
  std::vector<float> rotated(rope.rotary_dim);
  for (int e = 0; e < rope.rotary_dim; ++e) {
    const detail::RopePair p = detail::rope_pair(e, style, rope.rotary_dim);
    float cs, sn;
    detail::rope_cos_sin(pos, p.c, rope.rotary_dim, rope.log_theta, &cs, &sn);
    rotated[e] = detail::rope_rotate(x[e], x[p.partner], cs, sn, p.first);
  }
  std::copy(rotated.begin(), rotated.end(), x);
}

float append_cache_row(const void* src, int64_t src_index, DType src_dtype, int d, const RowRope& rope, int64_t pos,
                       DType dtype, bool per_tensor, float tensor_scale, void* values, int64_t index) {
  std::vector<float> x(d);
  for (int c = 0; c < d; ++c) x[c] = host::load_half(src, src_index + c, src_dtype);
  rotate_row_float(x.data(), rope, pos);
  return store_cache_row(x.data(), d, dtype, per_tensor, tensor_scale, values, index);
}

double load_cache_value(const void* values, int64_t index, DType dtype) {
  switch (dtype) {
    case DType::kInt8:
      return host::load_as<int8_t>(values, index);
    case DType::kFP8E4M3:
      return detail::e4m3_to_float(host::load_as<uint8_t>(values, index));
    default:
      return host::load_half(values, index, dtype);
  }
}

}  // namespace mlakit::reference
