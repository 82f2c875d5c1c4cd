#include "support/mha_prefill_case.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <sstream>
#include <stdexcept>

#include "reference/host_numeric.h"
#include "support/accuracy.h"

namespace mlakit::support {
namespace {

constexpr int64_t kLseGuard = 64;  // stored lse elements past the last head's row

// Visible (query, key) pairs of one sequence (bottom-right causal alignment).
int64_t sequence_pairs(int64_t lq, int64_t lk, bool causal) {
  if (!causal) return lq * lk;
  int64_t pairs = 0;
  for (int64_t t = 0; t < lq; ++t) pairs += std::clamp<int64_t>(t + lk - lq + 1, 0, lk);
  return pairs;
}

std::string lengths(const std::vector<int32_t>& l) {
  std::string s = "[";
  for (size_t i = 0; i < l.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(l[i]);
  }
  return s + "]";
}

std::string verdict(const AccuracyReport& r, const char* layout) {
  if (r.ok) return "";
  return r.message + " (cosine diff " + std::to_string(r.cosine_diff) + "; " + layout + ")";
}

}  // namespace

MhaPrefillSpec mha_prefill_spec(const MhaSequenceLengths& lengths, int h_q, int h_kv, int d_qk, int d_v, bool causal,
                                uint64_t seed) {
  return {.lq = lengths.lq,
          .lk = lengths.lk,
          .h_q = h_q,
          .h_kv = h_kv,
          .d_qk = d_qk,
          .d_v = d_v,
          .causal = causal,
          .seed = seed};
}

MhaSequenceLengths random_short_sequences(int b, uint32_t seed) {
  std::mt19937 rng(seed);
  MhaSequenceLengths l;
  for (int i = 0; i < b; ++i) {
    const int q = static_cast<int>(rng() % 91);
    l.lq.push_back(q);
    l.lk.push_back(std::max(0, q + static_cast<int>(rng() % 51) - 10));
  }
  return l;
}

uint16_t half_nan_bits(DType dtype) { return dtype == DType::kBF16 ? uint16_t{0x7fc0} : uint16_t{0x7e00}; }

uint16_t to_half_bits(float x, DType dtype) {
  return dtype == DType::kBF16 ? host::float_to_bf16(x) : host::float_to_fp16(x);
}

float from_half_bits(uint16_t bits, DType dtype) {
  return dtype == DType::kBF16 ? host::bf16_to_float(bits) : host::fp16_to_float(bits);
}

HostMhaPrefillCase::View padded_view(const MhaViewPad& pad, int heads, int d) {
  HostMhaPrefillCase::View v;
  v.offset = pad.offset;
  v.head_stride = d + pad.head_pad;
  v.token_stride = heads * v.head_stride + pad.token_pad;
  return v;
}

std::string describe_pad(const char* name, const MhaViewPad& p) {
  if (p.offset == 0 && p.head_pad == 0 && p.token_pad == 0) return "";
  return std::string(" ") + name + "_pad=(" + std::to_string(p.offset) + "," + std::to_string(p.head_pad) + "," +
         std::to_string(p.token_pad) + ")";
}

void pad_all_views(MhaPrefillSpec* spec) {
  spec->q_pad = {.offset = 0, .head_pad = 8, .token_pad = 16};
  spec->k_pad = {.offset = 0, .head_pad = 8, .token_pad = 8};
  spec->v_pad = {.offset = 0, .head_pad = 16, .token_pad = 8};
  spec->out_pad = {.offset = 0, .head_pad = 8, .token_pad = 8};
  spec->lse_pad = 3;
}

std::string describe(const MhaPrefillSpec& s) {
  std::ostringstream o;
  o << "b=" << s.lq.size() << " lq=" << lengths(s.lq) << " lk=" << lengths(s.lk) << " tail_q=" << s.tail_q
    << " tail_k=" << s.tail_k << " h_q=" << s.h_q << " h_kv=" << s.h_kv << " d=" << s.d_qk << "/" << s.d_v << " "
    << (s.dtype == DType::kBF16 ? "bf16" : "fp16") << (s.causal ? " causal" : " non-causal");
  if (s.softmax_scale) o << " softmax_scale=" << *s.softmax_scale;
  o << (s.with_lse ? " lse" : " no-lse") << (s.packed_qkv ? " packed-qkv" : "") << describe_pad("q", s.q_pad)
    << describe_pad("k", s.k_pad) << describe_pad("v", s.v_pad) << describe_pad("out", s.out_pad);
  if (s.lse_pad) o << " lse_pad=" << s.lse_pad;
  if (s.max_seqlen_slack) o << " max_seqlen_slack=" << s.max_seqlen_slack;
  if (s.key_ramp > 0) o << " key_ramp=" << s.key_ramp;
  o << " seed=" << s.seed;
  return o.str();
}

double visible_pairs(const MhaPrefillSpec& s) {
  double pairs = 0;
  for (size_t i = 0; i < s.lq.size() && i < s.lk.size(); ++i) {
    pairs += static_cast<double>(sequence_pairs(s.lq[i], s.lk[i], s.causal));
  }
  return pairs;
}

double reference_macs(const MhaPrefillSpec& s) { return visible_pairs(s) * s.h_q * (s.d_qk + s.d_v); }

MhaPrefillArgs HostMhaPrefillCase::args(void* q_buf, void* k_buf, void* v_buf, void* cu_q_buf, void* cu_k_buf,
                                        void* out_buf, void* lse_buf) const {
  const MhaPrefillSpec& s = spec;
  auto at = [](void* base, int64_t offset) { return static_cast<void*>(static_cast<uint16_t*>(base) + offset); };
  if (s.packed_qkv) k_buf = v_buf = q_buf;
  MhaPrefillArgs a;
  a.q = make_tensor(at(q_buf, q_view.offset), s.dtype, {total_q, s.h_q, s.d_qk}, {q_view.token_stride, q_view.head_stride, 1});
  a.k = make_tensor(at(k_buf, k_view.offset), s.dtype, {total_k, s.h_kv, s.d_qk}, {k_view.token_stride, k_view.head_stride, 1});
  a.v = make_tensor(at(v_buf, v_view.offset), s.dtype, {total_k, s.h_kv, s.d_v}, {v_view.token_stride, v_view.head_stride, 1});
  a.cu_seqlens_q = make_tensor(cu_q_buf, DType::kInt32, {b() + 1});
  a.cu_seqlens_k = make_tensor(cu_k_buf, DType::kInt32, {b() + 1});
  a.max_seqlen_q = max_seqlen_q;
  a.max_seqlen_k = max_seqlen_k;
  a.causal = s.causal;
  a.softmax_scale = s.softmax_scale;
  a.out = make_tensor(at(out_buf, out_view.offset), s.dtype, {total_q, s.h_q, s.d_v},
                      {out_view.token_stride, out_view.head_stride, 1});
  if (lse_buf != nullptr && s.with_lse) {
    a.lse = make_tensor(lse_buf, DType::kFP32, {s.h_q, total_q}, {lse_stride, 1});
  }
  return a;
}

HostMhaPrefillCase make_mha_prefill_case(const MhaPrefillSpec& spec) {
  if (spec.lq.size() != spec.lk.size()) throw std::invalid_argument("make_mha_prefill_case: lq and lk differ in size");
  if (spec.packed_qkv && (spec.d_qk != spec.d_v || spec.lq != spec.lk || spec.tail_q != spec.tail_k)) {
    throw std::invalid_argument("make_mha_prefill_case: packed_qkv needs d_qk == d_v, lq == lk, tail_q == tail_k");
  }
  HostMhaPrefillCase c;
  c.spec = spec;
  const MhaPrefillSpec& s = c.spec;
  c.cu_q.assign(1, 0);
  c.cu_k.assign(1, 0);
  int longest_q = 0, longest_k = 0;
  for (size_t i = 0; i < s.lq.size(); ++i) {
    c.cu_q.push_back(c.cu_q.back() + s.lq[i]);
    c.cu_k.push_back(c.cu_k.back() + s.lk[i]);
    longest_q = std::max(longest_q, s.lq[i]);
    longest_k = std::max(longest_k, s.lk[i]);
  }
  c.total_q = c.cu_q.back() + s.tail_q;
  c.total_k = c.cu_k.back() + s.tail_k;
  c.max_seqlen_q = longest_q + s.max_seqlen_slack;
  c.max_seqlen_k = longest_k + s.max_seqlen_slack;

  const uint16_t nan = half_nan_bits(s.dtype);
  if (s.packed_qkv) {
    const int64_t heads = s.h_q + 2 * s.h_kv, stride = heads * s.d_qk;
    c.q_view = {0, stride, s.d_qk};
    c.k_view = {int64_t{s.h_q} * s.d_qk, stride, s.d_qk};
    c.v_view = {int64_t{s.h_q + s.h_kv} * s.d_qk, stride, s.d_qk};
    c.q.assign((c.total_q + kMhaGuardRows) * stride, nan);
  } else {
    c.q_view = padded_view(s.q_pad, s.h_q, s.d_qk);
    c.k_view = padded_view(s.k_pad, s.h_kv, s.d_qk);
    c.v_view = padded_view(s.v_pad, s.h_kv, s.d_v);
    c.q.assign(c.q_view.stored_elements(c.total_q), nan);
    c.k.assign(c.k_view.stored_elements(c.total_k), nan);
    c.v.assign(c.v_view.stored_elements(c.total_k), nan);
  }
  c.out_view = padded_view(s.out_pad, s.h_q, s.d_v);
  c.out_stored = c.out_view.stored_elements(c.total_q);
  c.lse_stride = c.total_q + s.lse_pad;
  c.lse_stored = s.h_q * c.lse_stride + kLseGuard;

  uint16_t* qb = c.q.data();
  uint16_t* kb = s.packed_qkv ? c.q.data() : c.k.data();
  uint16_t* vb = s.packed_qkv ? c.q.data() : c.v.data();
  std::mt19937_64 rng(spec.seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  for (int64_t t = 0; t < c.cu_q.back(); ++t) {
    for (int h = 0; h < s.h_q; ++h) {
      uint16_t* row = qb + c.q_view.at(t, h, 0);
      for (int d = 0; d < s.d_qk; ++d) row[d] = to_half_bits(std::clamp(normal(rng), -3.f, 3.f), s.dtype);
    }
  }
  for (size_t i = 0; i < s.lk.size(); ++i) {
    const int64_t lk = s.lk[i];
    for (int64_t j = 0; j < lk; ++j) {
      const int64_t t = c.cu_k[i] + j;
      const float ramp = static_cast<float>(1.0 + s.key_ramp * static_cast<double>(j) / std::max<int64_t>(lk - 1, 1));
      for (int h = 0; h < s.h_kv; ++h) {
        uint16_t* krow = kb + c.k_view.at(t, h, 0);
        uint16_t* vrow = vb + c.v_view.at(t, h, 0);
        for (int d = 0; d < s.d_qk; ++d) krow[d] = to_half_bits(std::clamp(normal(rng), -3.f, 3.f) * ramp, s.dtype);
        for (int d = 0; d < s.d_v; ++d) vrow[d] = to_half_bits(std::clamp(normal(rng) * 0.1f, -1.f, 1.f), s.dtype);
      }
    }
  }
  return c;
}

MhaPrefillReference run_mha_prefill_reference(const HostMhaPrefillCase& c, int num_threads) {
  const MhaPrefillSpec& s = c.spec;
  MhaPrefillReference r;
  // At least one element each, so that an empty problem still has non-null views.
  r.out.assign(std::max<int64_t>(c.total_q * s.h_q * s.d_v, 1), NAN);
  r.lse.assign(std::max<int64_t>(s.h_q * c.total_q, 1), NAN);
  // The reference only reads the inputs; the casts let one args() serve host and device.
  MhaPrefillArgs a = c.args(const_cast<uint16_t*>(c.q.data()), const_cast<uint16_t*>(c.k.data()),
                            const_cast<uint16_t*>(c.v.data()), const_cast<int32_t*>(c.cu_q.data()),
                            const_cast<int32_t*>(c.cu_k.data()), nullptr, nullptr);
  a.out = make_tensor(r.out.data(), DType::kFP32, {c.total_q, s.h_q, s.d_v});
  a.lse = make_tensor(r.lse.data(), DType::kFP32, {s.h_q, c.total_q});
  const Status st = reference::mha_prefill(a, num_threads);
  if (!st) throw std::runtime_error(st.to_string());
  r.out.resize(c.total_q * s.h_q * s.d_v);
  r.lse.resize(s.h_q * c.total_q);
  return r;
}

std::string check_mha_prefill_outputs(const HostMhaPrefillCase& c, const MhaPrefillReference& ref,
                                      const std::vector<uint16_t>& out_stored,
                                      const std::vector<uint32_t>* lse_stored, uint16_t out_poison,
                                      uint32_t lse_poison) {
  const MhaPrefillSpec& s = c.spec;
  const int64_t rows = c.rows_in_sequences();
  if (static_cast<int64_t>(out_stored.size()) < c.out_stored) return "out: buffer smaller than the case's";
  if (lse_stored != nullptr && static_cast<int64_t>(lse_stored->size()) < c.lse_stored) {
    return "lse: buffer smaller than the case's";
  }

  // out: the rows of a sequence, gathered [rows, h_q, d_v]; everything else keeps the poison.
  std::vector<bool> logical(out_stored.size(), false);
  std::vector<uint16_t> got(rows * s.h_q * s.d_v);
  std::vector<float> want(got.size());
  for (int64_t t = 0; t < rows; ++t) {
    for (int h = 0; h < s.h_q; ++h) {
      const int64_t row = t * s.h_q + h;
      for (int d = 0; d < s.d_v; ++d) {
        const int64_t at = c.out_at(t, h, d);
        logical[at] = true;
        got[row * s.d_v + d] = out_stored[at];
        want[row * s.d_v + d] = ref.out[row * s.d_v + d];
      }
    }
  }
  for (size_t i = 0; i < out_stored.size(); ++i) {
    if (logical[i] || out_stored[i] == out_poison) continue;
    const int64_t rel = static_cast<int64_t>(i) - c.out_view.offset;
    const int64_t token = rel >= 0 ? rel / c.out_view.token_stride : -1;
    std::string where = token < 0 ? "before the view"
                        : token >= c.total_q ? "guard row " + std::to_string(token - c.total_q) + " past total_q"
                        : token >= rows ? "row " + std::to_string(token) + " (in no sequence: cu_seqlens_q[b] = " +
                                              std::to_string(rows) + ")"
                                        : "padding of row " + std::to_string(token);
    return "out buffer element " + std::to_string(i) + " written (" + where + ")";
  }

  // Rows that see no key: out exactly 0 (docs/contract.md; the tolerance would hide 1e-3).
  for (int64_t t = 0; t < rows; ++t) {
    for (int h = 0; h < s.h_q; ++h) {
      if (!std::isinf(ref.lse[h * c.total_q + t])) continue;
      for (int d = 0; d < s.d_v; ++d) {
        if ((got[(t * s.h_q + h) * s.d_v + d] & 0x7fff) != 0) {
          return "out row " + std::to_string(t) + ", head " + std::to_string(h) + " sees no key but element " +
                 std::to_string(d) + " is not 0";
        }
      }
    }
  }
  std::string bad = verdict(check_half_outputs(got, want, s.dtype, "out"), "out[i]: i = (row * h_q + head) * d_v + col");
  if (!bad.empty() || lse_stored == nullptr) return bad;

  std::vector<bool> lse_logical(lse_stored->size(), false);
  std::vector<float> got_lse(s.h_q * rows), want_lse(got_lse.size());
  for (int h = 0; h < s.h_q; ++h) {
    for (int64_t t = 0; t < rows; ++t) {
      const int64_t at = c.lse_at(h, t);
      lse_logical[at] = true;
      got_lse[h * rows + t] = host::bits_to_float((*lse_stored)[at]);
      want_lse[h * rows + t] = ref.lse[h * c.total_q + t];
    }
  }
  for (size_t i = 0; i < lse_stored->size(); ++i) {
    if (lse_logical[i] || (*lse_stored)[i] == lse_poison) continue;
    const int64_t h = static_cast<int64_t>(i) / c.lse_stride, t = static_cast<int64_t>(i) % c.lse_stride;
    return "lse buffer element " + std::to_string(i) + " written (" +
           (h >= s.h_q ? std::string("guard past the last head")
                       : "head " + std::to_string(h) + ", row " + std::to_string(t) +
                             (t >= c.total_q ? " (padding)" : " (in no sequence)")) +
           ")";
  }
  return verdict(check_float_stats(got_lse, want_lse, "lse"), "lse[i]: i = head * rows + row");
}

}  // namespace mlakit::support
