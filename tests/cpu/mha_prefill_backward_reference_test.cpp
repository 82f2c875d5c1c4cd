// CPU reference of the dense MHA prefill backward (include/mlakit/mha_prefill.h): its dq, dk,
// dv against central differences of a float64 forward written here (every head-dim pair, GQA,
// causal bottom-right with Lq < Lk and Lq > Lk, lengths 0 and 1, several key blocks, fp16 and
// a given scale), the causal alignment, GQA sums, rows that see or are seen by nothing, rows
// outside every sequence (NaN inputs, poisoned outputs), the validation of every argument,
// empty problems and determinism across thread counts.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "cpu_test_util.h"
#include "mlakit/mha_prefill.h"
#include "reference/host_numeric.h"

namespace mlakit {
namespace {

using mlakit::testing::IsInvalid;
using mlakit::testing::StatusIs;

uint16_t nan_half(DType dt) { return dt == DType::kBF16 ? 0x7fc0 : 0x7e00; }
uint16_t to_half(float x, DType dt) { return dt == DType::kBF16 ? host::float_to_bf16(x) : host::float_to_fp16(x); }
double from_half(uint16_t h, DType dt) { return dt == DType::kBF16 ? host::bf16_to_float(h) : host::fp16_to_float(h); }

// Packed sequences, then `extra` rows of q and of k in no sequence. Inputs are 16-bit (exact
// in float64); every element the operation must not read is NaN: rows outside the sequences
// and q's padding (q is a view of rows q_pitch wide).
struct Problem {
  std::vector<int32_t> cu_q{0}, cu_k{0};
  int max_q = 0, max_k = 0;
  int64_t rows_q = 0, rows_k = 0;
  int h_q = 0, h_kv = 0, d_qk = 0, d_v = 0;
  DType dtype = DType::kBF16;
  bool causal = false;
  std::optional<float> scale;
  int64_t q_pitch = 0;
  std::vector<uint16_t> q, k, v, dout;  // [rows, heads, pitch or d]

  int64_t q_index(int64_t row, int h, int d) const { return (row * h_q + h) * q_pitch + d; }
  int64_t k_index(int64_t row, int h, int d) const { return (row * h_kv + h) * d_qk + d; }
  int64_t v_index(int64_t row, int h, int d) const { return (row * h_kv + h) * d_v + d; }
  int64_t o_index(int64_t row, int h, int d) const { return (row * h_q + h) * d_v + d; }
  int64_t b() const { return static_cast<int64_t>(cu_q.size()) - 1; }
};

Problem make_problem(const std::vector<int32_t>& lq, const std::vector<int32_t>& lk, int h_q, int h_kv, int d_qk,
                     int d_v, bool causal, uint64_t seed, DType dtype = DType::kBF16, int64_t extra = 2) {
  Problem p;
  for (size_t i = 0; i < lq.size(); ++i) {
    p.cu_q.push_back(p.cu_q.back() + lq[i]);
    p.cu_k.push_back(p.cu_k.back() + lk[i]);
    p.max_q = std::max(p.max_q, lq[i]);
    p.max_k = std::max(p.max_k, lk[i]);
  }
  p.rows_q = p.cu_q.back() + extra;
  p.rows_k = p.cu_k.back() + extra;
  p.h_q = h_q, p.h_kv = h_kv, p.d_qk = d_qk, p.d_v = d_v;
  p.dtype = dtype;
  p.causal = causal;
  p.q_pitch = d_qk + 8;
  const uint16_t nan = nan_half(dtype);
  p.q.assign(p.rows_q * h_q * p.q_pitch, nan);
  p.dout.assign(p.rows_q * h_q * d_v, nan);
  p.k.assign(p.rows_k * h_kv * d_qk, nan);
  p.v.assign(p.rows_k * h_kv * d_v, nan);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  for (int64_t r = 0; r < p.cu_q.back(); ++r) {
    for (int h = 0; h < h_q; ++h) {
      for (int d = 0; d < d_qk; ++d) p.q[p.q_index(r, h, d)] = to_half(normal(rng), dtype);
      for (int d = 0; d < d_v; ++d) p.dout[p.o_index(r, h, d)] = to_half(normal(rng), dtype);
    }
  }
  for (int64_t r = 0; r < p.cu_k.back(); ++r) {
    for (int h = 0; h < h_kv; ++h) {
      for (int d = 0; d < d_qk; ++d) p.k[p.k_index(r, h, d)] = to_half(normal(rng), dtype);
      for (int d = 0; d < d_v; ++d) p.v[p.v_index(r, h, d)] = to_half(normal(rng), dtype);
    }
  }
  return p;
}

// The reference forward's unrounded out and its lse (NaN where it writes nothing).
struct Forward {
  std::vector<float> out, lse;
};

// The inputs the forward and the backward share (q, k, v, sequences, options).
template <class Args>
void set_inputs(Problem& p, Args& a) {
  a.q = make_tensor(p.q.data(), p.dtype, {p.rows_q, p.h_q, p.d_qk}, {p.h_q * p.q_pitch, p.q_pitch, 1});
  a.k = make_tensor(p.k.data(), p.dtype, {p.rows_k, p.h_kv, p.d_qk});
  a.v = make_tensor(p.v.data(), p.dtype, {p.rows_k, p.h_kv, p.d_v});
  a.cu_seqlens_q = make_tensor(p.cu_q.data(), DType::kInt32, {p.b() + 1});
  a.cu_seqlens_k = make_tensor(p.cu_k.data(), DType::kInt32, {p.b() + 1});
  a.max_seqlen_q = p.max_q;
  a.max_seqlen_k = p.max_k;
  a.causal = p.causal;
  a.softmax_scale = p.scale;
}

Forward run_forward(Problem& p) {
  Forward f;
  f.out.assign(p.rows_q * p.h_q * p.d_v, NAN);
  f.lse.assign(p.h_q * p.rows_q, NAN);
  MhaPrefillArgs a;
  set_inputs(p, a);
  a.out = make_tensor(f.out.data(), DType::kFP32, {p.rows_q, p.h_q, p.d_v});
  a.lse = make_tensor(f.lse.data(), DType::kFP32, {p.h_q, p.rows_q});
  const Status s = reference::mha_prefill(a);
  EXPECT_TRUE(s.is_ok()) << s.to_string();
  return f;
}

// float32 gradients, poisoned with NaN; dk is a view of rows dk_pitch wide (padding NaN).
struct Grads {
  std::vector<float> dq, dk, dv;
  int64_t dk_pitch = 0;
};

Grads poisoned_grads(const Problem& p) {
  Grads g;
  g.dk_pitch = p.d_qk + 4;
  g.dq.assign(p.rows_q * p.h_q * p.d_qk, NAN);
  g.dk.assign(p.rows_k * p.h_kv * g.dk_pitch, NAN);
  g.dv.assign(p.rows_k * p.h_kv * p.d_v, NAN);
  return g;
}

float dq_at(const Problem& p, const Grads& g, int64_t row, int h, int d) { return g.dq[(row * p.h_q + h) * p.d_qk + d]; }
float dk_at(const Problem& p, const Grads& g, int64_t row, int h, int d) {
  return g.dk[(row * p.h_kv + h) * g.dk_pitch + d];
}
float dv_at(const Problem& p, const Grads& g, int64_t row, int h, int d) { return g.dv[p.v_index(row, h, d)]; }

MhaPrefillBackwardArgs backward_args(Problem& p, Forward& f, Grads& g) {
  MhaPrefillBackwardArgs a;
  set_inputs(p, a);
  a.dout = make_tensor(p.dout.data(), p.dtype, {p.rows_q, p.h_q, p.d_v});
  a.out = make_tensor(f.out.data(), DType::kFP32, {p.rows_q, p.h_q, p.d_v});
  a.lse = make_tensor(f.lse.data(), DType::kFP32, {p.h_q, p.rows_q});
  a.dq = make_tensor(g.dq.data(), DType::kFP32, {p.rows_q, p.h_q, p.d_qk});
  a.dk = make_tensor(g.dk.data(), DType::kFP32, {p.rows_k, p.h_kv, p.d_qk}, {p.h_kv * g.dk_pitch, g.dk_pitch, 1});
  a.dv = make_tensor(g.dv.data(), DType::kFP32, {p.rows_k, p.h_kv, p.d_v});
  return a;
}

Grads run_backward(Problem& p, Forward& f, int num_threads = 0) {
  Grads g = poisoned_grads(p);
  const Status s = reference::mha_prefill_backward(backward_args(p, f, g), num_threads);
  EXPECT_TRUE(s.is_ok()) << s.to_string();
  return g;
}

bool any_nonzero(int n, const std::function<float(int)>& at) {
  for (int i = 0; i < n; ++i) {
    if (at(i) != 0.f) return true;
  }
  return false;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// ---- The float64 forward the finite differences run on -------------------------------------

struct Inputs64 {
  std::vector<double> q, k, v, dout;  // the problem's inputs, same layouts
};

Inputs64 to_double(const Problem& p) {
  Inputs64 x;
  auto convert = [&](const std::vector<uint16_t>& h, std::vector<double>& d) {
    d.resize(h.size());
    for (size_t i = 0; i < h.size(); ++i) d[i] = from_half(h[i], p.dtype);
  };
  convert(p.q, x.q);
  convert(p.k, x.k);
  convert(p.v, x.v);
  convert(p.dout, x.dout);
  return x;
}

double scale_of(const Problem& p) {
  return p.scale ? *p.scale : 1.0f / std::sqrt(static_cast<float>(p.d_qk));  // the library's float
}

// L = sum(dout * out) over sequence i, out by the textbook softmax in float64.
double sequence_loss(const Problem& p, const Inputs64& x, int64_t i) {
  const int64_t q0 = p.cu_q[i], k0 = p.cu_k[i], lq = p.cu_q[i + 1] - q0, lk = p.cu_k[i + 1] - k0;
  const double scale = scale_of(p);
  double loss = 0;
  std::vector<double> w;
  for (int64_t t = 0; t < lq; ++t) {
    const int64_t last = p.causal ? std::min(lk - 1, t + lk - lq) : lk - 1;
    if (last < 0) continue;  // out 0
    for (int h = 0; h < p.h_q; ++h) {
      const int hk = h / (p.h_q / p.h_kv);
      w.assign(static_cast<size_t>(last + 1), 0.0);
      double m = -INFINITY, sum = 0;
      for (int64_t j = 0; j <= last; ++j) {
        for (int d = 0; d < p.d_qk; ++d) w[j] += x.q[p.q_index(q0 + t, h, d)] * x.k[p.k_index(k0 + j, hk, d)];
        w[j] *= scale;
        m = std::max(m, w[j]);
      }
      for (double& e : w) sum += (e = std::exp(e - m));
      for (int d = 0; d < p.d_v; ++d) {
        double o = 0;
        for (int64_t j = 0; j <= last; ++j) o += w[j] * x.v[p.v_index(k0 + j, hk, d)];
        loss += x.dout[p.o_index(q0 + t, h, d)] * (o / sum);
      }
    }
  }
  return loss;
}

int64_t sequence_of(const std::vector<int32_t>& cu, int64_t row) {
  for (size_t i = 0; i + 1 < cu.size(); ++i) {
    if (row >= cu[i] && row < cu[i + 1]) return static_cast<int64_t>(i);
  }
  return -1;
}

enum class Wrt { kQ, kK, kV };

// Checks dq, dk and dv (float32 outputs) against central differences of the float64 loss at
// one random column of `budget` (row, head) pairs per tensor, spread evenly over the rows inside
// sequences (all of them when there are at most `budget`). The inputs are exact in float64,
// out and lse are the reference forward's float32 values, so the reference's gradient is within
// ~1e-6 of the exact one; the differences (eps 1e-3) are within ~1e-9.
void expect_matches_finite_differences(const Problem& p, const Grads& g, uint64_t seed, int budget) {
  Inputs64 x = to_double(p);
  std::mt19937_64 rng(seed);
  constexpr double kEps = 1e-3, kRel = 1e-4, kFloor = 1e-2;  // |ref - fd| <= 1e-4 max(|fd|, 1e-2)
  for (Wrt wrt : {Wrt::kQ, Wrt::kK, Wrt::kV}) {
    const bool is_q = wrt == Wrt::kQ;
    const std::vector<int32_t>& cu = is_q ? p.cu_q : p.cu_k;
    const int heads = is_q ? p.h_q : p.h_kv, width = wrt == Wrt::kV ? p.d_v : p.d_qk;
    const int64_t pairs = int64_t{cu.back()} * heads;
    const int64_t step = std::max<int64_t>(1, (pairs + budget - 1) / budget);
    int checked = 0, nonzero = 0;
    for (int64_t pair = 0; pair < pairs; pair += step) {
      const int64_t row = pair / heads;
      const int h = static_cast<int>(pair % heads);
      const int d = static_cast<int>(rng() % static_cast<uint64_t>(width));
      std::vector<double>& input = is_q ? x.q : wrt == Wrt::kK ? x.k : x.v;
      const int64_t index = is_q ? p.q_index(row, h, d) : wrt == Wrt::kK ? p.k_index(row, h, d) : p.v_index(row, h, d);
      const int64_t seq = sequence_of(cu, row);
      const double x0 = input[index];
      input[index] = x0 + kEps;
      const double up = sequence_loss(p, x, seq);
      input[index] = x0 - kEps;
      const double down = sequence_loss(p, x, seq);
      input[index] = x0;
      const double fd = (up - down) / (2 * kEps);
      const double got = is_q ? dq_at(p, g, row, h, d) : wrt == Wrt::kK ? dk_at(p, g, row, h, d) : dv_at(p, g, row, h, d);
      ASSERT_NEAR(got, fd, kRel * std::max(std::abs(fd), kFloor))
          << (is_q ? "dq" : wrt == Wrt::kK ? "dk" : "dv") << " row " << row << " head " << h << " col " << d
          << " (sequence " << seq << ")";
      ++checked;
      nonzero += fd != 0;
    }
    EXPECT_GT(nonzero, checked / 3) << "too few nonzero gradients to mean anything";
  }
}

// Every output element inside a sequence written and finite, every one outside it (rows in no
// sequence, dk's padding) still the NaN poison.
void expect_written_exactly_inside(const Problem& p, const Grads& g) {
  for (int64_t r = 0; r < p.rows_q; ++r) {
    const bool inside = r < p.cu_q.back();
    for (int h = 0; h < p.h_q; ++h) {
      for (int d = 0; d < p.d_qk; ++d) {
        ASSERT_EQ(std::isnan(dq_at(p, g, r, h, d)), !inside) << "dq row " << r;
        if (inside) ASSERT_TRUE(std::isfinite(dq_at(p, g, r, h, d))) << "dq row " << r;
      }
    }
  }
  for (int64_t r = 0; r < p.rows_k; ++r) {
    const bool inside = r < p.cu_k.back();
    for (int h = 0; h < p.h_kv; ++h) {
      for (int64_t d = 0; d < g.dk_pitch; ++d) {
        const float x = g.dk[(r * p.h_kv + h) * g.dk_pitch + d];
        ASSERT_EQ(std::isnan(x), !inside || d >= p.d_qk) << "dk row " << r << " col " << d;
      }
      for (int d = 0; d < p.d_v; ++d) ASSERT_EQ(std::isnan(dv_at(p, g, r, h, d)), !inside) << "dv row " << r;
    }
  }
}

TEST(MhaPrefillBackwardReference, MatchesFiniteDifferencesForEveryHeadDimPair) {
  const int dims[][2] = {{64, 64}, {128, 128}, {192, 128}, {256, 256}};
  uint64_t seed = 1;
  for (const auto& dd : dims) {
    for (bool causal : {false, true}) {
      SCOPED_TRACE("d " + std::to_string(dd[0]) + "/" + std::to_string(dd[1]) + (causal ? " causal" : ""));
      // Lq < Lk, lengths 1 and 0 on either side, Lq > Lk (causal: queries that see nothing).
      Problem p = make_problem({5, 1, 0, 3, 4}, {7, 1, 3, 0, 2}, 4, 2, dd[0], dd[1], causal, seed++);
      Forward f = run_forward(p);
      Grads g = run_backward(p, f);
      expect_written_exactly_inside(p, g);
      expect_matches_finite_differences(p, g, seed++, /*budget=*/1000);
    }
  }
}

TEST(MhaPrefillBackwardReference, MatchesFiniteDifferencesInFp16WithAGivenScaleAndMqa) {
  Problem p = make_problem({4, 6}, {6, 3}, 4, 1, 128, 128, true, 11, DType::kFP16);
  p.scale = 0.3f;
  Forward f = run_forward(p);
  Grads g = run_backward(p, f);
  expect_written_exactly_inside(p, g);
  expect_matches_finite_differences(p, g, 12, 1000);
}

TEST(MhaPrefillBackwardReference, MatchesFiniteDifferencesOverSeveralKeyBlocks) {
  // 70 and 66 keys: the reference's key blocks of 64 end inside the sequences.
  for (bool causal : {false, true}) {
    Problem p = make_problem({3, 66}, {70, 66}, 2, 1, 64, 64, causal, 20 + causal);
    Forward f = run_forward(p);
    Grads g = run_backward(p, f, 3);
    expect_written_exactly_inside(p, g);
    expect_matches_finite_differences(p, g, 22, /*budget=*/40);
  }
}

TEST(MhaPrefillBackwardReference, CausalIsBottomRightAligned) {
  {
    // Lq 2, Lk 5: query 0 sees keys 0..3, query 1 all five. With dout of query 1 zero, key 4
    // (seen by query 1 only) gets dk = dv = 0 and key 3 does not; without causal it does too.
    Problem p = make_problem({2}, {5}, 1, 1, 64, 64, true, 30);
    for (int d = 0; d < 64; ++d) p.dout[p.o_index(1, 0, d)] = 0;
    Forward f = run_forward(p);
    Grads g = run_backward(p, f);
    for (int d = 0; d < 64; ++d) {
      EXPECT_EQ(dk_at(p, g, 4, 0, d), 0.f);
      EXPECT_EQ(dv_at(p, g, 4, 0, d), 0.f);
    }
    EXPECT_NE(dv_at(p, g, 3, 0, 0), 0.f);
    p.causal = false;
    f = run_forward(p);
    g = run_backward(p, f);
    EXPECT_NE(dv_at(p, g, 4, 0, 0), 0.f);
  }
  {
    // Lq 5, Lk 2: queries 0..2 see nothing (dq 0), query 3 key 0, query 4 both keys. With dout
    // of query 4 zero, key 1 gets dk = dv = 0.
    Problem p = make_problem({5}, {2}, 2, 1, 64, 64, true, 31);
    for (int h = 0; h < 2; ++h) {
      for (int d = 0; d < 64; ++d) p.dout[p.o_index(4, h, d)] = 0;
    }
    Forward f = run_forward(p);
    Grads g = run_backward(p, f);
    for (int h = 0; h < 2; ++h) {
      for (int d = 0; d < 64; ++d) {
        for (int t = 0; t < 3; ++t) EXPECT_EQ(dq_at(p, g, t, h, d), 0.f) << "query " << t;
        EXPECT_EQ(dq_at(p, g, 4, h, d), 0.f) << "dout 0, so dS 0";
      }
    }
    for (int d = 0; d < 64; ++d) {
      EXPECT_EQ(dk_at(p, g, 1, 0, d), 0.f);
      EXPECT_EQ(dv_at(p, g, 1, 0, d), 0.f);
    }
    // Key 0 is seen by query 3 (alone: its dq and its share of dk are 0, a softmax over one
    // key is constant) with dout nonzero.
    EXPECT_TRUE(any_nonzero(64, [&](int d) { return dv_at(p, g, 0, 0, d); }));
  }
}

// p with each kv head repeated h_kv / p.h_kv times.
Problem repeat_kv(const Problem& p, int h_kv) {
  Problem r = p;
  const int rep = h_kv / p.h_kv;
  r.h_kv = h_kv;
  r.k.assign(p.rows_k * h_kv * p.d_qk, 0);
  r.v.assign(p.rows_k * h_kv * p.d_v, 0);
  for (int64_t row = 0; row < p.rows_k; ++row) {
    for (int h = 0; h < h_kv; ++h) {
      for (int d = 0; d < p.d_qk; ++d) r.k[r.k_index(row, h, d)] = p.k[p.k_index(row, h / rep, d)];
      for (int d = 0; d < p.d_v; ++d) r.v[r.v_index(row, h, d)] = p.v[p.v_index(row, h / rep, d)];
    }
  }
  return r;
}

TEST(MhaPrefillBackwardReference, GqaSumsOverTheQueryHeadsOfAKvHead) {
  for (bool causal : {false, true}) {
    Problem one = make_problem({4, 3}, {5, 6}, 4, 1, 64, 64, causal, 40);
    Problem four = repeat_kv(one, 4);
    Forward f1 = run_forward(one), f4 = run_forward(four);
    ASSERT_TRUE(same_bits(f1.out, f4.out) && same_bits(f1.lse, f4.lse));
    Grads g1 = run_backward(one, f1), g4 = run_backward(four, f4);
    EXPECT_TRUE(same_bits(g1.dq, g4.dq)) << "dq does not depend on how k and v are shared";
    for (int64_t row = 0; row < one.cu_k.back(); ++row) {
      for (int d = 0; d < 64; ++d) {
        double dk_sum = 0, dk_abs = 0, dv_sum = 0, dv_abs = 0;
        for (int h = 0; h < 4; ++h) {
          dk_sum += dk_at(four, g4, row, h, d);
          dk_abs += std::abs(dk_at(four, g4, row, h, d));
          dv_sum += dv_at(four, g4, row, h, d);
          dv_abs += std::abs(dv_at(four, g4, row, h, d));
        }
        // Four float32 roundings against one.
        ASSERT_NEAR(dk_at(one, g1, row, 0, d), dk_sum, 1e-6 * dk_abs + 1e-12) << "key " << row;
        ASSERT_NEAR(dv_at(one, g1, row, 0, d), dv_sum, 1e-6 * dv_abs + 1e-12) << "key " << row;
      }
    }
  }
}

TEST(MhaPrefillBackwardReference, RowsThatSeeOrAreSeenByNothingAndRowsOutsideSequences) {
  // Sequence 0: queries without keys (dq 0); 1: keys without queries (dk = dv = 0); 2: causal
  // Lq 4 > Lk 2 (queries 0 and 1 see nothing); 3 rows of q and k in no sequence.
  Problem p = make_problem({3, 0, 4, 2}, {0, 3, 2, 2}, 2, 1, 64, 64, true, 50, DType::kBF16, /*extra=*/3);
  Forward f = run_forward(p);
  Grads g = run_backward(p, f);
  expect_written_exactly_inside(p, g);
  for (int h = 0; h < 2; ++h) {
    for (int d = 0; d < 64; ++d) {
      for (int64_t row : {0, 1, 2, 3, 4}) EXPECT_EQ(dq_at(p, g, row, h, d), 0.f) << "query row " << row;
    }
    // Row 6 sees two keys (row 5 sees one: dq 0, a softmax over one key is constant).
    EXPECT_TRUE(any_nonzero(64, [&](int d) { return dq_at(p, g, 6, h, d); })) << "head " << h;
  }
  for (int d = 0; d < 64; ++d) {
    for (int64_t row : {0, 1, 2}) {
      EXPECT_EQ(dk_at(p, g, row, 0, d), 0.f) << "key row " << row;
      EXPECT_EQ(dv_at(p, g, row, 0, d), 0.f) << "key row " << row;
    }
  }
  // The queries that see nothing contribute nothing: NaN in their q, dout, out and lse changes
  // no bit of any output.
  for (int64_t row : {0, 1, 2, 3, 4}) {
    for (int h = 0; h < 2; ++h) {
      for (int d = 0; d < 64; ++d) {
        p.q[p.q_index(row, h, d)] = nan_half(p.dtype);
        p.dout[p.o_index(row, h, d)] = nan_half(p.dtype);
        f.out[p.o_index(row, h, d)] = NAN;
      }
      f.lse[h * p.rows_q + row] = NAN;
    }
  }
  Grads again = run_backward(p, f);
  EXPECT_TRUE(same_bits(g.dq, again.dq) && same_bits(g.dk, again.dk) && same_bits(g.dv, again.dv));
}

TEST(MhaPrefillBackwardReference, RejectsEveryBadArgumentNamingIt) {
  Problem p = make_problem({3, 2}, {4, 2}, 4, 2, 128, 128, false, 60, DType::kBF16, 1);
  Forward f = run_forward(p);
  Grads g = poisoned_grads(p);
  const Grads poison = g;
  std::vector<int32_t> unordered = {0, 4, 3}, shifted = {1, 3, 6}, short_cu = {0, 4};
  std::vector<float> lse_t(f.lse.size());
  struct Bad {
    const char* what;
    std::function<void(MhaPrefillBackwardArgs&)> mutate;
    std::vector<std::string> parts;
    StatusCode code = StatusCode::kInvalidArgument;
  };
  const Bad table[] = {
      {"q dtype", [](auto& a) { a.q.dtype = DType::kFP32; }, {"q.dtype", "bf16 or fp16"}},
      {"k dtype", [](auto& a) { a.k.dtype = DType::kFP16; }, {"k.dtype", "bf16", "fp16"}},
      {"h_kv", [](auto& a) { a.k.shape[1] = 3; }, {"k.shape[1] (h_kv)", "divisor of h_q = 4"}},
      {"v rows", [](auto& a) { a.v.shape[0] -= 1; }, {"v.shape[0] (total_k)"}},
      {"head dims",
       [](auto& a) { a.v.shape[2] = 64; },
       {"(d_qk, d_v)", "(128, 64)"},
       StatusCode::kUnsupported},
      {"dout total_q", [](auto& a) { a.dout.shape[0] += 1; }, {"dout.shape[0] (total_q)", "expected 6"}},
      {"dout h_q", [](auto& a) { a.dout.shape[1] = 2; }, {"dout.shape[1] (h_q)", "expected 4"}},
      {"dout d_v", [](auto& a) { a.dout.shape[2] = 64; }, {"dout.shape[2] (d_v)", "expected 128"}},
      {"dout dtype", [](auto& a) { a.dout.dtype = DType::kFP16; }, {"dout.dtype", "expected bf16"}},
      {"dout float32", [](auto& a) { a.dout.dtype = DType::kFP32; }, {"dout.dtype", "expected bf16"}},
      {"dout rank", [](auto& a) { a.dout.rank = 2; }, {"dout", "rank 3"}},
      {"dout null", [](auto& a) { a.dout.data = nullptr; }, {"dout", "non-null pointer"}},
      {"dout stride", [](auto& a) { a.dout.stride[2] = 2; }, {"dout.stride[2]", "contiguous"}},
      {"out d_v", [](auto& a) { a.out.shape[2] = 64; }, {"out.shape[2] (d_v)"}},
      {"out dtype", [](auto& a) { a.out.dtype = DType::kFP16; }, {"out.dtype", "bf16 or float32"}},
      {"out null", [](auto& a) { a.out.data = nullptr; }, {"out", "non-null pointer"}},
      {"lse missing", [](auto& a) { a.lse = TensorRef{}; }, {"lse", "got none"}},
      {"lse dtype", [](auto& a) { a.lse.dtype = DType::kBF16; }, {"lse.dtype", "float32"}},
      {"lse h_q", [](auto& a) { a.lse.shape[0] = 3; }, {"lse.shape[0] (h_q)"}},
      {"lse total_q", [](auto& a) { a.lse.shape[1] = 5; }, {"lse.shape[1] (total_q)"}},
      {"lse rank", [](auto& a) { a.lse.rank = 3; }, {"lse", "rank 2"}},
      {"lse transposed",
       [&](auto& a) { a.lse = make_tensor(lse_t.data(), DType::kFP32, {4, 6}, {1, 4}); },
       {"lse.stride[1]", "contiguous"}},
      {"dq d_qk", [](auto& a) { a.dq.shape[2] = 64; }, {"dq.shape[2] (d_qk)"}},
      {"dq dtype", [](auto& a) { a.dq.dtype = DType::kInt32; }, {"dq.dtype", "bf16 or float32"}},
      {"dq zero stride", [](auto& a) { a.dq.stride[0] = 0; }, {"dq.stride[0]", "nonzero stride"}},
      {"dq over out", [&](auto& a) { a.dq.data = f.out.data(); }, {"dq: expected memory disjoint from out"}},
      {"dk total_k", [](auto& a) { a.dk.shape[0] += 1; }, {"dk.shape[0] (total_k)", "expected 7"}},
      {"dk h_kv", [](auto& a) { a.dk.shape[1] = 4; }, {"dk.shape[1] (h_kv)", "expected 2"}},
      {"dk dtype", [](auto& a) { a.dk.dtype = DType::kFP16; }, {"dk.dtype"}},
      {"dk null", [](auto& a) { a.dk.data = nullptr; }, {"dk", "non-null pointer"}},
      {"dk self-overlap", [](auto& a) { a.dk.stride[1] = 8; }, {"dk.stride[", "share an address"}},
      {"dv d_v", [](auto& a) { a.dv.shape[2] = 256; }, {"dv.shape[2] (d_v)"}},
      {"dv stride", [](auto& a) { a.dv.stride[2] = 0; }, {"dv.stride[2]", "contiguous"}},
      {"dv over dk", [](auto& a) { a.dv.data = a.dk.data; }, {"dv: expected memory disjoint from dk"}},
      {"dv over v", [](auto& a) { a.dv.data = a.v.data; }, {"dv: expected memory disjoint from"}},
      {"scale NaN", [](auto& a) { a.softmax_scale = NAN; }, {"softmax_scale", "finite"}},
      {"scale inf", [](auto& a) { a.softmax_scale = -INFINITY; }, {"softmax_scale", "finite"}},
      {"max_seqlen_q negative", [](auto& a) { a.max_seqlen_q = -1; }, {"max_seqlen_q", "expected >= 0"}},
      {"max_seqlen_k negative", [](auto& a) { a.max_seqlen_k = -5; }, {"max_seqlen_k", "expected >= 0"}},
      {"max_seqlen_k short", [](auto& a) { a.max_seqlen_k = 3; }, {"max_seqlen_k", "length 4"}},
      {"cu_seqlens_q unordered",
       [&](auto& a) { a.cu_seqlens_q = make_tensor(unordered.data(), DType::kInt32, {3}); },
       {"cu_seqlens_q[2]", "4 <= value <= 6", "got 3"}},
      {"cu_seqlens_k from 1",
       [&](auto& a) { a.cu_seqlens_k = make_tensor(shifted.data(), DType::kInt32, {3}); },
       {"cu_seqlens_k[0]", "expected 0", "got 1"}},
      {"cu_seqlens_k size",
       [&](auto& a) { a.cu_seqlens_k = make_tensor(short_cu.data(), DType::kInt32, {2}); },
       {"cu_seqlens_k.shape[0] (b + 1)", "expected 3"}},
      {"cu_seqlens_q dtype", [](auto& a) { a.cu_seqlens_q.dtype = DType::kFP32; }, {"cu_seqlens_q.dtype"}},
      {"cu_seqlens_q null", [](auto& a) { a.cu_seqlens_q.data = nullptr; }, {"cu_seqlens_q", "non-null"}},
  };
  {
    const Status ok = reference::mha_prefill_backward(backward_args(p, f, g));
    ASSERT_TRUE(ok.is_ok()) << "the unmutated arguments: " << ok.to_string();
  }
  for (const Bad& bad : table) {
    SCOPED_TRACE(bad.what);
    g = poison;
    MhaPrefillBackwardArgs a = backward_args(p, f, g);
    bad.mutate(a);
    const Status s = reference::mha_prefill_backward(a);
    std::vector<std::string> parts = bad.parts;
    parts.push_back("reference::mha_prefill_backward: ");
    EXPECT_TRUE(StatusIs(s, bad.code, parts));
    EXPECT_EQ(s.message().rfind("reference::mha_prefill_backward: ", 0), 0u) << s.message();
    EXPECT_TRUE(same_bits(g.dq, poison.dq) && same_bits(g.dk, poison.dk) && same_bits(g.dv, poison.dv))
        << "a rejected call wrote an output";
  }
}

TEST(MhaPrefillBackwardReference, EmptyProblemsReturnOkAndZeroOnlyTheKeysInsideSequences) {
  {
    // b = 0: nothing is read or written.
    Problem p = make_problem({}, {}, 2, 1, 64, 64, false, 70, DType::kBF16, 3);
    Forward f;
    f.out.assign(p.rows_q * p.h_q * p.d_v, NAN);
    f.lse.assign(p.h_q * p.rows_q, NAN);
    Grads g = poisoned_grads(p);
    const Grads poison = g;
    EXPECT_TRUE(reference::mha_prefill_backward(backward_args(p, f, g)).is_ok());
    EXPECT_TRUE(same_bits(g.dq, poison.dq) && same_bits(g.dk, poison.dk) && same_bits(g.dv, poison.dv));
  }
  {
    // total_q = 0 (the forward's empty problem), with null pointers for the tensors without
    // elements: the keys inside sequences get dk = dv = 0, the rest stays.
    Problem p = make_problem({0, 0}, {3, 2}, 2, 1, 64, 64, true, 71, DType::kBF16, 0);
    p.cu_k.push_back(p.cu_k.back());  // a third sequence, empty on both sides
    p.cu_q.push_back(0);
    p.rows_k += 2;  // two key rows in no sequence
    p.k.resize(p.rows_k * p.d_qk, nan_half(p.dtype));
    p.v.resize(p.rows_k * p.d_v, nan_half(p.dtype));
    Forward f;
    Grads g = poisoned_grads(p);
    MhaPrefillBackwardArgs a = backward_args(p, f, g);
    a.dout.data = a.q.data = a.out.data = a.lse.data = a.dq.data = nullptr;
    ASSERT_TRUE(reference::mha_prefill_backward(a).is_ok());
    for (int64_t row = 0; row < p.rows_k; ++row) {
      for (int d = 0; d < 64; ++d) {
        if (row < 5) {
          ASSERT_EQ(dk_at(p, g, row, 0, d), 0.f);
          ASSERT_EQ(dv_at(p, g, row, 0, d), 0.f);
        } else {
          ASSERT_TRUE(std::isnan(dk_at(p, g, row, 0, d)) && std::isnan(dv_at(p, g, row, 0, d)));
        }
      }
    }
  }
  {
    // h_q = 0 (h_kv 1 divides it): no query head, so every key row inside a sequence gets 0.
    Problem p = make_problem({2, 1}, {3, 2}, 0, 1, 64, 64, false, 72, DType::kBF16, 1);
    Forward f;
    Grads g = poisoned_grads(p);
    ASSERT_TRUE(reference::mha_prefill_backward(backward_args(p, f, g)).is_ok());
    for (int64_t row = 0; row < p.rows_k; ++row) {
      for (int d = 0; d < 64; ++d) {
        ASSERT_EQ(dk_at(p, g, row, 0, d) == 0.f, row < 5) << "key row " << row;
        ASSERT_EQ(dv_at(p, g, row, 0, d) == 0.f, row < 5) << "key row " << row;
      }
    }
  }
}

TEST(MhaPrefillBackwardReference, BitwiseIdenticalForAnyThreadCountAndRoundedOutputsMatch) {
  Problem p = make_problem({90, 0, 70, 5}, {100, 40, 70, 130}, 4, 2, 128, 128, true, 80);
  Forward f = run_forward(p);
  const Grads one = run_backward(p, f, 1);
  expect_written_exactly_inside(p, one);
  for (int threads : {2, 3, 8, 0}) {
    const Grads g = run_backward(p, f, threads);
    EXPECT_TRUE(same_bits(one.dq, g.dq) && same_bits(one.dk, g.dk) && same_bits(one.dv, g.dv))
        << threads << " threads";
  }
  // bf16 outputs (and a bf16 out) are the float32 results rounded to nearest even, bit for bit.
  std::vector<uint16_t> dq(p.rows_q * p.h_q * p.d_qk, 0xffff), dk(p.rows_k * p.h_kv * p.d_qk, 0xffff),
      dv(p.rows_k * p.h_kv * p.d_v, 0xffff);
  Grads g = poisoned_grads(p);
  MhaPrefillBackwardArgs a = backward_args(p, f, g);
  a.dq = make_tensor(dq.data(), DType::kBF16, {p.rows_q, p.h_q, p.d_qk});
  a.dk = make_tensor(dk.data(), DType::kBF16, {p.rows_k, p.h_kv, p.d_qk});
  a.dv = make_tensor(dv.data(), DType::kBF16, {p.rows_k, p.h_kv, p.d_v});
  ASSERT_TRUE(reference::mha_prefill_backward(a, 4).is_ok());
  for (int64_t r = 0; r < p.cu_q.back(); ++r) {
    for (int h = 0; h < p.h_q; ++h) {
      for (int d = 0; d < p.d_qk; ++d) {
        ASSERT_EQ(dq[(r * p.h_q + h) * p.d_qk + d], host::float_to_bf16(dq_at(p, one, r, h, d)));
      }
    }
  }
  for (int64_t r = 0; r < p.rows_k; ++r) {
    const bool inside = r < p.cu_k.back();
    for (int h = 0; h < p.h_kv; ++h) {
      for (int d = 0; d < p.d_qk; ++d) {
        ASSERT_EQ(dk[p.k_index(r, h, d)], inside ? host::float_to_bf16(dk_at(p, one, r, h, d)) : 0xffff);
      }
      for (int d = 0; d < p.d_v; ++d) {
        ASSERT_EQ(dv[p.v_index(r, h, d)], inside ? host::float_to_bf16(dv_at(p, one, r, h, d)) : 0xffff);
      }
    }
  }
  // A bf16 out is accepted too (what the GPU forward writes).
  std::vector<uint16_t> out16(f.out.size());
  for (size_t i = 0; i < out16.size(); ++i) out16[i] = host::float_to_bf16(f.out[i]);
  a.out = make_tensor(out16.data(), DType::kBF16, {p.rows_q, p.h_q, p.d_v});
  EXPECT_TRUE(reference::mha_prefill_backward(a).is_ok());
}

}  // namespace
}  // namespace mlakit
