// CPU reference of the dense MHA prefill (include/mlakit/mha_prefill.h) against a naive
// formula written here: varlen batches with empty sequences, causal bottom-right alignment
// (Lq > Lk leaves rows with no key), GQA head mapping, every head-dim pair, strided q views
// with NaN padding, fp16, and the validation of shapes, options and prefix sums.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "cpu_test_util.h"
#include "mlakit/mha_prefill.h"
#include "reference/host_numeric.h"

namespace mlakit {
namespace {

using mlakit::testing::IsInvalid;
using mlakit::testing::StatusIs;

struct Case {
  std::vector<int32_t> cu_q, cu_k;
  int h_q, h_kv, d_qk, d_v;
  DType dtype = DType::kBF16;
  int64_t q_pitch;  // >= d_qk: q rows as a view of a wider (NaN-padded) buffer
  std::vector<uint16_t> q, k, v;
  int64_t total_q() const { return cu_q.back(); }
  int64_t total_k() const { return cu_k.back(); }
};

uint16_t to_half(float x, DType dt) { return dt == DType::kBF16 ? host::float_to_bf16(x) : host::float_to_fp16(x); }

Case make_case(std::vector<int32_t> lq, std::vector<int32_t> lk, int h_q, int h_kv, int d_qk, int d_v,
               uint64_t seed, DType dtype = DType::kBF16) {
  Case c{{0}, {0}, h_q, h_kv, d_qk, d_v, dtype, d_qk + 8, {}, {}, {}};
  for (size_t i = 0; i < lq.size(); ++i) {
    c.cu_q.push_back(c.cu_q.back() + lq[i]);
    c.cu_k.push_back(c.cu_k.back() + lk[i]);
  }
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  c.q.assign(c.total_q() * h_q * c.q_pitch, dtype == DType::kBF16 ? 0x7fc0 : 0x7e00);  // NaN padding
  for (int64_t r = 0; r < c.total_q() * h_q; ++r) {
    for (int d = 0; d < d_qk; ++d) c.q[r * c.q_pitch + d] = to_half(normal(rng), dtype);
  }
  c.k.resize(c.total_k() * h_kv * d_qk);
  for (auto& x : c.k) x = to_half(normal(rng), dtype);
  c.v.resize(c.total_k() * h_kv * d_v);
  for (auto& x : c.v) x = to_half(normal(rng), dtype);
  return c;
}

struct Outputs {
  std::vector<float> out, lse;
};

MhaPrefillArgs args_of(Case& c, Outputs& o, bool causal) {
  o.out.assign(c.total_q() * c.h_q * c.d_v, NAN);
  o.lse.assign(c.h_q * c.total_q(), NAN);
  MhaPrefillArgs a;
  a.q = make_tensor(c.q.data(), c.dtype, {c.total_q(), c.h_q, c.d_qk}, {c.h_q * c.q_pitch, c.q_pitch, 1});
  a.k = make_tensor(c.k.data(), c.dtype, {c.total_k(), c.h_kv, c.d_qk});
  a.v = make_tensor(c.v.data(), c.dtype, {c.total_k(), c.h_kv, c.d_v});
  const int64_t b1 = static_cast<int64_t>(c.cu_q.size());
  a.cu_seqlens_q = make_tensor(c.cu_q.data(), DType::kInt32, {b1});
  a.cu_seqlens_k = make_tensor(c.cu_k.data(), DType::kInt32, {b1});
  for (size_t i = 0; i + 1 < c.cu_q.size(); ++i) {
    a.max_seqlen_q = std::max(a.max_seqlen_q, c.cu_q[i + 1] - c.cu_q[i]);
    a.max_seqlen_k = std::max(a.max_seqlen_k, c.cu_k[i + 1] - c.cu_k[i]);
  }
  a.causal = causal;
  a.out = make_tensor(o.out.data(), DType::kFP32, {c.total_q(), c.h_q, c.d_v});
  a.lse = make_tensor(o.lse.data(), DType::kFP32, {c.h_q, c.total_q()});
  return a;
}

float value(const Case& c, const std::vector<uint16_t>& x, int64_t i) {
  return c.dtype == DType::kBF16 ? host::bf16_to_float(x[i]) : host::fp16_to_float(x[i]);
}

// out and lse of every row by the textbook formula (max-free: logits here are small).
void expect_matches_formula(const Case& c, const Outputs& o, bool causal, double scale) {
  const int group = c.h_q / c.h_kv;
  for (size_t s = 0; s + 1 < c.cu_q.size(); ++s) {
    const int64_t lq = c.cu_q[s + 1] - c.cu_q[s], lk = c.cu_k[s + 1] - c.cu_k[s];
    for (int64_t t = 0; t < lq; ++t) {
      for (int h = 0; h < c.h_q; ++h) {
        const int hk = h / group;
        std::vector<double> w;
        for (int64_t j = 0; j < lk; ++j) {
          if (causal && j > t + lk - lq) break;
          double dot = 0;
          for (int d = 0; d < c.d_qk; ++d) {
            dot += double(value(c, c.q, ((c.cu_q[s] + t) * c.h_q + h) * c.q_pitch + d)) *
                   value(c, c.k, ((c.cu_k[s] + j) * c.h_kv + hk) * c.d_qk + d);
          }
          w.push_back(std::exp(dot * scale));
        }
        double sum = 0;
        for (double x : w) sum += x;
        const int64_t row = c.cu_q[s] + t;
        const float lse = o.lse[h * c.total_q() + row];
        if (w.empty()) {
          EXPECT_EQ(lse, INFINITY) << "seq " << s << " row " << t << " head " << h;
        } else {
          EXPECT_NEAR(lse, std::log(sum), 1e-4 * std::max(1.0, std::abs(std::log(sum))));
        }
        for (int d = 0; d < c.d_v; ++d) {
          double want = 0;
          for (size_t j = 0; j < w.size(); ++j) {
            want += w[j] / sum * value(c, c.v, ((c.cu_k[s] + static_cast<int64_t>(j)) * c.h_kv + hk) * c.d_v + d);
          }
          ASSERT_NEAR(o.out[(row * c.h_q + h) * c.d_v + d], want, 1e-5) << "seq " << s << " row " << t << " d " << d;
        }
      }
    }
  }
}

TEST(MhaPrefillReference, MatchesTheFormulaOnVarlenBatchesForEveryHeadDimPair) {
  const int dims[][2] = {{64, 64}, {128, 128}, {192, 128}, {256, 256}};
  uint64_t seed = 1;
  for (const auto& dd : dims) {
    for (bool causal : {false, true}) {
      // Lengths 0 on either side, Lq < Lk, Lq == Lk, Lq > Lk (causal: rows that see nothing).
      Case c = make_case({3, 0, 5, 4, 1}, {7, 2, 5, 0, 1}, 4, 2, dd[0], dd[1], seed++);
      Outputs o;
      MhaPrefillArgs a = args_of(c, o, causal);
      ASSERT_TRUE(reference::mha_prefill(a).is_ok());
      expect_matches_formula(c, o, causal, 1.0 / std::sqrt(double(dd[0])));
    }
  }
}

TEST(MhaPrefillReference, GqaRatiosFp16AndAGivenScale) {
  for (int h_kv : {1, 2, 8}) {
    Case c = make_case({6, 9}, {9, 6}, 8, h_kv, 64, 64, 10 + h_kv, DType::kFP16);
    Outputs o;
    MhaPrefillArgs a = args_of(c, o, true);
    a.softmax_scale = 0.3f;
    ASSERT_TRUE(reference::mha_prefill(a).is_ok());
    expect_matches_formula(c, o, true, 0.3f);
  }
}

TEST(MhaPrefillReference, CausalIsBottomRightAligned) {
  // One sequence, Lq 2, Lk 5: query 0 sees keys 0..3, query 1 all 5. With every value of
  // key 4 equal to 1 and the others 0, only query 1 has it in its average.
  Case c = make_case({2}, {5}, 1, 1, 64, 64, 20);
  for (int d = 0; d < 64; ++d) {
    for (int j = 0; j < 5; ++j) c.v[j * 64 + d] = host::float_to_bf16(j == 4 ? 1.f : 0.f);
  }
  Outputs o;
  MhaPrefillArgs a = args_of(c, o, true);
  ASSERT_TRUE(reference::mha_prefill(a).is_ok());
  EXPECT_EQ(o.out[0], 0.f);
  EXPECT_GT(o.out[64], 0.f);
}

TEST(MhaPrefillReference, RowsOutsideEverySequenceAreLeftAlone) {
  Case c = make_case({2, 2}, {3, 3}, 2, 1, 64, 64, 21);
  Outputs o;
  MhaPrefillArgs a = args_of(c, o, false);
  c.cu_q.back() = 3;  // the last of the 4 query rows now belongs to no sequence
  ASSERT_TRUE(reference::mha_prefill(a).is_ok());
  EXPECT_TRUE(std::isnan(o.out[3 * 2 * 64])) << "row 3 is in no sequence";
  EXPECT_FALSE(std::isnan(o.out[2 * 2 * 64]));
}

TEST(MhaPrefillReference, RejectsBadArgumentsNamingThem) {
  Case c = make_case({3, 2}, {4, 2}, 4, 2, 128, 128, 30);
  Outputs o;
  auto fresh = [&] { return args_of(c, o, false); };
  MhaPrefillArgs a = fresh();
  a.k.shape[1] = 3;
  EXPECT_TRUE(IsInvalid(reference::mha_prefill(a), {"k.shape[1] (h_kv)", "divisor of h_q = 4", "3"}));
  a = fresh();
  a.v.dtype = DType::kFP16;
  EXPECT_TRUE(IsInvalid(reference::mha_prefill(a), {"v"}));
  a = fresh();
  a.v.shape[2] = 64;
  a.out.shape[2] = 64;
  EXPECT_TRUE(StatusIs(reference::mha_prefill(a), StatusCode::kUnsupported, {"(d_qk, d_v)", "(128, 64)"}));
  a = fresh();
  a.softmax_scale = NAN;
  EXPECT_TRUE(IsInvalid(reference::mha_prefill(a), {"softmax_scale"}));
  a = fresh();
  a.max_seqlen_q = 2;
  EXPECT_TRUE(IsInvalid(reference::mha_prefill(a), {"max_seqlen_q", "length 3"}));
  a = fresh();
  a.lse.shape[0] = 3;
  EXPECT_TRUE(IsInvalid(reference::mha_prefill(a), {"lse"}));
  std::vector<int32_t> bad = {0, 4, 3};
  a = fresh();
  a.cu_seqlens_q = make_tensor(bad.data(), DType::kInt32, {3});
  EXPECT_TRUE(IsInvalid(reference::mha_prefill(a), {"cu_seqlens_q[2]", "4 <= value <= 5", "got 3"}));
  std::vector<int32_t> shifted = {1, 3, 5};
  a = fresh();
  a.cu_seqlens_k = make_tensor(shifted.data(), DType::kInt32, {3});
  EXPECT_TRUE(IsInvalid(reference::mha_prefill(a), {"cu_seqlens_k[0]", "expected 0", "got 1"}));
  a = fresh();
  a.out = a.q;  // out aliasing an input
  EXPECT_FALSE(reference::mha_prefill(a).is_ok());
}

// The GPU entry points' own checks, which run before any device is looked for: the workspace
// query names itself, and the row-alignment rule reads the strides of an empty q (any
// value, here one whose byte product overflows int64) without arithmetic on them.
TEST(MhaPrefillEntry, WorkspaceSizeNamesItselfAndEmptyTensorsNeedNoAlignment) {
  Case c = make_case({3, 2}, {4, 2}, 4, 2, 128, 128, 31);
  Outputs o;
  MhaPrefillArgs a = args_of(c, o, false);
  a.v.dtype = DType::kFP16;
  std::size_t bytes = 1;
  const Status s = mha_prefill_workspace_size(a, &bytes);
  EXPECT_TRUE(IsInvalid(s, {"mha_prefill_workspace_size: "}));
  EXPECT_EQ(bytes, 1u);

  Case e = make_case({0}, {3}, 2, 1, 64, 64, 32);
  a = args_of(e, o, false);
  std::vector<uint16_t> out16(1);
  a.out = make_tensor(out16.data(), DType::kBF16, {0, 2, 64});
  a.lse = TensorRef{};
  a.q.stride[0] = int64_t{6648785679721042964};
  const Status r = mha_prefill(a, nullptr, 0, nullptr);  // no GPU or host pointers: an error, never about q
  EXPECT_FALSE(r.is_ok());
  EXPECT_EQ(r.message().find("aligned"), std::string::npos) << r.message();
}

TEST(MhaPrefillReference, AnEmptyBatchOrNoQueryRowsWritesNothing) {
  Case c = make_case({0, 0}, {3, 0}, 2, 1, 64, 64, 40);
  Outputs o;
  MhaPrefillArgs a = args_of(c, o, false);
  EXPECT_TRUE(reference::mha_prefill(a).is_ok());
  std::vector<int32_t> one = {0};
  a.cu_seqlens_q = a.cu_seqlens_k = make_tensor(one.data(), DType::kInt32, {1});
  EXPECT_TRUE(reference::mha_prefill(a).is_ok());
}

}  // namespace
}  // namespace mlakit
