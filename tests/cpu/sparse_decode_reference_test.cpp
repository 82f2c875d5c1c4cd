// CPU reference of the token-sparse FP8 MLA decode (docs/contract.md): against a naive formula
// over the dequantized cache, against the dense reference when the indices list a whole
// sequence, and every validation path.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "cpu_test_util.h"
#include "mlakit/fp8_cache.h"
#include "mlakit/mla_sparse_decode.h"
#include "mlakit/reference.h"
#include "reference/host_numeric.h"
#include "support/sparse_decode_case.h"

namespace mlakit {
namespace {

using support::HostSparseCase;
using support::SparseCaseSpec;

MlaSparseDecodeArgs args_of(HostSparseCase& c, std::vector<float>& out, std::vector<float>& lse) {
  out.assign(c.out_elems(), NAN);
  lse.assign(c.lse_elems(), NAN);
  return c.args(c.q.data(), c.main.bytes.data(), c.main.indices.data(), c.main.lengths.data(), c.sink.data(), out.data(),
                DType::kFP32, lse.data());
}

// Naive: softmax over the valid listed tokens of the dequantized cache, then the sink.
void expect_matches_naive(const HostSparseCase& hc, const std::vector<float>& out, const std::vector<float>& lse,
                          const std::vector<int32_t>* topk_length, const std::vector<float>* sink, double scale) {
  const SparseCaseSpec& c = hc.spec;
  const int64_t tokens = c.num_blocks * c.page_size;
  for (int64_t i = 0; i < c.b; ++i) {
    const int64_t count = topk_length ? std::clamp<int64_t>((*topk_length)[i], 0, c.topk) : c.topk;
    for (int t = 0; t < c.s_q; ++t) {
      for (int h = 0; h < c.h_q; ++h) {
        std::vector<double> z;
        std::vector<int64_t> rows;
        for (int64_t k = 0; k < count; ++k) {
          const int64_t slot = hc.main.indices[(i * c.s_q + t) * c.topk + k];
          if (slot < 0 || slot >= tokens) continue;
          double dot = 0;
          for (int d = 0; d < 576; ++d) {
            dot += double(host::bf16_to_float(hc.q[((i * c.s_q + t) * c.h_q + h) * 576 + d])) *
                   host::bf16_to_float(hc.main.dequantized[slot * 576 + d]);
          }
          z.push_back(dot * scale);
          rows.push_back(slot);
        }
        const float got_lse = lse[(i * c.h_q + h) * c.s_q + t];
        const float* got = &out[((i * c.s_q + t) * c.h_q + h) * 512];
        if (z.empty()) {
          ASSERT_TRUE(std::isinf(got_lse) && got_lse > 0) << "row without valid index: lse " << got_lse;
          for (int d = 0; d < 512; ++d) ASSERT_EQ(got[d], 0.f);
          continue;
        }
        double m = -INFINITY, sum = 0;
        for (double v : z) m = std::max(m, v);
        for (double v : z) sum += std::exp(v - m);
        const double ref_lse = m + std::log(sum);
        ASSERT_NEAR(got_lse, ref_lse, 1e-5 * std::max(1.0, std::fabs(ref_lse)));
        const double factor = sink ? 1.0 / (1.0 + std::exp((*sink)[h] - ref_lse)) : 1.0;
        for (int d = 0; d < 512; ++d) {
          double o = 0;
          for (size_t j = 0; j < z.size(); ++j) o += std::exp(z[j] - ref_lse) * host::bf16_to_float(hc.main.dequantized[rows[j] * 576 + d]);
          ASSERT_NEAR(got[d], o * factor, 1e-6 + 1e-5 * std::fabs(o)) << "seq " << i << " t " << t << " h " << h << " d " << d;
        }
      }
    }
  }
}

TEST(SparseDecodeReference, MatchesNaiveFormulaWithInvalidAndDuplicateIndices) {
  int seed = 0;
  for (auto [b, s_q, h_q, topk, blocks, page] : std::vector<std::tuple<int, int, int, int, int, int>>{
           {1, 1, 1, 64, 3, 53}, {3, 2, 16, 128, 4, 64}, {2, 3, 4, 64, 200, 1}}) {
    HostSparseCase c = support::make_sparse_case(
        {.b = b, .s_q = s_q, .h_q = h_q, .topk = topk, .num_blocks = blocks, .page_size = page, .seed = uint64_t(++seed)});
    std::vector<float> out, lse;
    MlaSparseDecodeArgs a = args_of(c, out, lse);
    ASSERT_TRUE(reference::mla_sparse_decode_fp8(a));
    expect_matches_naive(c, out, lse, nullptr, nullptr, 1.0 / std::sqrt(576.0));
  }
}

TEST(SparseDecodeReference, TopkLengthAndAttentionSink) {
  HostSparseCase c = support::make_sparse_case({.b = 3, .s_q = 2, .h_q = 4, .topk = 64, .num_blocks = 5, .page_size = 16,
                                                 .with_topk_length = true, .with_sink = true, .softmax_scale = 0.3f,
                                                 .seed = 77});
  c.main.lengths = {64, 0, 17};
  std::vector<float> out, lse;
  MlaSparseDecodeArgs a = args_of(c, out, lse);
  ASSERT_TRUE(reference::mla_sparse_decode_fp8(a));
  expect_matches_naive(c, out, lse, &c.main.lengths, &c.sink, 0.3f);
}

// Listing every position of a sequence's pages gives the dense decode of the dequantized cache.
TEST(SparseDecodeReference, EqualsDenseDecodeWhenIndicesListTheWholeSequence) {
  HostSparseCase c = support::make_sparse_case(
      {.b = 2, .s_q = 2, .h_q = 8, .topk = 192, .num_blocks = 6, .page_size = 32, .seed = 5});
  const int32_t lengths[2] = {150, 192};
  std::vector<int32_t> table = {4, 1, 0, 5, 3, 2, -1, -1, 2, 3, 0, 1, 5, 4, -1, -1};  // [2, 8]
  for (int64_t i = 0; i < 2; ++i) {
    for (int t = 0; t < 2; ++t) {
      for (int k = 0; k < 192; ++k) {
        c.main.indices[(i * 2 + t) * 192 + k] = k < lengths[i] ? table[i * 8 + k / 32] * 32 + k % 32 : -1;
      }
    }
  }
  std::vector<float> sparse_out, sparse_lse;
  MlaSparseDecodeArgs a = args_of(c, sparse_out, sparse_lse);
  ASSERT_TRUE(reference::mla_sparse_decode_fp8(a));

  std::vector<int32_t> seqlens(lengths, lengths + 2);
  std::vector<float> dense_out(sparse_out.size()), dense_lse(sparse_lse.size());
  MlaDecodeArgs d;
  d.q = a.q;
  d.kv_cache = make_tensor(c.main.dequantized.data(), DType::kBF16, {6, 32, 1, 576});
  d.block_table = make_tensor(table.data(), DType::kInt32, {2, 8});
  d.cache_seqlens = make_tensor(seqlens.data(), DType::kInt32, {2});
  d.out = make_tensor(dense_out.data(), DType::kFP32, {2, 2, 8, 512});
  d.lse = make_tensor(dense_lse.data(), DType::kFP32, {2, 8, 2});
  ASSERT_TRUE(reference::mla_decode(d));
  for (size_t i = 0; i < sparse_out.size(); ++i) ASSERT_NEAR(sparse_out[i], dense_out[i], 1e-6) << i;
  for (size_t i = 0; i < sparse_lse.size(); ++i) ASSERT_NEAR(sparse_lse[i], dense_lse[i], 1e-5) << i;
}

TEST(SparseDecodeReference, ValidationErrors) {
  HostSparseCase c = support::make_sparse_case(
      {.b = 2, .s_q = 1, .h_q = 4, .topk = 64, .num_blocks = 2, .page_size = 16, .seed = 9});
  std::vector<float> out, lse;
  using testing::IsInvalid;
  auto base = [&] { return args_of(c, out, lse); };
  MlaSparseDecodeArgs a = base();
  a.causal = true;
  EXPECT_TRUE(IsInvalid(reference::mla_sparse_decode_fp8(a), {"causal", "expected false"}));
  a = base();
  a.kv_cache = make_tensor(c.main.bytes.data(), DType::kUInt8, {2, 16, 1, 576});
  EXPECT_TRUE(IsInvalid(reference::mla_sparse_decode_fp8(a), {"kv_cache.shape[3]", "expected 656", "got 576"}));
  a = base();
  a.kv_cache = make_tensor(c.main.bytes.data(), DType::kBF16, {2, 16, 1, 656});
  EXPECT_TRUE(IsInvalid(reference::mla_sparse_decode_fp8(a), {"kv_cache.dtype", "uint8"}));
  a = base();
  a.indices = make_tensor(c.main.indices.data(), DType::kInt32, {2, 2, 32});
  EXPECT_TRUE(IsInvalid(reference::mla_sparse_decode_fp8(a), {"indices.shape[1] (s_q)", "expected 1", "got 2"}));
  a = base();
  a.q.dtype = DType::kFP16;
  EXPECT_TRUE(IsInvalid(reference::mla_sparse_decode_fp8(a), {"q.dtype", "bf16", "fp16"}));
  std::vector<int32_t> lengths(3);
  a = base();
  a.topk_length = make_tensor(lengths.data(), DType::kInt32, {3});
  EXPECT_TRUE(IsInvalid(reference::mla_sparse_decode_fp8(a), {"topk_length.shape[0] (b)", "expected 2", "got 3"}));
  std::vector<float> sink(5);
  a = base();
  a.attn_sink = make_tensor(sink.data(), DType::kFP32, {5});
  EXPECT_TRUE(IsInvalid(reference::mla_sparse_decode_fp8(a), {"attn_sink.shape[0] (h_q)", "expected 4", "got 5"}));
  a = base();
  a.lse = make_tensor(lse.data(), DType::kFP32, {2, 1, 4});
  EXPECT_TRUE(IsInvalid(reference::mla_sparse_decode_fp8(a), {"lse.shape[1] (h_q)", "expected 4", "got 1"}));
}

}  // namespace
}  // namespace mlakit
