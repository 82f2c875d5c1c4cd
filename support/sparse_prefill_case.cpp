#include "support/sparse_prefill_case.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <stdexcept>

#include "reference/host_numeric.h"

namespace mlakit::support {
namespace {

constexpr uint16_t kNanBf16 = 0x7fc0;
constexpr int kPadElems = 64;     // extra columns of padded q / kv rows (keeps 16-byte rows)
constexpr int kPadIndices = 16;   // extra entries per token of padded indices
constexpr int kNanRowsPastKv = 2; // stored kv rows past s_kv, hit by indices s_kv and s_kv + 1
constexpr double kWindowShare = 0.9;

// The invalid values an index list may hold (docs/contract.md: < 0 or >= s_kv), in rotation.
int32_t invalid_index(int64_t s_kv, int64_t k) {
  switch (k % 6) {
    case 0: return -1;
    case 1: return static_cast<int32_t>(std::min<int64_t>(s_kv, std::numeric_limits<int32_t>::max()));
    case 2: return static_cast<int32_t>(std::min<int64_t>(s_kv + 1, std::numeric_limits<int32_t>::max()));
    case 3: return std::numeric_limits<int32_t>::min();
    case 4: return -7;
    default: return std::numeric_limits<int32_t>::max();
  }
}

}  // namespace

std::vector<int32_t> make_prefill_indices(const SparsePrefillSpec& spec, int64_t pitch) {
  std::mt19937_64 rng(spec.seed * 7919 + 1);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  const int64_t s_kv = spec.s_kv;
  const int64_t window = spec.window > 0 ? std::min(spec.window, s_kv) : s_kv;
  std::uniform_int_distribution<int64_t> anywhere(0, std::max<int64_t>(s_kv - 1, 0));
  std::uniform_int_distribution<int64_t> in_window(s_kv - window, std::max<int64_t>(s_kv - 1, 0));
  auto valid = [&] {
    const bool near_end = spec.window > 0 && u(rng) < kWindowShare;
    return static_cast<int32_t>(near_end ? in_window(rng) : anywhere(rng));
  };
  std::vector<int32_t> idx(spec.s_q * pitch);
  for (int64_t t = 0; t < spec.s_q; ++t) {
    int32_t* row = idx.data() + t * pitch;
    for (int64_t k = 0; k < pitch; ++k) {
      const double r = u(rng);
      if (s_kv == 0 || t == spec.empty_token) {
        row[k] = invalid_index(s_kv, k);
      } else if (k >= spec.topk) {
        row[k] = valid();  // padding: never to be read
      } else if (r < spec.invalid_fraction) {
        row[k] = invalid_index(s_kv, k);
      } else if (k > 0 && r < spec.invalid_fraction + spec.duplicate_fraction) {
        row[k] = row[k - 1];
      } else {
        row[k] = valid();
      }
    }
  }
  return idx;
}

MlaSparsePrefillArgs HostSparsePrefillCase::args(void* q_ptr, void* kv_ptr, void* indices_ptr, void* topk_length_ptr,
                                                 void* sink_ptr, void* out_ptr, void* max_logits_ptr,
                                                 void* lse_ptr) const {
  const SparsePrefillSpec& s = spec;
  MlaSparsePrefillArgs a;
  a.q = make_tensor(q_ptr, DType::kBF16, {s.s_q, s.h_q, s.d_qk}, {q_token_pitch, q_head_pitch, 1});
  a.kv = make_tensor(kv_ptr, DType::kBF16, {s.s_kv, 1, s.d_qk}, {kv_pitch, kv_pitch, 1});
  a.indices = make_tensor(indices_ptr, DType::kInt32, {s.s_q, 1, s.topk}, {indices_pitch, indices_pitch, 1});
  if (s.with_topk_length) a.topk_length = make_tensor(topk_length_ptr, DType::kInt32, {s.s_q});
  if (s.with_sink) a.attn_sink = make_tensor(sink_ptr, DType::kFP32, {s.h_q});
  a.out = make_tensor(out_ptr, DType::kBF16, {s.s_q, s.h_q, 512}, {out_token_pitch, out_head_pitch, 1});
  a.max_logits = make_tensor(max_logits_ptr, DType::kFP32, {s.s_q, s.h_q}, {stat_pitch, 1});
  a.lse = make_tensor(lse_ptr, DType::kFP32, {s.s_q, s.h_q}, {stat_pitch, 1});
  a.sm_scale = s.sm_scale;
  a.lse_base = s.lse_base;
  return a;
}

HostSparsePrefillCase make_sparse_prefill_case(const SparsePrefillSpec& spec) {
  HostSparsePrefillCase c;
  c.spec = spec;
  const int pad = spec.strided ? kPadElems : 0;
  c.q_head_pitch = spec.d_qk + pad;
  c.q_token_pitch = spec.h_q * c.q_head_pitch + (spec.strided ? 8 : 0);
  c.kv_pitch = spec.d_qk + pad;
  c.kv_rows_stored = spec.s_kv + kNanRowsPastKv;
  c.indices_pitch = spec.topk + (spec.strided ? kPadIndices : 0);
  c.out_head_pitch = 512 + (spec.strided ? 8 : 0);
  c.out_token_pitch = spec.h_q * c.out_head_pitch + (spec.strided ? 2 : 0);
  c.stat_pitch = spec.h_q + (spec.strided ? 3 : 0);

  std::mt19937_64 rng(spec.seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  c.q.assign(spec.s_q * c.q_token_pitch, kNanBf16);
  for (int64_t t = 0; t < spec.s_q; ++t) {
    for (int h = 0; h < spec.h_q; ++h) {
      uint16_t* row = c.q.data() + t * c.q_token_pitch + h * c.q_head_pitch;
      for (int d = 0; d < spec.d_qk; ++d) row[d] = host::float_to_bf16(std::clamp(normal(rng), -1.f, 1.f));
    }
  }
  c.kv.assign(c.kv_rows_stored * c.kv_pitch, kNanBf16);
  for (int64_t r = 0; r < spec.s_kv; ++r) {
    uint16_t* row = c.kv.data() + r * c.kv_pitch;
    for (int d = 0; d < spec.d_qk; ++d) row[d] = host::float_to_bf16(std::clamp(normal(rng) * 0.1f, -1.f, 1.f));
  }
  c.indices = make_prefill_indices(spec, c.indices_pitch);
  if (spec.with_topk_length) {
    std::uniform_int_distribution<int32_t> len(0, spec.topk + 3);
    c.topk_length.resize(spec.s_q);
    for (auto& l : c.topk_length) l = len(rng);
  }
  if (spec.with_sink) {
    c.sink.resize(spec.h_q);
    for (auto& x : c.sink) x = normal(rng) * 2.f;
  }
  return c;
}

void poison_unlisted_rows(HostSparsePrefillCase& c) {
  const SparsePrefillSpec& s = c.spec;
  std::vector<bool> listed(s.s_kv, false);
  for (int64_t t = 0; t < s.s_q; ++t) {
    const int64_t counted = s.with_topk_length ? std::clamp<int64_t>(c.topk_length[t], 0, s.topk) : s.topk;
    const int32_t* row = c.indices.data() + t * c.indices_pitch;
    for (int64_t k = 0; k < counted; ++k) {
      if (row[k] >= 0 && row[k] < s.s_kv) listed[row[k]] = true;
    }
  }
  for (int64_t r = 0; r < s.s_kv; ++r) {
    if (!listed[r]) std::fill_n(c.kv.begin() + r * c.kv_pitch, c.kv_pitch, kNanBf16);
  }
}

SparsePrefillReference run_sparse_prefill_reference(const HostSparsePrefillCase& c) {
  const SparsePrefillSpec& s = c.spec;
  SparsePrefillReference r;
  r.out.assign(s.s_q * s.h_q * 512, NAN);
  r.max_logits.assign(s.s_q * s.h_q, NAN);
  r.lse.assign(s.s_q * s.h_q, NAN);
  // The reference only reads the inputs; the casts let one args() serve host and device.
  MlaSparsePrefillArgs a = c.args(const_cast<uint16_t*>(c.q.data()), const_cast<uint16_t*>(c.kv.data()),
                                  const_cast<int32_t*>(c.indices.data()), const_cast<int32_t*>(c.topk_length.data()),
                                  const_cast<float*>(c.sink.data()), nullptr, nullptr, nullptr);
  a.out = make_tensor(r.out.data(), DType::kFP32, {s.s_q, s.h_q, 512});
  a.max_logits = make_tensor(r.max_logits.data(), DType::kFP32, {s.s_q, s.h_q});
  a.lse = make_tensor(r.lse.data(), DType::kFP32, {s.s_q, s.h_q});
  const Status st = reference::mla_sparse_prefill(a);
  if (!st) throw std::runtime_error(st.to_string());
  return r;
}

}  // namespace mlakit::support
