#include "support/mha_backward_case.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <stdexcept>

#include "reference/host_numeric.h"
#include "support/accuracy.h"

namespace mlakit::support {
namespace {

using View = HostMhaPrefillCase::View;

constexpr uint64_t kDoutSalt = 0x9e3779b97f4a7c15ull;  // dout's random stream, apart from q / k / v's

// Rows [from, to) of a [rows, heads, d] view set to `value` (every head, every column).
void fill_rows(std::vector<uint16_t>* buf, const View& v, int heads, int d, int64_t from, int64_t to, uint16_t value) {
  for (int64_t t = from; t < to; ++t) {
    for (int h = 0; h < heads; ++h) {
      for (int c = 0; c < d; ++c) (*buf)[v.at(t, h, c)] = value;
    }
  }
}

// out and lse from the float64 reference forward on the case's current sequences: out rounded
// to the dtype, lse float32; NaN outside the rows of a sequence.
void set_forward_outputs(HostMhaBackwardCase* c, int num_threads) {
  const MhaPrefillSpec& s = c->fwd.spec;
  const MhaPrefillReference ref = run_mha_prefill_reference(c->fwd, num_threads);
  const int64_t rows = c->fwd.rows_in_sequences();
  c->out.assign(c->fwd.out_stored, half_nan_bits(s.dtype));
  c->lse.assign(c->fwd.lse_stored, host::float_to_bits(NAN));
  for (int64_t t = 0; t < rows; ++t) {
    for (int h = 0; h < s.h_q; ++h) {
      for (int d = 0; d < s.d_v; ++d) {
        c->out[c->fwd.out_at(t, h, d)] = to_half_bits(ref.out[(t * s.h_q + h) * s.d_v + d], s.dtype);
      }
    }
  }
  for (int h = 0; h < s.h_q; ++h) {
    for (int64_t t = 0; t < rows; ++t) {
      c->lse[c->fwd.lse_at(h, t)] = host::float_to_bits(ref.lse[h * c->fwd.total_q + t]);
    }
  }
}

std::vector<int32_t> prefix_sums(const std::vector<int32_t>& lengths) {
  std::vector<int32_t> cu(1, 0);
  for (int32_t l : lengths) cu.push_back(cu.back() + l);
  return cu;
}

// One gradient tensor of a call: where its elements are stored, which rows must be written and
// which of them must be exactly 0.
struct Gradient {
  const char* name;
  const View& view;
  int heads, d;
  int64_t written_rows;           // rows [0, written_rows) are written
  const std::vector<bool>& zero;  // [written_rows]: the row's every head must be +-0
  const std::vector<float>& ref;  // contiguous [total, heads, d]
  const std::vector<uint16_t>& stored;
  int64_t stored_size;
  int64_t total;
};

std::string where_in(const Gradient& g, int64_t element) {
  const int64_t rel = element - g.view.offset;
  const int64_t token = rel >= 0 && g.view.token_stride > 0 ? rel / g.view.token_stride : -1;
  if (token < 0) return "before the view";
  if (token >= g.total) return "guard row " + std::to_string(token - g.total) + " past the tensor";
  if (token >= g.written_rows) {
    return "row " + std::to_string(token) + ", in no sequence (the sequences end at row " +
           std::to_string(g.written_rows) + ")";
  }
  return "padding of row " + std::to_string(token);
}

std::string check_gradient(const Gradient& g, DType dtype, uint16_t poison) {
  const std::string name = g.name;
  if (static_cast<int64_t>(g.stored.size()) < g.stored_size) return name + ": buffer smaller than the case's";
  std::vector<bool> logical(g.stored.size(), false);
  std::vector<uint16_t> got(g.written_rows * g.heads * g.d);
  std::vector<float> want(got.size());
  for (int64_t t = 0; t < g.written_rows; ++t) {
    for (int h = 0; h < g.heads; ++h) {
      for (int d = 0; d < g.d; ++d) {
        const int64_t at = g.view.at(t, h, d), i = (t * g.heads + h) * g.d + d;
        logical[at] = true;
        got[i] = g.stored[at];
        want[i] = g.ref[i];
        if (std::isnan(want[i])) {
          return name + ": the reference has NaN at row " + std::to_string(t) + ", head " + std::to_string(h) +
                 ", column " + std::to_string(d) + " (a broken case: a NaN input inside a sequence)";
        }
      }
    }
  }
  for (size_t i = 0; i < g.stored.size(); ++i) {
    if (logical[i] || g.stored[i] == poison) continue;
    return name + " buffer element " + std::to_string(i) + " written (" + where_in(g, static_cast<int64_t>(i)) + ")";
  }
  // Exact zeros (mha_prefill.h: "gets dq 0", "gets dk = dv = 0"; the tolerance would hide 1e-3).
  for (int64_t t = 0; t < g.written_rows; ++t) {
    if (!g.zero[t]) continue;
    for (int h = 0; h < g.heads; ++h) {
      for (int d = 0; d < g.d; ++d) {
        const uint16_t bits = got[(t * g.heads + h) * g.d + d];
        if ((bits & 0x7fff) == 0) continue;
        char hex[8];
        std::snprintf(hex, sizeof(hex), "%04x", bits);
        return name + " row " + std::to_string(t) + ", head " + std::to_string(h) + " must be exactly 0 (" +
               (name == "dq" ? "the query sees no key" : "no query sees the key") + ") but column " +
               std::to_string(d) + " has bits 0x" + hex;
      }
    }
  }
  const AccuracyReport r = check_half_gradients(got, want, dtype, name);
  if (r.ok) return "";
  return r.message + " (cosine diff " + std::to_string(r.cosine_diff) + "; " + name + "[i]: i = (row * " +
         (name == "dq" ? "h_q" : "h_kv") + " + head) * " + std::to_string(g.d) + " + col)";
}

}  // namespace

MhaBackwardSpec mha_backward_spec(const MhaSequenceLengths& lengths, int h_q, int h_kv, int d_qk, int d_v, bool causal,
                                  uint64_t seed) {
  return {.problem = mha_prefill_spec(lengths, h_q, h_kv, d_qk, d_v, causal, seed)};
}

const char* backward_mode_name(bool deterministic) { return deterministic ? "deterministic" : "default"; }

void pad_all_views(MhaBackwardSpec* spec) {
  pad_all_views(&spec->problem);
  spec->dout_pad = {.offset = 0, .head_pad = 8, .token_pad = 16};
  spec->dq_pad = {.offset = 0, .head_pad = 16, .token_pad = 8};
  spec->dk_pad = {.offset = 0, .head_pad = 8, .token_pad = 24};
  spec->dv_pad = {.offset = 0, .head_pad = 8, .token_pad = 8};
}

bool tma_copied_rows_aligned(const MhaBackwardSpec& spec) {
  auto whole = [](const MhaViewPad& p) { return p.offset % 8 == 0 && p.head_pad % 8 == 0 && p.token_pad % 8 == 0; };
  return whole(spec.problem.q_pad) && whole(spec.problem.k_pad) && whole(spec.problem.v_pad) && whole(spec.dout_pad);
}

void align4_all_views(MhaBackwardSpec* spec) {
  spec->problem.q_pad = {.offset = 2, .head_pad = 2, .token_pad = 0};
  spec->problem.k_pad = {.offset = 0, .head_pad = 0, .token_pad = 2};
  spec->problem.v_pad = {.offset = 6, .head_pad = 2, .token_pad = 2};
  spec->problem.out_pad = {.offset = 2, .head_pad = 0, .token_pad = 2};
  spec->problem.lse_pad = 1;
  spec->dout_pad = {.offset = 0, .head_pad = 2, .token_pad = 0};
  spec->dq_pad = {.offset = 2, .head_pad = 0, .token_pad = 6};
  spec->dk_pad = {.offset = 4, .head_pad = 2, .token_pad = 2};
  spec->dv_pad = {.offset = 2, .head_pad = 2, .token_pad = 0};
}

std::string describe(const MhaBackwardSpec& s) {
  MhaPrefillSpec problem = s.problem;
  problem.with_lse = true;
  std::string text = describe(problem);
  const size_t seed_at = text.rfind(" seed=");
  const std::string grads =
      describe_pad("dout", s.dout_pad) + describe_pad("dq", s.dq_pad) + describe_pad("dk", s.dk_pad) +
      describe_pad("dv", s.dv_pad);
  const MhaBackwardSpec defaults;
  std::string dout;
  if (s.dout_std != defaults.dout_std) dout += " dout_std=" + std::to_string(s.dout_std);
  if (s.v_scale != defaults.v_scale) dout += " v_scale=" + std::to_string(s.v_scale);
  return seed_at == std::string::npos ? text + grads + dout
                                     : text.substr(0, seed_at) + grads + dout + text.substr(seed_at);
}

double backward_reference_macs(const MhaBackwardSpec& spec) {
  const MhaPrefillSpec& s = spec.problem;
  return visible_pairs(s) * s.h_q * (5.0 * s.d_qk + 4.0 * s.d_v);
}

HostMhaBackwardCase::Buffers HostMhaBackwardCase::host_inputs() const {
  // Read only; the casts let one args() serve host and device buffers.
  auto in = [](const auto& v) { return const_cast<void*>(static_cast<const void*>(v.data())); };
  return {.q = in(fwd.q),
          .k = in(fwd.k),
          .v = in(fwd.v),
          .cu_q = in(fwd.cu_q),
          .cu_k = in(fwd.cu_k),
          .dout = in(dout),
          .out = in(out),
          .lse = in(lse)};
}

MhaPrefillBackwardArgs HostMhaBackwardCase::args(const Buffers& buf) const {
  const MhaPrefillSpec& s = fwd.spec;
  // A [total, heads, d] view in `base` (null stays null).
  auto view = [&](void* base, const View& v, int64_t total, int heads, int d) {
    void* data = base == nullptr ? nullptr : static_cast<void*>(static_cast<uint16_t*>(base) + v.offset);
    return make_tensor(data, s.dtype, {total, heads, d}, {v.token_stride, v.head_stride, 1});
  };
  const MhaPrefillArgs f = fwd.args(buf.q, buf.k, buf.v, buf.cu_q, buf.cu_k, buf.out, nullptr);
  const int64_t tq = fwd.total_q, tk = fwd.total_k;
  return {.dout = view(buf.dout, dout_view, tq, s.h_q, s.d_v),
          .q = f.q,
          .k = f.k,
          .v = f.v,
          .out = f.out,
          .lse = make_tensor(buf.lse, DType::kFP32, {s.h_q, tq}, {fwd.lse_stride, 1}),
          .cu_seqlens_q = f.cu_seqlens_q,
          .cu_seqlens_k = f.cu_seqlens_k,
          .max_seqlen_q = f.max_seqlen_q,
          .max_seqlen_k = f.max_seqlen_k,
          .causal = f.causal,
          .softmax_scale = f.softmax_scale,
          .dq = view(buf.dq, dq_view, tq, s.h_q, s.d_qk),
          .dk = view(buf.dk, dk_view, tk, s.h_kv, s.d_qk),
          .dv = view(buf.dv, dv_view, tk, s.h_kv, s.d_v)};
}

HostMhaBackwardCase make_mha_backward_case(const MhaBackwardSpec& spec, int num_threads) {
  HostMhaBackwardCase c;
  c.spec = spec;
  c.spec.problem.with_lse = true;
  c.fwd = make_mha_prefill_case(c.spec.problem);
  const MhaPrefillSpec& s = c.fwd.spec;
  c.dout_view = padded_view(spec.dout_pad, s.h_q, s.d_v);
  c.dq_view = padded_view(spec.dq_pad, s.h_q, s.d_qk);
  c.dk_view = padded_view(spec.dk_pad, s.h_kv, s.d_qk);
  c.dv_view = padded_view(spec.dv_pad, s.h_kv, s.d_v);
  c.dq_stored = c.dq_view.stored_elements(c.fwd.total_q);
  c.dk_stored = c.dk_view.stored_elements(c.fwd.total_k);
  c.dv_stored = c.dv_view.stored_elements(c.fwd.total_k);

  int exponent = 0;
  if (!(spec.v_scale > 0) || std::frexp(spec.v_scale, &exponent) != 0.5f) {
    throw std::invalid_argument("make_mha_backward_case: v_scale must be a power of two, got " +
                                std::to_string(spec.v_scale));
  }
  if (spec.v_scale != 1.f) {
    uint16_t* vb = s.packed_qkv ? c.fwd.q.data() : c.fwd.v.data();
    for (int64_t t = 0; t < c.fwd.cu_k.back(); ++t) {
      for (int h = 0; h < s.h_kv; ++h) {
        for (int d = 0; d < s.d_v; ++d) {
          uint16_t& x = vb[c.fwd.v_view.at(t, h, d)];
          x = to_half_bits(from_half_bits(x, s.dtype) * spec.v_scale, s.dtype);
        }
      }
    }
  }
  c.dout.assign(c.dout_view.stored_elements(c.fwd.total_q), half_nan_bits(s.dtype));
  std::mt19937_64 rng(s.seed ^ kDoutSalt);
  std::normal_distribution<float> normal(0.f, spec.dout_std);
  for (int64_t t = 0; t < c.fwd.rows_in_sequences(); ++t) {
    for (int h = 0; h < s.h_q; ++h) {
      for (int d = 0; d < s.d_v; ++d) c.dout[c.dout_view.at(t, h, d)] = to_half_bits(normal(rng), s.dtype);
    }
  }
  set_forward_outputs(&c, num_threads);
  return c;
}

HostMhaBackwardCase recut_mha_backward_case(const HostMhaBackwardCase& c, const std::vector<int32_t>& lq,
                                            const std::vector<int32_t>& lk, int num_threads) {
  if (static_cast<int64_t>(lq.size()) != c.b() || static_cast<int64_t>(lk.size()) != c.b()) {
    throw std::invalid_argument("recut_mha_backward_case: expected " + std::to_string(c.b()) + " lengths each");
  }
  for (size_t i = 0; i < lq.size(); ++i) {
    if (lq[i] < 0 || lk[i] < 0 || lq[i] > c.fwd.max_seqlen_q || lk[i] > c.fwd.max_seqlen_k) {
      throw std::invalid_argument("recut_mha_backward_case: sequence " + std::to_string(i) +
                                  " outside [0, max_seqlen_*]");
    }
  }
  const std::vector<int32_t> cu_q = prefix_sums(lq), cu_k = prefix_sums(lk);
  const int64_t old_q = c.fwd.rows_in_sequences(), old_k = c.fwd.cu_k.back();
  if (cu_q.back() > old_q || cu_k.back() > old_k) {
    throw std::invalid_argument("recut_mha_backward_case: the new sequences need rows of no old sequence");
  }
  HostMhaBackwardCase r = c;
  MhaPrefillSpec& s = r.fwd.spec;
  s.lq = lq;
  s.lk = lk;
  s.tail_q = r.fwd.total_q - cu_q.back();
  s.tail_k = r.fwd.total_k - cu_k.back();
  r.spec.problem = s;
  r.fwd.cu_q = cu_q;
  r.fwd.cu_k = cu_k;
  // The rows the old sequences covered and the new ones do not are now in no sequence: NaN.
  const uint16_t nan = half_nan_bits(s.dtype);
  std::vector<uint16_t>* kv = s.packed_qkv ? &r.fwd.q : nullptr;
  fill_rows(&r.fwd.q, r.fwd.q_view, s.h_q, s.d_qk, cu_q.back(), old_q, nan);
  fill_rows(kv ? kv : &r.fwd.k, r.fwd.k_view, s.h_kv, s.d_qk, cu_k.back(), old_k, nan);
  fill_rows(kv ? kv : &r.fwd.v, r.fwd.v_view, s.h_kv, s.d_v, cu_k.back(), old_k, nan);
  fill_rows(&r.dout, r.dout_view, s.h_q, s.d_v, cu_q.back(), old_q, nan);
  set_forward_outputs(&r, num_threads);
  return r;
}

MhaBackwardReference run_mha_backward_reference(const HostMhaBackwardCase& c, int num_threads) {
  const MhaPrefillSpec& s = c.fwd.spec;
  const int64_t tq = c.fwd.total_q, tk = c.fwd.total_k;
  MhaBackwardReference r;
  // At least one element each, so that an empty problem still has non-null views.
  r.dq.assign(std::max<int64_t>(tq * s.h_q * s.d_qk, 1), NAN);
  r.dk.assign(std::max<int64_t>(tk * s.h_kv * s.d_qk, 1), NAN);
  r.dv.assign(std::max<int64_t>(tk * s.h_kv * s.d_v, 1), NAN);
  MhaPrefillBackwardArgs a = c.args(c.host_inputs());
  a.dq = make_tensor(r.dq.data(), DType::kFP32, {tq, s.h_q, s.d_qk});
  a.dk = make_tensor(r.dk.data(), DType::kFP32, {tk, s.h_kv, s.d_qk});
  a.dv = make_tensor(r.dv.data(), DType::kFP32, {tk, s.h_kv, s.d_v});
  const Status st = reference::mha_prefill_backward(a, num_threads);
  if (!st) throw std::runtime_error(st.to_string());
  r.dq.resize(tq * s.h_q * s.d_qk);
  r.dk.resize(tk * s.h_kv * s.d_qk);
  r.dv.resize(tk * s.h_kv * s.d_v);
  return r;
}

std::string check_mha_backward_outputs(const HostMhaBackwardCase& c, const MhaBackwardReference& ref,
                                       const std::vector<uint16_t>& dq_stored, const std::vector<uint16_t>& dk_stored,
                                       const std::vector<uint16_t>& dv_stored, uint16_t poison) {
  const MhaPrefillSpec& s = c.fwd.spec;
  const std::vector<int32_t>& cu_q = c.fwd.cu_q;
  const std::vector<int32_t>& cu_k = c.fwd.cu_k;
  // Rows that must be exactly 0: a query that sees no key (no keys, or causal t + Lk - Lq < 0),
  // a key that no query sees (a sequence without queries; no query head at all).
  std::vector<bool> dq_zero(cu_q.back(), false), dkv_zero(cu_k.back(), false);
  for (int64_t i = 0; i < c.b(); ++i) {
    const int64_t lq = cu_q[i + 1] - cu_q[i], lk = cu_k[i + 1] - cu_k[i];
    for (int64_t t = 0; t < lq; ++t) dq_zero[cu_q[i] + t] = lk == 0 || (s.causal && t + lk - lq < 0);
    for (int64_t j = 0; j < lk; ++j) dkv_zero[cu_k[i] + j] = lq == 0 || s.h_q == 0;
  }
  const int64_t tq = c.fwd.total_q, tk = c.fwd.total_k;
  const Gradient grads[] = {
      {"dq", c.dq_view, s.h_q, s.d_qk, cu_q.back(), dq_zero, ref.dq, dq_stored, c.dq_stored, tq},
      {"dk", c.dk_view, s.h_kv, s.d_qk, cu_k.back(), dkv_zero, ref.dk, dk_stored, c.dk_stored, tk},
      {"dv", c.dv_view, s.h_kv, s.d_v, cu_k.back(), dkv_zero, ref.dv, dv_stored, c.dv_stored, tk},
  };
  for (const Gradient& g : grads) {
    if (std::string bad = check_gradient(g, s.dtype, poison); !bad.empty()) return bad;
  }
  return "";
}

}  // namespace mlakit::support
