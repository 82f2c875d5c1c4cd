#include "support/merge_case.h"

#include <cmath>
#include <limits>
#include <random>
#include <sstream>

#include "reference/host_numeric.h"

namespace mlakit::support {
namespace {

void store_value(std::vector<uint8_t>* buffer, int64_t index, DType dtype, float value) {
  host::store_result(buffer->data(), index, dtype, value);
}

}  // namespace

std::string describe(const MergeSpec& s) {
  std::ostringstream out;
  out << "n=" << s.num_states << " rows=[";
  for (std::size_t i = 0; i < s.row_shape.size(); ++i) out << (i ? "," : "") << s.row_shape[i];
  out << "] d=" << s.d << " pad=" << s.row_pad << " " << dtype_name(s.in_dtype) << "->" << dtype_name(s.out_dtype)
      << " base " << (s.lse_base == LseBase::kBase2 ? 2 : 0) << "->" << (s.out_lse_base == LseBase::kBase2 ? 2 : 0)
      << (s.transposed_lse ? " transposed-lse" : "") << " empty=" << s.empty_fraction << " offset=" << s.o_offset
      << " seed=" << s.seed;
  return out.str();
}

HostMergeCase::HostMergeCase(const MergeSpec& s) : spec(s) {
  rows = 1;
  for (int64_t r : s.row_shape) rows *= r;
  const int64_t pitch = s.d + s.row_pad;
  o_state_stride = rows * pitch;
  lse_state_stride = rows;
  const std::size_t elem = dtype_size(s.in_dtype);
  o.assign((s.o_offset + s.num_states * o_state_stride) * elem, 0);
  lse.assign(s.num_states * rows, 0.f);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int64_t i = 0; i < s.o_offset + s.num_states * o_state_stride; ++i) store_value(&o, i, s.in_dtype, nan);

  std::mt19937_64 rng(s.seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  // LSEs spread over ~ +-20 natural units around a per-row level, so that states weigh from
  // ~0 to ~1 and the maximum moves between states.
  std::uniform_real_distribution<float> level(-30.f, 30.f), spread(-10.f, 10.f);
  std::vector<float> row_level(rows);
  for (float& l : row_level) l = level(rng);
  for (int st = 0; st < s.num_states; ++st) {
    for (int64_t r = 0; r < rows; ++r) {
      const double u = unit(rng);
      float value = row_level[r] + spread(rng);
      const bool empty = u < s.empty_fraction;
      if (empty) value = u < s.empty_fraction / 2 ? -INFINITY : INFINITY;
      // lse[st] memory: row r at its stored position (transposed: first two dims swapped).
      int64_t at = r;
      if (s.transposed_lse && s.row_shape.size() >= 2) {
        const int64_t r0 = s.row_shape[0], r1 = s.row_shape[1];
        const int64_t rest = rows / (r0 * r1);
        const int64_t i0 = r / (r1 * rest), i1 = (r / rest) % r1, i2 = r % rest;
        at = (i1 * r0 + i0) * rest + i2;
      }
      lse[st * lse_state_stride + at] = value;
      if (empty) continue;  // its values stay NaN: they must never be read
      for (int64_t j = 0; j < s.d; ++j) {
        store_value(&o, s.o_offset + st * o_state_stride + r * pitch + j, s.in_dtype, normal(rng));
      }
    }
  }
}

TensorRef HostMergeCase::o_view(const void* base, int s) const {
  const std::size_t elem = dtype_size(spec.in_dtype);
  auto* p = static_cast<uint8_t*>(const_cast<void*>(base)) + (spec.o_offset + s * o_state_stride) * elem;
  TensorRef t;
  t.data = p;
  t.dtype = spec.in_dtype;
  t.rank = static_cast<int>(spec.row_shape.size()) + 1;
  int64_t stride = spec.d + spec.row_pad;
  t.shape[t.rank - 1] = spec.d;
  t.stride[t.rank - 1] = 1;
  for (int i = t.rank - 2; i >= 0; --i) {
    t.shape[i] = spec.row_shape[i];
    t.stride[i] = stride;
    stride *= spec.row_shape[i];
  }
  return t;
}

TensorRef HostMergeCase::lse_view(const void* base, int s) const {
  TensorRef t = out_lse_view(static_cast<float*>(const_cast<void*>(base)) + s * lse_state_stride);
  if (spec.transposed_lse && t.rank >= 2) {
    const int64_t rest = rows / (spec.row_shape[0] * spec.row_shape[1]);
    t.stride[1] = rest * spec.row_shape[0];
    t.stride[0] = rest;
  }
  return t;
}

TensorRef HostMergeCase::out_view(void* base, DType dtype) const {
  TensorRef t = o_view(base, 0);
  t.data = base;
  t.dtype = dtype;
  int64_t stride = spec.d;
  for (int i = t.rank - 2; i >= 0; --i) {
    t.stride[i] = stride;
    stride *= spec.row_shape[i];
  }
  return t;
}

TensorRef HostMergeCase::out_lse_view(void* base) const {
  TensorRef t;
  t.data = base;
  t.dtype = DType::kFP32;
  t.rank = static_cast<int>(spec.row_shape.size());
  int64_t stride = 1;
  for (int i = t.rank - 1; i >= 0; --i) {
    t.shape[i] = spec.row_shape[i];
    t.stride[i] = stride;
    stride *= spec.row_shape[i];
  }
  return t;
}

MergeCall::MergeCall(const HostMergeCase& c, const void* o, const void* lse, void* out, void* out_lse) {
  for (int s = 0; s < c.spec.num_states; ++s) {
    o_views.push_back(c.o_view(o, s));
    lse_views.push_back(c.lse_view(lse, s));
  }
  args.o = o_views.data();
  args.lse = lse_views.data();
  args.num_states = c.spec.num_states;
  args.lse_base = c.spec.lse_base;
  args.out = c.out_view(out, c.spec.out_dtype);
  if (out_lse != nullptr) args.out_lse = c.out_lse_view(out_lse);
  args.out_lse_base = c.spec.out_lse_base;
}

}  // namespace mlakit::support
