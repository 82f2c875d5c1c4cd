// Empty inputs are valid and get the empty result (issue 23, item 4): b, s_q or h_q of 0,
// no cache blocks, a prefill over no kv rows, nothing to quantize or append. Tensors without
// elements are built as NumPy passes them: all-zero strides (and here a null pointer), which
// no stride check may reject. Where rows remain (no cache blocks, no kv rows), every row is a
// row with nothing to attend: out 0, lse +inf, max_logits -inf.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <tuple>
#include <utility>
#include <vector>

#include "cpu_test_util.h"
#include "host/decode_layout.h"
#include "host/fp8_cache_args.h"
#include "host/mla_decode_validate.h"
#include "host/mla_sparse_decode_validate.h"
#include "host/mla_sparse_prefill_validate.h"
#include "mlakit/fp8_cache.h"
#include "mlakit/mla_decode.h"
#include "mlakit/mla_sparse_decode.h"
#include "mlakit/mla_sparse_prefill.h"
#include "mlakit/reference.h"

namespace mlakit {
namespace {

// A host tensor over `buffer` (resized to fit, filled with `fill`), contiguous; with no
// elements, NumPy's layout: null data, every stride 0.
template <typename T>
TensorRef host_tensor(std::vector<T>& buffer, DType dtype, std::initializer_list<int64_t> shape, T fill) {
  TensorRef t = make_tensor(nullptr, dtype, shape);
  const int64_t n = t.numel();
  if (n == 0) {
    for (int i = 0; i < t.rank; ++i) t.stride[i] = 0;
    return t;
  }
  buffer.assign(n, fill);
  t.data = buffer.data();
  return t;
}

constexpr uint16_t kPoison = 0x7fc0;  // bf16 NaN: unwritten elements show

// Dense decode of [b, s_q, h_q] queries over num_blocks blocks of 16 tokens; every length 0.
struct DenseEmpty {
  DenseEmpty(int64_t b, int64_t s_q, int64_t h_q, int64_t num_blocks) {
    args.q = host_tensor(q, DType::kBF16, {b, s_q, h_q, 576}, uint16_t{0x3f80});
    args.kv_cache = host_tensor(kv, DType::kBF16, {num_blocks, 16, 1, 576}, kPoison);
    args.block_table = host_tensor(table, DType::kInt32, {b, 2}, int32_t{0});
    args.cache_seqlens = host_tensor(seqlens, DType::kInt32, {b}, int32_t{0});
    args.out = host_tensor(out, DType::kBF16, {b, s_q, h_q, 512}, kPoison);
    args.lse = host_tensor(lse, DType::kFP32, {b, h_q, s_q}, float{NAN});
  }
  std::vector<uint16_t> q, kv, out;
  std::vector<int32_t> table, seqlens;
  std::vector<float> lse;
  MlaDecodeArgs args;
};

// Sparse decode [b, s_q, h_q] over num_blocks blocks of 16 FP8 tokens, topk 64, all slot 0.
struct SparseEmpty {
  SparseEmpty(int64_t b, int64_t s_q, int64_t h_q, int64_t num_blocks) {
    args.q = host_tensor(q, DType::kBF16, {b, s_q, h_q, 576}, uint16_t{0x3f80});
    args.kv_cache = host_tensor(cache, DType::kUInt8, {num_blocks, 16, 1, 656}, uint8_t{0x7f});
    args.indices = host_tensor(indices, DType::kInt32, {b, s_q, 64}, int32_t{0});
    args.out = host_tensor(out, DType::kBF16, {b, s_q, h_q, 512}, kPoison);
    args.lse = host_tensor(lse, DType::kFP32, {b, h_q, s_q}, float{NAN});
  }
  std::vector<uint16_t> q, out;
  std::vector<uint8_t> cache;
  std::vector<int32_t> indices;
  std::vector<float> lse;
  MlaSparseDecodeArgs args;
};

// Sparse prefill of s_q tokens, h_q heads over s_kv kv rows, topk 64, all index 0.
struct PrefillEmpty {
  PrefillEmpty(int64_t s_q, int64_t h_q, int64_t s_kv) {
    args.q = host_tensor(q, DType::kBF16, {s_q, h_q, 576}, uint16_t{0x3f80});
    args.kv = host_tensor(kv, DType::kBF16, {s_kv, 1, 576}, kPoison);
    args.indices = host_tensor(indices, DType::kInt32, {s_q, 1, 64}, int32_t{0});
    args.out = host_tensor(out, DType::kBF16, {s_q, h_q, 512}, kPoison);
    args.max_logits = host_tensor(max_logits, DType::kFP32, {s_q, h_q}, float{NAN});
    args.lse = host_tensor(lse, DType::kFP32, {s_q, h_q}, float{NAN});
  }
  std::vector<uint16_t> q, kv, out;
  std::vector<int32_t> indices;
  std::vector<float> max_logits, lse;
  MlaSparsePrefillArgs args;
};

void expect_rows_with_nothing_to_attend(const std::vector<uint16_t>& out, const std::vector<float>& lse) {
  ASSERT_FALSE(out.empty());
  for (uint16_t x : out) ASSERT_EQ(x, 0) << "out: expected exact zeros";
  for (float x : lse) ASSERT_EQ(x, INFINITY) << "lse: expected +inf";
}

// A device query's answer: Ok, or NoDevice on a machine without a GPU.
void expect_ok_or_no_device(const Status& s) {
  EXPECT_TRUE(s.is_ok() || s.code() == StatusCode::kNoDevice) << s.to_string();
}

TEST(EmptyInputs, DenseDecodeOfNoQueryRowsWritesNothing) {
  for (auto [b, s_q, h_q] : {std::tuple<int64_t, int64_t, int64_t>{0, 1, 16}, {2, 0, 16}, {2, 1, 0}}) {
    DenseEmpty d(b, s_q, h_q, 3);
    EXPECT_TRUE(reference::mla_decode(d.args, 1)) << "b " << b << " s_q " << s_q << " h_q " << h_q << ": "
                                                  << reference::mla_decode(d.args, 1).to_string();
    EXPECT_TRUE(d.out.empty() && d.lse.empty());
    // The GPU entry point's validation accepts it too, and sees an empty problem (its plan
    // and decode then launch nothing).
    MlaDecodeProblem p;
    ASSERT_TRUE(detail::validate_mla_decode_args("mla_decode", d.args, &p));
    EXPECT_TRUE(detail::is_empty_problem(p));
    std::size_t bytes = 0;
    expect_ok_or_no_device(mla_decode_workspace_size(p, &bytes));
  }
}

TEST(EmptyInputs, DenseDecodeOverNoCacheBlocks) {
  DenseEmpty d(2, 1, 16, 0);
  ASSERT_TRUE(reference::mla_decode(d.args, 1)) << reference::mla_decode(d.args, 1).to_string();
  expect_rows_with_nothing_to_attend(d.out, d.lse);
}

TEST(EmptyInputs, DecodeProblemsWithoutRowsHaveAPlanLayout) {
  const detail::DeviceInfo h100{.ordinal = 0, .sm_count = 132, .cc_major = 9};
  for (MlaDecodeProblem p : {MlaDecodeProblem{.b = 0, .s_q = 1, .h_q = 128}, MlaDecodeProblem{.b = 4, .s_q = 0, .h_q = 128},
                             MlaDecodeProblem{.b = 4, .s_q = 1, .h_q = 0}}) {
    EXPECT_TRUE(detail::is_empty_problem(p));
    MlaDecodePlan plan;
    ASSERT_TRUE(detail::make_decode_layout(p, h100, &plan));
    EXPECT_GE(plan.num_parts, 1);
    EXPECT_GT(plan.workspace_bytes, 0u);
  }
  EXPECT_FALSE(detail::is_empty_problem(MlaDecodeProblem{.b = 1, .s_q = 1, .h_q = 1}));
}

TEST(EmptyInputs, SparseDecodeOfNoQueryRowsWritesNothing) {
  for (auto [b, s_q, h_q] : {std::tuple<int64_t, int64_t, int64_t>{0, 2, 16}, {2, 0, 16}, {2, 2, 0}}) {
    SparseEmpty s(b, s_q, h_q, 2);
    EXPECT_TRUE(reference::mla_sparse_decode_fp8(s.args, 1))
        << reference::mla_sparse_decode_fp8(s.args, 1).to_string();
    EXPECT_TRUE(s.out.empty() && s.lse.empty());
    detail::SparseDecodeShape shape;
    EXPECT_TRUE(detail::validate_mla_sparse_decode_args("mla_sparse_decode_fp8", s.args, false, &shape));
    std::size_t bytes = 0;
    expect_ok_or_no_device(mla_sparse_decode_workspace_size(
        MlaSparseDecodeProblem{.b = b, .s_q = static_cast<int>(s_q), .h_q = static_cast<int>(h_q), .topk = 64}, &bytes));
  }
}

TEST(EmptyInputs, SparseDecodeOverNoCacheBlocks) {
  SparseEmpty s(2, 2, 16, 0);
  ASSERT_TRUE(reference::mla_sparse_decode_fp8(s.args, 1)) << reference::mla_sparse_decode_fp8(s.args, 1).to_string();
  expect_rows_with_nothing_to_attend(s.out, s.lse);
}

TEST(EmptyInputs, SparsePrefillOfNoQueryRowsWritesNothing) {
  for (auto [s_q, h_q] : {std::pair<int64_t, int64_t>{0, 16}, {3, 0}}) {
    PrefillEmpty p(s_q, h_q, 40);
    EXPECT_TRUE(reference::mla_sparse_prefill(p.args, 1)) << reference::mla_sparse_prefill(p.args, 1).to_string();
    EXPECT_TRUE(p.out.empty() && p.lse.empty() && p.max_logits.empty());
    detail::SparsePrefillShape shape;
    ASSERT_TRUE(detail::validate_mla_sparse_prefill_args("op", p.args, false, &shape));
    EXPECT_TRUE(detail::validate_mla_sparse_prefill_kernel_args("op", p.args, shape, 64));  // no grid of 0 / 0
  }
}

TEST(EmptyInputs, SparsePrefillOverNoKvRows) {
  PrefillEmpty p(3, 16, 0);
  ASSERT_TRUE(reference::mla_sparse_prefill(p.args, 1)) << reference::mla_sparse_prefill(p.args, 1).to_string();
  expect_rows_with_nothing_to_attend(p.out, p.lse);
  for (float x : p.max_logits) ASSERT_EQ(x, -INFINITY) << "max_logits: expected -inf";
}

TEST(EmptyInputs, Fp8CacheToolsWithNoRows) {
  std::vector<uint16_t> tokens_buf;
  std::vector<uint8_t> rows_buf;
  std::vector<int32_t> slots_buf;
  const TensorRef no_tokens = host_tensor(tokens_buf, DType::kBF16, {0, 576}, uint16_t{0});
  const TensorRef no_rows = host_tensor(rows_buf, DType::kUInt8, {4, 0, 656}, uint8_t{0});
  const TensorRef no_bf16_rows = host_tensor(tokens_buf, DType::kBF16, {4, 0, 576}, uint16_t{0});
  const TensorRef no_slots = host_tensor(slots_buf, DType::kInt32, {0}, int32_t{0});
  EXPECT_TRUE(reference::quantize_mla_cache_fp8(no_bf16_rows, no_rows));
  EXPECT_TRUE(reference::dequantize_mla_cache_fp8(no_rows, no_bf16_rows));
  expect_ok_or_no_device(quantize_mla_cache_fp8(no_bf16_rows, no_rows, nullptr));  // null pointers only

  std::vector<uint8_t> cache_buf;
  const TensorRef cache = host_tensor(cache_buf, DType::kUInt8, {2, 16, 1, 656}, uint8_t{0xab});
  EXPECT_TRUE(reference::append_mla_cache_fp8(no_tokens, no_slots, cache));
  for (uint8_t x : cache_buf) ASSERT_EQ(x, 0xab) << "cache written by an empty append";
  detail::Fp8AppendArgs append;
  EXPECT_TRUE(detail::validate_fp8_append("append_mla_cache_fp8", no_tokens, no_slots, cache, &append));
  EXPECT_EQ(append.tokens.rows, 0);
  // An empty cache (no blocks) takes an empty append too.
  std::vector<uint8_t> none;
  EXPECT_TRUE(reference::append_mla_cache_fp8(no_tokens, no_slots,
                                              host_tensor(none, DType::kUInt8, {0, 16, 1, 656}, uint8_t{0})));
}

}  // namespace
}  // namespace mlakit
