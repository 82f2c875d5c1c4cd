// CPU reference of the sparse MLA prefill (docs/contract.md) against a naive natural-log
// formula: base-2 statistics, invalid and duplicate indices, rows with no valid index,
// strided views, topk_length, sinks, the natural-log option, and the validation paths.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "cpu_test_util.h"
#include "mlakit/mla_sparse_prefill.h"
#include "reference/host_numeric.h"

namespace mlakit {
namespace {

struct PrefillCase {
  int64_t s_q, s_kv;
  int h_q, d_qk, topk;
  int64_t q_pitch;  // >= d_qk: q rows as a view of a wider buffer
  std::vector<uint16_t> q, kv;
  std::vector<int32_t> indices, topk_length;
  std::vector<float> sink;
};

PrefillCase make_case(int64_t s_q, int64_t s_kv, int h_q, int d_qk, int topk, uint64_t seed) {
  PrefillCase c{s_q, s_kv, h_q, d_qk, topk, d_qk + 64, {}, {}, {}, {}, {}};
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  c.q.assign(s_q * h_q * c.q_pitch, 0x7fc0);  // NaN padding: must never be read
  for (int64_t r = 0; r < s_q * h_q; ++r) {
    for (int d = 0; d < d_qk; ++d) c.q[r * c.q_pitch + d] = host::float_to_bf16(std::clamp(normal(rng), -1.f, 1.f));
  }
  c.kv.resize(s_kv * d_qk);
  for (auto& x : c.kv) x = host::float_to_bf16(std::clamp(normal(rng) * 0.1f, -1.f, 1.f));
  std::uniform_int_distribution<int64_t> row(0, s_kv - 1);
  c.indices.resize(s_q * topk);
  for (size_t i = 0; i < c.indices.size(); ++i) {
    const int kind = static_cast<int>(i % 9);
    c.indices[i] = kind == 2 ? -1 : kind == 5 ? static_cast<int32_t>(s_kv + i % 3) : kind == 7 && i > 0
                                                                                         ? c.indices[i - 1]
                                                                                         : static_cast<int32_t>(row(rng));
  }
  for (int k = 0; k < topk; ++k) c.indices[k] = -1;  // token 0 has no valid index
  return c;
}

struct Outputs {
  std::vector<float> out, max_logits, lse;
};

MlaSparsePrefillArgs args_of(PrefillCase& c, Outputs& o) {
  o.out.assign(c.s_q * c.h_q * 512, NAN);
  o.max_logits.assign(c.s_q * c.h_q, NAN);
  o.lse.assign(c.s_q * c.h_q, NAN);
  MlaSparsePrefillArgs a;
  a.q = make_tensor(c.q.data(), DType::kBF16, {c.s_q, c.h_q, c.d_qk}, {c.h_q * c.q_pitch, c.q_pitch, 1});
  a.kv = make_tensor(c.kv.data(), DType::kBF16, {c.s_kv, 1, c.d_qk});
  a.indices = make_tensor(c.indices.data(), DType::kInt32, {c.s_q, 1, c.topk});
  if (!c.topk_length.empty()) a.topk_length = make_tensor(c.topk_length.data(), DType::kInt32, {c.s_q});
  if (!c.sink.empty()) a.attn_sink = make_tensor(c.sink.data(), DType::kFP32, {c.h_q});
  a.out = make_tensor(o.out.data(), DType::kFP32, {c.s_q, c.h_q, 512});
  a.max_logits = make_tensor(o.max_logits.data(), DType::kFP32, {c.s_q, c.h_q});
  a.lse = make_tensor(o.lse.data(), DType::kFP32, {c.s_q, c.h_q});
  return a;
}

void expect_matches_naive(const PrefillCase& c, const Outputs& o, double sm_scale, bool natural) {
  const double base = natural ? std::log(2.0) : 1.0;
  for (int64_t i = 0; i < c.s_q; ++i) {
    const int64_t count = c.topk_length.empty() ? c.topk : std::clamp<int64_t>(c.topk_length[i], 0, c.topk);
    for (int h = 0; h < c.h_q; ++h) {
      std::vector<double> z;
      std::vector<int64_t> rows;
      for (int64_t k = 0; k < count; ++k) {
        const int64_t r = c.indices[i * c.topk + k];
        if (r < 0 || r >= c.s_kv) continue;
        double dot = 0;
        for (int d = 0; d < c.d_qk; ++d) {
          dot += double(host::bf16_to_float(c.q[(i * c.h_q + h) * c.q_pitch + d])) * host::bf16_to_float(c.kv[r * c.d_qk + d]);
        }
        z.push_back(dot * sm_scale);
        rows.push_back(r);
      }
      const int64_t at = i * c.h_q + h;
      if (z.empty()) {
        ASSERT_TRUE(std::isinf(o.lse[at]) && o.lse[at] > 0);
        ASSERT_TRUE(std::isinf(o.max_logits[at]) && o.max_logits[at] < 0);
        for (int d = 0; d < 512; ++d) ASSERT_EQ(o.out[at * 512 + d], 0.f);
        continue;
      }
      double m = -INFINITY, sum = 0;
      for (double v : z) m = std::max(m, v);
      for (double v : z) sum += std::exp(v - m);
      const double lse_e = m + std::log(sum);
      // base 2: lse2 = lse_e / ln 2, max2 = m / ln 2; natural: the natural values.
      ASSERT_NEAR(o.lse[at], lse_e / std::log(2.0) * base, 1e-5 * std::max(1.0, std::fabs(lse_e)));
      ASSERT_NEAR(o.max_logits[at], m / std::log(2.0) * base, 1e-5 * std::max(1.0, std::fabs(m)));
      const double factor = c.sink.empty() ? 1.0 : 1.0 / (1.0 + std::exp(c.sink[h] - lse_e));
      for (int d = 0; d < 512; ++d) {
        double v = 0;
        for (size_t j = 0; j < z.size(); ++j) v += std::exp(z[j] - lse_e) * host::bf16_to_float(c.kv[rows[j] * c.d_qk + d]);
        ASSERT_NEAR(o.out[at * 512 + d], v * factor, 1e-6 + 1e-5 * std::fabs(v)) << "token " << i << " head " << h;
      }
    }
  }
}

TEST(SparsePrefillReference, MatchesNaiveFormula) {
  int seed = 0;
  for (auto [s_q, s_kv, h_q, d_qk, topk] : std::vector<std::tuple<int, int, int, int, int>>{
           {1, 32, 16, 576, 64}, {62, 300, 16, 512, 128}, {13, 40, 64, 576, 64}}) {
    PrefillCase c = make_case(s_q, s_kv, h_q, d_qk, topk, ++seed);
    Outputs o;
    ASSERT_TRUE(reference::mla_sparse_prefill(args_of(c, o)));
    expect_matches_naive(c, o, 1.0 / std::sqrt(double(d_qk)), false);
  }
}

TEST(SparsePrefillReference, TopkLengthSinkAndNaturalLog) {
  PrefillCase c = make_case(7, 100, 4, 576, 64, 42);
  c.topk_length = {64, 10, 0, 70, 1, 33, 64};
  c.sink = {-2.f, 0.f, 1.f, 4.f};
  Outputs o;
  MlaSparsePrefillArgs a = args_of(c, o);
  a.sm_scale = 0.25f;
  a.lse_base = LseBase::kNatural;
  ASSERT_TRUE(reference::mla_sparse_prefill(a));
  expect_matches_naive(c, o, 0.25f, true);
}

TEST(SparsePrefillReference, ValidationErrors) {
  PrefillCase c = make_case(3, 50, 16, 576, 64, 3);
  Outputs o;
  using testing::IsInvalid;
  using testing::StatusIs;
  MlaSparsePrefillArgs a = args_of(c, o);
  a.kv = make_tensor(c.kv.data(), DType::kBF16, {25, 2, 576});
  EXPECT_TRUE(IsInvalid(reference::mla_sparse_prefill(a), {"kv.shape[1] (h_kv)", "expected 1", "got 2"}));
  a = args_of(c, o);
  a.q = make_tensor(c.q.data(), DType::kBF16, {3, 16, 192});
  EXPECT_TRUE(StatusIs(reference::mla_sparse_prefill(a), StatusCode::kUnsupported, {"d_qk", "576 or 512", "got 192"}));
  a = args_of(c, o);
  a.indices = make_tensor(c.indices.data(), DType::kInt32, {3, 1, 0});
  EXPECT_TRUE(IsInvalid(reference::mla_sparse_prefill(a), {"topk", "got 0"}));
  a = args_of(c, o);
  a.max_logits = make_tensor(o.max_logits.data(), DType::kFP32, {16, 3});
  EXPECT_TRUE(IsInvalid(reference::mla_sparse_prefill(a), {"max_logits.shape[0] (s_q)", "expected 3", "got 16"}));
  a = args_of(c, o);
  a.d_v = 448;
  EXPECT_TRUE(StatusIs(reference::mla_sparse_prefill(a), StatusCode::kUnsupported, {"d_v", "expected 512", "got 448"}));
  a = args_of(c, o);
  a.lse_base = static_cast<LseBase>(5);
  EXPECT_TRUE(IsInvalid(reference::mla_sparse_prefill(a), {"lse_base", "got 5"}));
  std::vector<float> sink(3);
  a = args_of(c, o);
  a.attn_sink = make_tensor(sink.data(), DType::kFP32, {3});
  EXPECT_TRUE(IsInvalid(reference::mla_sparse_prefill(a), {"attn_sink.shape[0] (h_q)", "expected 16", "got 3"}));
}

}  // namespace
}  // namespace mlakit
