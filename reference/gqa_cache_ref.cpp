// The per-row pieces of the GQA reference, and the CPU cache tools (include/mlakit/gqa_cache.h)
// built from them: every row is stored by append_cache_row, the GPU's arithmetic.
#include "reference/gqa_cache_ref.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/gqa_cache_quant.h"
#include "common/rotary.h"
#include "host/gqa_cache_validate.h"
#include "mlakit/gqa_cache.h"
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

namespace {

using detail::GqaScaleLayout;

// One cache of the tools with its layout: element offsets of (block, row, kv head).
struct ToolCache {
  const GqaPagedCache& c;
  GqaScaleLayout layout;

  int64_t row(int64_t block, int64_t page_row, int hk) const {
    return block * c.values.stride[0] + page_row * c.values.stride[1] + hk * c.values.stride[2];
  }
  int64_t scale_at(int64_t block, int64_t page_row, int hk) const {
    return block * c.scale.stride[0] + page_row * c.scale.stride[1] + hk * c.scale.stride[2];
  }
  float scale_of(int64_t block, int64_t page_row, int hk) const {
    if (layout == GqaScaleLayout::kPerTensor) return host::load_as<float>(c.scale.data, 0);
    return host::load_as<float>(c.scale.data, scale_at(block, page_row, hk));
  }
  // Appends d values of src from src_index on (rotated by `rope` at `pos`) as the GPU does.
  void append(int64_t block, int64_t page_row, int hk, const TensorRef& src, int64_t src_index, int d,
              const RowRope& rope, int64_t pos) const {
    const bool per_tensor = layout == GqaScaleLayout::kPerTensor;
    const float tensor_scale = per_tensor ? host::load_as<float>(c.scale.data, 0) : 0.0f;
    const float s = append_cache_row(src.data, src_index, src.dtype, d, rope, pos, c.values.dtype, per_tensor,
                                     tensor_scale, c.values.data, row(block, page_row, hk));
    if (layout == GqaScaleLayout::kPerToken) host::store_as<float>(c.scale.data, scale_at(block, page_row, hk), s);
  }
};

int64_t dense_row(const TensorRef& t, int64_t block, int64_t page_row, int hk) {
  return block * t.stride[0] + page_row * t.stride[1] + hk * t.stride[2];
}

}  // namespace

Status quantize_gqa_cache(const TensorRef& src, const GqaPagedCache& dst) {
  detail::GqaCacheShape s;
  MLAKIT_RETURN_IF_ERROR(detail::validate_quantize_gqa_cache("reference::quantize_gqa_cache", src, dst, &s));
  const ToolCache cache{dst, s.scale_layout};
  for (int64_t block = 0; block < s.num_blocks; ++block) {
    for (int64_t page_row = 0; page_row < s.page_size; ++page_row) {
      for (int hk = 0; hk < s.h_kv; ++hk) {
        cache.append(block, page_row, hk, src, dense_row(src, block, page_row, hk), s.d, RowRope{}, 0);
      }
    }
  }
  return Status::ok();
}

// stored * scale as one float product, then rounded to dst's dtype (the GPU's order).
Status dequantize_gqa_cache(const GqaPagedCache& src, const TensorRef& dst) {
  detail::GqaCacheShape s;
  MLAKIT_RETURN_IF_ERROR(detail::validate_dequantize_gqa_cache("reference::dequantize_gqa_cache", src, dst, &s));
  const ToolCache cache{src, s.scale_layout};
  for (int64_t block = 0; block < s.num_blocks; ++block) {
    for (int64_t page_row = 0; page_row < s.page_size; ++page_row) {
      for (int hk = 0; hk < s.h_kv; ++hk) {
        const float scale = cache.scale_of(block, page_row, hk);
        const int64_t from = cache.row(block, page_row, hk), to = dense_row(dst, block, page_row, hk);
        for (int c = 0; c < s.d; ++c) {
          const float stored = static_cast<float>(load_cache_value(src.values.data, from + c, s.cache_dtype));
          host::store_half(dst.data, to + c, dst.dtype, stored * scale);
        }
      }
    }
  }
  return Status::ok();
}

// Entry by entry, token by token: rows at skipped positions are never addressed. (Two rows
// on one slot are written in this order here; on the GPU they race.)
Status gqa_cache_append(const GqaCacheAppendArgs& a) {
  detail::GqaAppendShape p;
  MLAKIT_RETURN_IF_ERROR(detail::validate_gqa_cache_append("reference::gqa_cache_append", a, &p));
  const ToolCache k{a.k_cache, p.scale_layout}, v{a.v_cache, p.scale_layout};
  const RowRope k_rope{a.rope.style, p.rotary_dim, detail::rope_log_theta(a.rope.theta)};
  for (int64_t i = 0; i < p.b; ++i) {
    if (!a.finished.empty() && host::load_as<uint8_t>(a.finished.data, i * a.finished.stride[0]) != 0) continue;
    const int64_t L = host::load_as<int32_t>(a.cache_seqlens.data, i * a.cache_seqlens.stride[0]);
    for (int t = 0; t < p.s_q; ++t) {
      const int64_t pos = L - p.s_q + t;
      if (pos < 0 || pos / p.page_size >= p.max_blocks_per_seq) continue;
      const int64_t block = host::load_as<int32_t>(a.block_table.data, i * a.block_table.stride[0] + pos / p.page_size);
      if (block < 0 || block >= p.num_blocks) continue;
      for (int hk = 0; hk < p.h_kv; ++hk) {
        const int64_t k_src = i * a.k_new.stride[0] + t * a.k_new.stride[1] + hk * a.k_new.stride[2];
        const int64_t v_src = i * a.v_new.stride[0] + t * a.v_new.stride[1] + hk * a.v_new.stride[2];
        k.append(block, pos % p.page_size, hk, a.k_new, k_src, p.d, k_rope, pos);
        v.append(block, pos % p.page_size, hk, a.v_new, v_src, p.d, RowRope{}, pos);
      }
    }
  }
  return Status::ok();
}

}  // namespace mlakit::reference
