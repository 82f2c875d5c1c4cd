// Validation of the GQA decode arguments (host/gqa_decode_validate.h) through the CPU
// reference: a table of bad arguments, each with its status code and the argument its
// message must name; empty problems are valid and write nothing.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "cpu_test_util.h"
#include "gqa_case.h"
#include "mlakit/gqa_decode.h"

namespace mlakit {
namespace {

using testing::GqaCase;
using testing::GqaScaleLayout;
using testing::GqaSpec;

struct BadArgs {
  const char* what;
  GqaSpec spec;
  std::function<void(GqaCase&)> mutate;
  StatusCode code;
  std::vector<std::string> parts;
};

const GqaSpec kBf16{.s_q = 2, .append = true};
const GqaSpec kInt8{.s_q = 2, .cache = DType::kInt8, .scales = GqaScaleLayout::kPerToken, .append = true};
const GqaSpec kFp8Tensor{.cache = DType::kFP8E4M3, .scales = GqaScaleLayout::kPerTensor};
constexpr StatusCode kInvalid = StatusCode::kInvalidArgument;
constexpr StatusCode kUnsupported = StatusCode::kUnsupported;

TEST(GqaDecodeValidate, AcceptsValidArgsAndFillsTheProblem) {
  GqaCase c(kInt8);
  detail::GqaDecodeShape p;
  ASSERT_TRUE(detail::validate_gqa_decode_args("gqa_decode", c.args, &p, /*allow_float_out=*/true).is_ok());
  EXPECT_EQ(p.b, 2);
  EXPECT_EQ(p.s_q, 2);
  EXPECT_EQ(p.h_q, 4);
  EXPECT_EQ(p.h_kv, 2);
  EXPECT_EQ(p.d, 64);
  EXPECT_EQ(p.page_size, 4);
  EXPECT_EQ(p.max_blocks_per_seq, 4);
  EXPECT_EQ(p.scale_layout, GqaScaleLayout::kPerToken);
  EXPECT_TRUE(p.append);
  EXPECT_EQ(p.rotary_dim, 0);
  c.args.rope.style = RopeStyle::kGptj;
  ASSERT_TRUE(detail::validate_gqa_decode_args("gqa_decode", c.args, &p, /*allow_float_out=*/true).is_ok());
  EXPECT_EQ(p.rotary_dim, 64);
  // float32 out is the reference's alone.
  EXPECT_TRUE(testing::IsInvalid(detail::validate_gqa_decode_args("gqa_decode", c.args, &p), {"out.dtype"}));
}

TEST(GqaDecodeValidate, RejectsBadArgumentsNamingThem) {
  const BadArgs cases[] = {
      {"q dtype", kBf16, [](GqaCase& c) { c.args.q.dtype = DType::kFP32; }, kInvalid, {"q.dtype", "bf16"}},
      {"q rank", kBf16, [](GqaCase& c) { c.args.q.rank = 3; }, kInvalid, {"q: expected rank 4"}},
      {"q stride", kBf16, [](GqaCase& c) { c.args.q.stride[3] = 2; }, kInvalid, {"q.stride[3]", "got 2"}},
      {"d 96", kBf16, [](GqaCase& c) { c.args.q.shape[3] = 96; }, kUnsupported, {"q.shape[3] (d)", "64, 128 or 256", "got 96"}},
      {"s_q 9", kBf16, [](GqaCase& c) { c.args.q.shape[1] = 9; }, kUnsupported, {"q.shape[1] (s_q)", "got 9"}},
      {"h_q % h_kv", kBf16, [](GqaCase& c) { c.args.q.shape[2] = 3; }, kInvalid, {"h_q % h_kv", "h_q = 3", "h_kv = 2"}},
      {"cache dtype", kBf16, [](GqaCase& c) { c.args.k_cache.values.dtype = DType::kFP16; }, kInvalid, {"k_cache.values.dtype", "got fp16"}},
      {"cache d", kBf16, [](GqaCase& c) { c.args.k_cache.values.shape[3] = 128; }, kInvalid, {"k_cache.values.shape[3] (d)", "expected 64"}},
      {"cache page 0", kBf16, [](GqaCase& c) { c.args.k_cache.values.shape[1] = 0; }, kInvalid, {"k_cache.values.shape[1]"}},
      {"v dtype", kBf16, [](GqaCase& c) { c.args.v_cache.values.dtype = DType::kInt8; }, kInvalid, {"v_cache.values.dtype", "k_cache.values"}},
      {"v page", kBf16, [](GqaCase& c) { c.args.v_cache.values.shape[1] = 2; }, kInvalid, {"v_cache.values.shape[1] (page_size): expected 4, got 2"}},
      {"bf16 scale", kBf16, [](GqaCase& c) { c.args.k_cache.scale = make_tensor(c.ks.data(), DType::kFP32, {1}); }, kInvalid, {"k_cache.scale: expected none"}},
      {"int8 no scale", kInt8, [](GqaCase& c) { c.args.k_cache.scale = TensorRef{}; }, kInvalid, {"k_cache.scale", "got none"}},
      {"int8 per tensor", kInt8, [](GqaCase& c) { c.args.k_cache.scale = make_tensor(c.ks.data(), DType::kFP32, {1}); }, kInvalid, {"k_cache.scale", "rank 3", "got rank 1"}},
      {"scale blocks", kInt8, [](GqaCase& c) { c.args.k_cache.scale.shape[0] = 8; }, kInvalid, {"k_cache.scale.shape[0] (num_blocks): expected 10, got 8"}},
      {"scale dtype", kInt8, [](GqaCase& c) { c.args.v_cache.scale.dtype = DType::kFP16; }, kInvalid, {"v_cache.scale.dtype"}},
      {"v scale layout", kFp8Tensor, [](GqaCase& c) { c.args.v_cache.scale = make_tensor(c.vs.data(), DType::kFP32, {1, 1, 1}); }, kInvalid, {"v_cache.scale", "layout of k_cache.scale"}},
      {"per-tensor size", kFp8Tensor, [](GqaCase& c) { c.args.k_cache.scale.shape[0] = 2; }, kInvalid, {"k_cache.scale.shape[0]", "got 2"}},
      {"table dtype", kBf16, [](GqaCase& c) { c.args.block_table.dtype = DType::kUInt8; }, kInvalid, {"block_table.dtype"}},
      {"table b", kBf16, [](GqaCase& c) { c.args.block_table.shape[0] = 1; }, kInvalid, {"block_table.shape[0] (b)"}},
      {"seqlens b", kBf16, [](GqaCase& c) { c.args.cache_seqlens.shape[0] = 3; }, kInvalid, {"cache_seqlens.shape[0] (b): expected 2, got 3"}},
      {"k_new alone", kBf16, [](GqaCase& c) { c.args.v_new = TensorRef{}; }, kInvalid, {"v_new: expected a tensor", "got none"}},
      {"v_new alone", kBf16, [](GqaCase& c) { c.args.k_new = TensorRef{}; }, kInvalid, {"k_new: expected a tensor"}},
      {"k_new heads", kBf16, [](GqaCase& c) { c.args.k_new.shape[2] = 1; }, kInvalid, {"k_new.shape[2] (h_kv): expected 2, got 1"}},
      {"v_new dtype", kBf16, [](GqaCase& c) { c.args.v_new.dtype = DType::kFP16; }, kInvalid, {"v_new.dtype", "the dtype of q"}},
      {"rope style", kBf16, [](GqaCase& c) { c.args.rope.style = static_cast<RopeStyle>(7); }, kInvalid, {"rope.style", "got 7"}},
      {"rope theta 0", kBf16, [](GqaCase& c) { c.args.rope.theta = 0; }, kInvalid, {"rope.theta", "> 0"}},
      {"rope theta nan", kBf16, [](GqaCase& c) { c.args.rope.theta = NAN; }, kInvalid, {"rope.theta"}},
      {"rotary odd", kBf16, [](GqaCase& c) { c.args.rope.rotary_dim = 33; }, kInvalid, {"rope.rotary_dim", "got 33"}},
      {"rotary > d", kBf16, [](GqaCase& c) { c.args.rope.rotary_dim = 66; }, kInvalid, {"rope.rotary_dim", "d = 64", "got 66"}},
      {"alibi size", kBf16, [](GqaCase& c) { c.args.alibi_slopes = make_tensor(c.alibi.data(), DType::kFP32, {2}); }, kInvalid, {"alibi_slopes.shape[0] (h_q): expected 4, got 2"}},
      {"finished dtype", kBf16, [](GqaCase& c) { c.args.finished = make_tensor(c.finished.data(), DType::kInt8, {2}); }, kInvalid, {"finished.dtype", "uint8"}},
      {"out dtype", kBf16, [](GqaCase& c) { c.args.out.dtype = DType::kInt32; }, kInvalid, {"out.dtype"}},
      {"out d", kBf16, [](GqaCase& c) { c.args.out.shape[3] = 32; }, kInvalid, {"out.shape[3] (d): expected 64, got 32"}},
      {"lse shape", kBf16, [](GqaCase& c) { c.args.lse.shape[2] = 1; }, kInvalid, {"lse.shape[2] (s_q): expected 2, got 1"}},
      {"softmax_scale", kBf16, [](GqaCase& c) { c.args.softmax_scale = INFINITY; }, kInvalid, {"softmax_scale", "finite"}},
      {"window", kBf16, [](GqaCase& c) { c.args.window = -1; }, kInvalid, {"window: expected >= 0", "got -1"}},
      {"softcap < 0", kBf16, [](GqaCase& c) { c.args.softcap = -1; }, kInvalid, {"softcap", ">= 0"}},
      {"softcap nan", kBf16, [](GqaCase& c) { c.args.softcap = NAN; }, kInvalid, {"softcap"}},
      {"out over q", kBf16, [](GqaCase& c) { c.args.out.data = c.q.data(); c.args.out.dtype = DType::kBF16; }, kInvalid, {"out: expected memory disjoint from q"}},
      {"append over v", kBf16, [](GqaCase& c) { c.args.v_cache.values.data = c.kc.data(); }, kInvalid, {"v_cache.values", "disjoint from k_cache.values"}},
      {"scale over scale", kInt8, [](GqaCase& c) { c.args.v_cache.scale.data = c.ks.data(); }, kInvalid, {"v_cache.scale", "disjoint from k_cache.scale"}},
  };
  for (const BadArgs& k : cases) {
    SCOPED_TRACE(k.what);
    GqaCase c(k.spec);
    k.mutate(c);
    const Status s = reference::gqa_decode(c.args);
    EXPECT_TRUE(testing::StatusIs(s, k.code, k.parts));
    EXPECT_NE(s.message().find("reference::gqa_decode: "), std::string::npos) << s.message();
    for (float x : c.out) ASSERT_TRUE(std::isnan(x));  // nothing written
  }
}

// A scale given for a 16-bit cache with a rank beyond the stored extents: named, not read.
TEST(GqaDecodeValidate, AScaleOfAnyRankIsNamedWithoutReadingIt) {
  GqaCase c(kBf16);
  std::vector<float> scale(4, 1.0f);
  c.args.k_cache.scale = make_tensor(scale.data(), DType::kFP32, {4});
  c.args.k_cache.scale.rank = 1 << 20;
  EXPECT_TRUE(testing::IsInvalid(reference::gqa_decode(c.args), {"k_cache.scale: expected none", "[rank 1048576]"}));
}

// The workspace query validates the problem before it looks for a GPU: bad input gets its
// own error on any machine.
TEST(GqaDecodeValidate, WorkspaceSizeNamesABadProblemBeforeTheDevice) {
  std::size_t bytes = 0;
  const GqaDecodeProblem bad{.b = 1, .h_q = 6, .h_kv = 4, .d = 128};
  EXPECT_TRUE(testing::IsInvalid(gqa_decode_workspace_size(bad, &bytes), {"gqa_decode_workspace_size: problem.h_q", "multiple of h_kv = 4"}));
}

// Read-only caches may share memory with each other (the same tensor for keys and values).
TEST(GqaDecodeValidate, CachesMayAliasWithoutAppend) {
  GqaCase c(GqaSpec{.seed = 3});
  c.args.v_cache.values = c.args.k_cache.values;
  EXPECT_TRUE(reference::gqa_decode(c.args).is_ok());
}

// No query token (b or s_q of 0, null pointers for the empty tensors) is valid and does
// nothing; a cache without blocks is valid with empty sequences (out 0, lse +inf).
TEST(GqaDecodeValidate, EmptyProblemsAreValid) {
  for (int which = 0; which < 2; ++which) {
    GqaCase c(GqaSpec{.append = true});
    for (TensorRef* t : {&c.args.q, &c.args.out, &c.args.k_new, &c.args.v_new}) {
      t->shape[which] = 0;
      t->data = nullptr;
    }
    c.args.lse.shape[which == 0 ? 0 : 2] = 0;
    if (which == 0) {
      for (TensorRef* t : {&c.args.block_table, &c.args.cache_seqlens}) t->shape[0] = 0, t->data = nullptr;
    }
    const std::vector<uint8_t> kc = c.kc;
    EXPECT_TRUE(reference::gqa_decode(c.args).is_ok()) << which;
    EXPECT_EQ(c.kc, kc);
  }
  GqaCase c(GqaSpec{});
  c.args.k_cache.values.shape[0] = c.args.v_cache.values.shape[0] = 0;
  c.args.k_cache.values.data = c.args.v_cache.values.data = nullptr;
  c.seqlens = {0, 0};
  ASSERT_TRUE(reference::gqa_decode(c.args).is_ok());
  for (float x : c.out) ASSERT_EQ(x, 0.f);
  for (float x : c.lse) ASSERT_EQ(x, INFINITY);
}

}  // namespace
}  // namespace mlakit
