// CPU reference of the sparse decode over DeepSeek V4 tokens (d_qk 512, 584-byte cache) and
// with a second cache (docs/contract.md): against a naive formula over the dequantized caches
// (the union of both token lists under one softmax), the second cache against one cache
// listing the same tokens, and the validation of every new argument.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "cpu_test_util.h"
#include "mlakit/mla_sparse_decode.h"
#include "reference/host_numeric.h"
#include "support/sparse_decode_case.h"

namespace mlakit {
namespace {

using support::HostSparseCache;
using support::HostSparseCase;
using support::SparseCaseSpec;

struct Result {
  std::vector<float> out, lse;
};

Result run(HostSparseCase& c) {
  const support::SparseReferenceResult r = support::run_sparse_reference(c);
  return Result{r.out, r.lse};
}

// The valid tokens a row counts in one cache, as (cache, slot) pairs.
void collect(const HostSparseCache& cache, const SparseCaseSpec& s, int64_t i, int t,
             std::vector<std::pair<const HostSparseCache*, int64_t>>* keys) {
  if (cache.topk == 0) return;
  const int64_t count = cache.lengths.empty() ? cache.topk : std::clamp<int64_t>(cache.lengths[i], 0, cache.topk);
  for (int64_t k = 0; k < count; ++k) {
    const int64_t slot = cache.indices[(i * s.s_q + t) * cache.topk + k];
    if (slot >= 0 && slot < cache.tokens()) keys->push_back({&cache, slot});
  }
}

// Naive: softmax over the union of both caches' valid listed tokens, then the sink.
void expect_matches_naive(const HostSparseCase& hc, const Result& r, double scale) {
  const SparseCaseSpec& c = hc.spec;
  const int d_qk = hc.d_qk();
  for (int64_t i = 0; i < c.b; ++i) {
    for (int t = 0; t < c.s_q; ++t) {
      std::vector<std::pair<const HostSparseCache*, int64_t>> keys;
      collect(hc.main, c, i, t, &keys);
      collect(hc.extra, c, i, t, &keys);
      auto key = [&](size_t j, int d) {
        return double(host::bf16_to_float(keys[j].first->dequantized[keys[j].second * d_qk + d]));
      };
      for (int h = 0; h < c.h_q; ++h) {
        const float got_lse = r.lse[(i * c.h_q + h) * c.s_q + t];
        const float* got = &r.out[((i * c.s_q + t) * c.h_q + h) * 512];
        if (keys.empty()) {
          ASSERT_TRUE(std::isinf(got_lse) && got_lse > 0) << "row without valid index: lse " << got_lse;
          for (int d = 0; d < 512; ++d) ASSERT_EQ(got[d], 0.f);
          continue;
        }
        std::vector<double> z;
        for (size_t j = 0; j < keys.size(); ++j) {
          double dot = 0;
          for (int d = 0; d < d_qk; ++d) {
            dot += double(host::bf16_to_float(hc.q[((i * c.s_q + t) * c.h_q + h) * d_qk + d])) * key(j, d);
          }
          z.push_back(dot * scale);
        }
        double m = -INFINITY, sum = 0;
        for (double v : z) m = std::max(m, v);
        for (double v : z) sum += std::exp(v - m);
        const double ref_lse = m + std::log(sum);
        ASSERT_NEAR(got_lse, ref_lse, 1e-5 * std::max(1.0, std::fabs(ref_lse)));
        const double factor = c.with_sink ? 1.0 / (1.0 + std::exp(hc.sink[h] - ref_lse)) : 1.0;
        for (int d = 0; d < 512; ++d) {  // V: the first 512 values (V4: the whole row, RoPE included)
          double o = 0;
          for (size_t j = 0; j < z.size(); ++j) o += std::exp(z[j] - ref_lse) * key(j, d);
          ASSERT_NEAR(got[d], o * factor, 1e-6 + 1e-5 * std::fabs(o)) << "seq " << i << " t " << t << " h " << h << " d " << d;
        }
      }
    }
  }
}

TEST(SparseDecodeV4Reference, MatchesNaiveFormula) {
  uint64_t seed = 0;
  for (auto [b, s_q, h_q, topk, blocks, page] : std::vector<std::tuple<int, int, int, int, int, int>>{
           {1, 1, 1, 64, 3, 53}, {3, 2, 16, 128, 4, 64}, {2, 3, 4, 64, 200, 1}, {2, 1, 8, 64, 2, 69}}) {
    HostSparseCase c = support::make_sparse_case({.b = b, .s_q = s_q, .h_q = h_q, .topk = topk, .num_blocks = blocks,
                                                  .page_size = page, .seed = ++seed, .v4 = true});
    support::poison_unlisted_tokens(c);  // NaN in every byte no counted index lists
    expect_matches_naive(c, run(c), 1.0 / std::sqrt(512.0));
  }
}

TEST(SparseDecodeV4Reference, SecondCacheOfBothLayoutsWithLengthsAndSink) {
  uint64_t seed = 40;
  for (const bool v4 : {false, true}) {
    for (auto [main_page, extra_page, with_lengths] :
         std::vector<std::tuple<int, int, bool>>{{64, 2, false}, {61, 64, true}, {1, 576, true}}) {
      SCOPED_TRACE(::testing::Message() << "v4 " << v4 << " pages " << main_page << "/" << extra_page);
      HostSparseCase c = support::make_sparse_case({.b = 3, .s_q = 2, .h_q = 8, .topk = 64,
                                                    .num_blocks = 256 / main_page + 2, .page_size = main_page,
                                                    .with_topk_length = with_lengths, .with_sink = true,
                                                    .softmax_scale = 0.07f, .seed = ++seed, .v4 = v4,
                                                    .extra_topk = 128, .extra_num_blocks = 512 / extra_page + 1,
                                                    .extra_page_size = extra_page,
                                                    .with_extra_topk_length = with_lengths});
      if (with_lengths) {
        c.main.lengths = {0, 64, 70};   // none, all, past topk (clamped)
        c.extra.lengths = {0, 5, 128};  // row 0: no key in either cache
      }
      support::poison_unlisted_tokens(c);
      expect_matches_naive(c, run(c), 0.07f);
    }
  }
}

// A second cache holding the same bytes as the first, listing the second half of a token list,
// gives the one-cache decode of the whole list.
TEST(SparseDecodeV4Reference, SecondCacheEqualsOneConcatenatedList) {
  for (const bool v4 : {false, true}) {
    HostSparseCase one = support::make_sparse_case(
        {.b = 2, .s_q = 2, .h_q = 4, .topk = 128, .num_blocks = 5, .page_size = 64, .seed = 9, .v4 = v4});
    HostSparseCase two = one;
    two.spec.topk = 64;
    two.spec.extra_topk = 64;
    two.spec.extra_num_blocks = 5;
    two.spec.extra_page_size = 64;
    two.extra = one.main;
    two.main.topk = two.extra.topk = 64;
    two.main.indices.clear();
    two.extra.indices.clear();
    for (size_t r = 0; r < one.main.indices.size() / 128; ++r) {
      const auto row = one.main.indices.begin() + static_cast<std::ptrdiff_t>(r * 128);
      two.main.indices.insert(two.main.indices.end(), row, row + 64);
      two.extra.indices.insert(two.extra.indices.end(), row + 64, row + 128);
    }
    const Result a = run(one), b = run(two);
    for (size_t i = 0; i < a.out.size(); ++i) ASSERT_NEAR(a.out[i], b.out[i], 1e-6) << "v4 " << v4 << " " << i;
    for (size_t i = 0; i < a.lse.size(); ++i) {
      if (std::isinf(a.lse[i])) {
        ASSERT_EQ(a.lse[i], b.lse[i]) << "v4 " << v4 << " " << i;  // a row without keys: +inf on both
      } else {
        ASSERT_NEAR(a.lse[i], b.lse[i], 1e-6) << "v4 " << v4 << " " << i;
      }
    }
  }
}

TEST(SparseDecodeV4Reference, ValidationErrors) {
  HostSparseCase c = support::make_sparse_case({.b = 2, .s_q = 1, .h_q = 4, .topk = 64, .num_blocks = 2,
                                                .page_size = 16, .seed = 3, .v4 = true, .extra_topk = 32,
                                                .extra_num_blocks = 3, .extra_page_size = 8,
                                                .with_extra_topk_length = true});
  c.extra.lengths = {1, 2};
  std::vector<float> out(c.out_elems()), lse(c.lse_elems());
  using testing::IsInvalid;
  auto base = [&] {
    MlaSparseDecodeArgs a = c.args(c.q.data(), c.main.bytes.data(), c.main.indices.data(), nullptr, nullptr,
                                   out.data(), DType::kFP32, lse.data());
    c.with_extra(&a, c.extra.bytes.data(), c.extra.indices.data(), c.extra.lengths.data());
    return a;
  };
  ASSERT_TRUE(reference::mla_sparse_decode_fp8(base()));
  auto expect_invalid = [](const MlaSparseDecodeArgs& a, const std::vector<std::string>& words) {
    EXPECT_TRUE(IsInvalid(reference::mla_sparse_decode_fp8(a), words));
  };
  MlaSparseDecodeArgs a = base();
  a.q.shape[3] = 448;
  expect_invalid(a, {"q.shape[3] (d_qk)", "576", "512", "got 448"});
  a = base();  // a V3.2 cache with V4's q
  a.kv_cache = make_tensor(c.main.bytes.data(), DType::kUInt8, {2, 16, 1, 656});
  expect_invalid(a, {"kv_cache.shape[3]", "expected 584", "got 656"});
  a = base();
  a.kv_cache.stride[1] = 576;
  expect_invalid(a, {"kv_cache.stride[1]", "expected 584", "got 576"});
  a = base();
  a.kv_cache.stride[0] = 16 * 584 - 16;
  expect_invalid(a, {"kv_cache.stride[0]", "page_size * 584"});
  a = base();
  a.kv_cache.stride[0] = c.main.block_bytes + 8;
  expect_invalid(a, {"kv_cache.stride[0]", "multiple of 16"});
  a = base();
  a.extra_kv_cache.stride[1] = 656;
  expect_invalid(a, {"extra_kv_cache.stride[1]", "expected 584"});
  a = base();
  a.extra_indices = TensorRef{};
  expect_invalid(a, {"extra_indices", "come together"});
  a = base();
  a.extra_kv_cache = TensorRef{};
  expect_invalid(a, {"extra_kv_cache", "come together"});
  a = base();
  a.extra_kv_cache = TensorRef{};
  a.extra_indices = TensorRef{};
  expect_invalid(a, {"extra_topk_length", "expected none"});
  a = base();
  a.extra_indices.shape[1] = 2;
  expect_invalid(a, {"extra_indices.shape[1] (s_q)", "expected 1", "got 2"});
  a = base();
  a.extra_indices.dtype = DType::kUInt8;
  expect_invalid(a, {"extra_indices.dtype"});
  a = base();
  a.extra_indices.shape[2] = 0;
  expect_invalid(a, {"extra_indices.shape[2] (extra_topk)", "1 <= extra_topk"});
  a = base();
  a.extra_topk_length.shape[0] = 3;
  expect_invalid(a, {"extra_topk_length.shape[0] (b)", "expected 2", "got 3"});
  a = base();  // an output over the second cache's indices
  a.lse = make_tensor(c.extra.indices.data(), DType::kFP32, {2, 4, 1});
  expect_invalid(a, {"lse", "extra_indices"});
}

}  // namespace
}  // namespace mlakit
