// Validation of the dense MLA decode: every error path of validate_mla_decode_args,
// validate_decode_problem and validate_mla_decode_device_args, the public entry points'
// checks that run before any device query, and the CPU reference's rejection of bad args.
// Each error: its status code and a message naming the argument, expected and actual value.
#include "host/mla_decode_validate.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <iterator>
#include <limits>
#include <ostream>
#include <string>
#include <vector>

#include "cpu_test_util.h"
#include "valid_decode_args.h"
#include "host/decode_layout.h"
#include "host/device.h"
#include "mlakit/mla_decode.h"
#include "mlakit/reference.h"
#include "support/decode_case.h"

namespace mlakit {
namespace {

using testing::IsInvalid;
using testing::StatusIs;

constexpr int64_t kBig31 = int64_t{1} << 31;

using testing::ValidArgs;
using testing::has_device;
using testing::good_problem;
using testing::validate;

TEST(ValidateMlaDecodeArgs, AcceptsValidArgsAndFillsTheProblem) {
  ValidArgs v;
  MlaDecodeProblem p;
  ASSERT_TRUE(detail::validate_mla_decode_args("mla_decode", v.args, &p).is_ok());
  EXPECT_EQ(p.b, 2);
  EXPECT_EQ(p.s_q, 2);
  EXPECT_EQ(p.h_q, 4);
  EXPECT_EQ(p.h_kv, 2);
  EXPECT_EQ(p.d_qk, 576);
  EXPECT_EQ(p.d_v, 512);
}

// Points t at a zeroed buffer of its own that holds the view's whole extent under its strides
// (so strided views of one test never reach into another tensor's memory, which the overlap
// check would rightly reject).
void rehome(TensorRef& t, std::vector<std::vector<uint8_t>>& buffers) {
  int64_t span = 1;
  for (int i = 0; i < t.rank; ++i) span += (t.shape[i] - 1) * t.stride[i];
  buffers.emplace_back(static_cast<std::size_t>(span) * dtype_size(t.dtype) + 16, 0);
  t.data = buffers.back().data();
}

TEST(ValidateMlaDecodeArgs, AcceptsStridedViewsAndSizeOneLastDims) {
  ValidArgs v;
  MlaDecodeArgs& a = v.args;
  // Views of larger buffers: only the last dimension must be contiguous.
  a.q.stride[2] = 600;
  a.q.stride[1] = 4 * 600 + 8;
  a.q.stride[0] = 2 * a.q.stride[1] + 16;
  a.kv_cache.stride[0] += 64;
  a.block_table.stride[0] += 5;
  a.out.stride[0] += 3;
  a.lse.stride[0] = 100;
  a.lse.stride[1] = 7;
  std::vector<std::vector<uint8_t>> buffers;
  buffers.reserve(5);
  for (TensorRef* t : {&a.q, &a.kv_cache, &a.block_table, &a.out, &a.lse}) rehome(*t, buffers);
  a.softmax_scale = -0.5f;  // any finite scale is used as given
  EXPECT_TRUE(validate(a).is_ok()) << validate(a).to_string();
  // s_q 1: the lse's last dimension has size 1 and any stride.
  ValidArgs w;
  MlaDecodeArgs& b = w.args;
  b.q.shape[1] = b.out.shape[1] = b.lse.shape[2] = 1;
  b.lse.stride[2] = 9;
  EXPECT_TRUE(validate(b).is_ok()) << validate(b).to_string();
}

// One error path of validate_mla_decode_args: a mutation of valid args and its error.
struct ArgsErrorCase {
  std::string name;
  std::function<void(MlaDecodeArgs&)> mutate;
  StatusCode code;
  std::vector<std::string> parts;
};

void PrintTo(const ArgsErrorCase& c, std::ostream* os) { *os << c.name; }

class ArgsError : public ::testing::TestWithParam<ArgsErrorCase> {};

TEST_P(ArgsError, IsRejectedWithItsMessage) {
  ValidArgs v;
  GetParam().mutate(v.args);
  MlaDecodeProblem p;
  p.b = -77;
  const Status s = detail::validate_mla_decode_args("mla_decode", v.args, &p);
  EXPECT_TRUE(StatusIs(s, GetParam().code, GetParam().parts));
  EXPECT_EQ(s.message().rfind("mla_decode: ", 0), 0u) << s.message();
  EXPECT_EQ(p.b, -77) << "problem written on error";
}

using A = MlaDecodeArgs;
constexpr auto kInv = StatusCode::kInvalidArgument;

const ArgsErrorCase kArgsErrorCases[] = {
    // q
    {"q_lists_differ", [](A& a) { a.q = make_tensor(a.q.data, DType::kBF16, {2, 2, 4, 576}, {1, 2, 3}); },
     kInv, {"q: expected a tensor of rank 1..6", "got rank -1"}},
    {"q_null", [](A& a) { a.q.data = nullptr; }, kInv, {"q: expected a non-null pointer, got null"}},
    {"q_negative_size", [](A& a) { a.q.shape[1] = -1; }, kInv, {"q.shape[1]: expected >= 0, got -1"}},
    {"q_negative_stride", [](A& a) { a.q.stride[0] = -4608; }, kInv, {"q.stride[0]: expected >= 0", "got -4608"}},
    {"q_extent", [](A& a) { a.q.stride[0] = int64_t{1} << 61; }, kInv, {"q: shape [2, 2, 4, 576]", "2^59"}},
    {"q_dtype", [](A& a) { a.q.dtype = DType::kFP32; }, kInv, {"q.dtype: expected bf16 or fp16, got float32"}},
    {"q_rank", [](A& a) { a.q.rank = 3; }, kInv, {"q: expected rank 4, got rank 3 (shape [2, 2, 4])"}},
    {"q_last_stride", [](A& a) { a.q.stride[3] = 2; }, kInv, {"q.stride[3]: expected 1 (last dimension contiguous), got 2"}},
    // kv_cache
    {"kv_null", [](A& a) { a.kv_cache.data = nullptr; }, kInv, {"kv_cache: expected a non-null pointer, got null"}},
    {"kv_negative_size", [](A& a) { a.kv_cache.shape[0] = -2; }, kInv, {"kv_cache.shape[0]: expected >= 0, got -2"}},
    {"kv_dtype", [](A& a) { a.kv_cache.dtype = DType::kFP16; }, kInv,
     {"kv_cache.dtype: expected bf16 (the dtype of q), got fp16"}},
    {"kv_dtype_fp8", [](A& a) { a.kv_cache.dtype = DType::kFP8E4M3; }, kInv,
     {"kv_cache.dtype: expected bf16 (the dtype of q), got fp8_e4m3"}},
    {"kv_rank", [](A& a) { a.kv_cache.rank = 3; }, kInv, {"kv_cache: expected rank 4, got rank 3"}},
    {"kv_last_stride", [](A& a) { a.kv_cache.stride[3] = 3; }, kInv,
     {"kv_cache.stride[3]: expected 1 (last dimension contiguous), got 3"}},
    {"kv_d_qk", [](A& a) { a.kv_cache.shape[3] = 512; }, kInv, {"kv_cache.shape[3] (d_qk): expected 576, got 512"}},
    {"q_s_q_too_large", [](A& a) { a.q.shape[1] = kBig31; }, kInv,
     {"q.shape[1] (s_q): dimension too large: expected <= 2^31 - 1, got 2147483648"}},
    {"q_h_q_truncates", [](A& a) { a.q.shape[2] = kBig31 * 2 + 4; }, kInv,
     {"q.shape[2] (h_q): dimension too large", "4294967300"}},
    {"q_d_qk_truncates", [](A& a) { a.q.shape[3] = kBig31 * 2 + 576; }, kInv,
     {"q.shape[3] (d_qk): dimension too large", "4294967872"}},
    {"kv_h_kv_too_large", [](A& a) { a.kv_cache.shape[2] = kBig31; }, kInv,
     {"kv_cache.shape[2] (h_kv): dimension too large", "2147483648"}},
    {"page_size_0", [](A& a) { a.kv_cache.shape[1] = 0; }, kInv,
     {"kv_cache.shape[1] (page_block_size): expected 1 <= page_block_size <= 2^30, got 0"}},
    {"page_size_too_large", [](A& a) { a.kv_cache.shape[1] = (int64_t{1} << 30) + 1; }, kInv,
     {"kv_cache.shape[1] (page_block_size)", "got 1073741825"}},
    {"num_blocks_too_large", [](A& a) { a.kv_cache.shape[0] = kBig31; }, kInv,
     {"kv_cache.shape[0] (num_blocks): expected <= 2^31 - 1", "got 2147483648"}},
    // block_table
    {"table_null", [](A& a) { a.block_table.data = nullptr; }, kInv, {"block_table: expected a non-null pointer, got null"}},
    {"table_negative_stride", [](A& a) { a.block_table.stride[0] = -1; }, kInv, {"block_table.stride[0]: expected >= 0", "got -1"}},
    {"table_dtype", [](A& a) { a.block_table.dtype = DType::kFP32; }, kInv,
     {"block_table.dtype: expected int32, got float32"}},
    {"table_rank", [](A& a) { a.block_table.rank = 1; }, kInv, {"block_table: expected rank 2, got rank 1"}},
    {"table_b", [](A& a) { a.block_table.shape[0] = 3; }, kInv, {"block_table.shape[0] (b): expected 2, got 3"}},
    {"table_last_stride", [](A& a) { a.block_table.stride[1] = 2; }, kInv,
     {"block_table.stride[1]: expected 1 (last dimension contiguous), got 2"}},
    {"table_too_wide", [](A& a) { a.block_table.shape[1] = kBig31; a.block_table.stride[0] = 0; }, kInv,
     {"block_table.shape[1] (max_blocks_per_seq): expected <= 2^31 - 1, got 2147483648"}},
    // cache_seqlens
    {"seqlens_null", [](A& a) { a.cache_seqlens.data = nullptr; }, kInv, {"cache_seqlens: expected a non-null pointer, got null"}},
    {"seqlens_dtype", [](A& a) { a.cache_seqlens.dtype = DType::kInt8; }, kInv,
     {"cache_seqlens.dtype: expected int32, got int8"}},
    {"seqlens_rank", [](A& a) { a.cache_seqlens = make_tensor(a.cache_seqlens.data, DType::kInt32, {2, 1}); }, kInv,
     {"cache_seqlens: expected rank 1, got rank 2 (shape [2, 1])"}},
    {"seqlens_b", [](A& a) { a.cache_seqlens.shape[0] = 1; }, kInv, {"cache_seqlens.shape[0] (b): expected 2, got 1"}},
    {"seqlens_stride", [](A& a) { a.cache_seqlens.stride[0] = 2; }, kInv,
     {"cache_seqlens.stride[0]: expected 1 (last dimension contiguous), got 2"}},
    // out
    {"out_null", [](A& a) { a.out.data = nullptr; }, kInv, {"out: expected a non-null pointer, got null"}},
    {"out_negative_size", [](A& a) { a.out.shape[2] = -4; }, kInv, {"out.shape[2]: expected >= 0, got -4"}},
    {"out_dtype", [](A& a) { a.out.dtype = DType::kFP32; }, kInv, {"out.dtype: expected bf16 (the dtype of q), got float32"}},
    {"out_rank", [](A& a) { a.out.rank = 5; a.out.shape[4] = 1; a.out.stride[4] = 1; }, kInv,
     {"out: expected rank 4, got rank 5"}},
    {"out_b", [](A& a) { a.out.shape[0] = 1; }, kInv, {"out.shape[0] (b): expected 2, got 1"}},
    {"out_s_q", [](A& a) { a.out.shape[1] = 1; }, kInv, {"out.shape[1] (s_q): expected 2, got 1"}},
    {"out_h_q", [](A& a) { a.out.shape[2] = 8; }, kInv, {"out.shape[2] (h_q): expected 4, got 8"}},
    {"out_last_stride", [](A& a) { a.out.stride[3] = 2; }, kInv, {"out.stride[3]: expected 1 (last dimension contiguous), got 2"}},
    // lse
    {"lse_null", [](A& a) { a.lse.data = nullptr; }, kInv, {"lse: expected a non-null pointer, got null"}},
    {"lse_extent", [](A& a) { a.lse.stride[0] = int64_t{1} << 60; }, kInv, {"lse: shape [2, 4, 2]", "2^59"}},
    {"lse_dtype", [](A& a) { a.lse.dtype = DType::kBF16; }, kInv, {"lse.dtype: expected float32, got bf16"}},
    {"lse_rank", [](A& a) { a.lse.rank = 2; }, kInv, {"lse: expected rank 3, got rank 2"}},
    {"lse_b", [](A& a) { a.lse.shape[0] = 5; }, kInv, {"lse.shape[0] (b): expected 2, got 5"}},
    {"lse_h_q", [](A& a) { a.lse.shape[1] = 2; }, kInv, {"lse.shape[1] (h_q): expected 4, got 2"}},
    {"lse_s_q", [](A& a) { a.lse.shape[2] = 3; }, kInv, {"lse.shape[2] (s_q): expected 2, got 3"}},
    {"lse_transposed", [](A& a) { a.lse = make_tensor(a.lse.data, DType::kFP32, {2, 4, 2}, {8, 1, 4}); }, kInv,
     {"lse.stride[2]: expected 1 (last dimension contiguous), got 4"}},
    // softmax_scale
    {"scale_inf", [](A& a) { a.softmax_scale = INFINITY; }, kInv,
     {"softmax_scale: expected a finite value (or unset for 1 / sqrt(d_qk)), got inf"}},
    {"scale_minus_inf", [](A& a) { a.softmax_scale = -INFINITY; }, kInv, {"softmax_scale: expected a finite value", "got -inf"}},
    {"scale_nan", [](A& a) { a.softmax_scale = NAN; }, kInv, {"softmax_scale: expected a finite value", "got nan"}},
    // the problem the shapes describe
    {"b_too_large",
     [](A& a) {
       const int64_t b = (int64_t{1} << 30) + 1;
       for (TensorRef* t : {&a.q, &a.block_table, &a.out, &a.lse}) {
         t->shape[0] = b;
         t->stride[0] = 0;  // a broadcast view: no memory needed
       }
       a.cache_seqlens.shape[0] = b;
     },
     kInv, {"b: expected 0 <= b <= 2^30, got 1073741825"}},
    {"s_q_1025", [](A& a) { a.q.shape[1] = a.out.shape[1] = a.lse.shape[2] = 1025; }, kInv,
     {"s_q: expected 0 <= s_q <= 1024, got 1025"}},
    {"h_kv_0", [](A& a) { a.kv_cache.shape[2] = 0; }, kInv, {"h_kv: expected 1 <= h_kv <= 65535, got 0"}},
    {"h_kv_65536", [](A& a) { a.kv_cache.shape[2] = 65536; }, kInv, {"h_kv: expected 1 <= h_kv <= 65535, got 65536"}},
    {"h_q_not_multiple", [](A& a) { a.q.shape[2] = a.out.shape[2] = a.lse.shape[1] = 3; }, kInv,
     {"h_q % h_kv: expected 0", "got h_q = 3, h_kv = 2"}},
};

INSTANTIATE_TEST_SUITE_P(EveryPath, ArgsError, ::testing::ValuesIn(kArgsErrorCases),
                         [](const auto& info) { return info.param.name; });

// Unsupported head dims reached through the arguments: the message must say which tensor
// carries the dimension (include/mlakit/status.h documents exactly
// "mla_decode: q.shape[3] (d_qk): expected 576, got 512").
TEST(ValidateMlaDecodeArgs, UnsupportedHeadDimsNameTheTensor) {
  auto rejected = [](const Status& s) {
    return s.code() == StatusCode::kUnsupported || s.code() == StatusCode::kInvalidArgument;
  };
  ValidArgs v;
  v.args.q.shape[3] = v.args.kv_cache.shape[3] = 512;
  Status s = validate(v.args);
  EXPECT_TRUE(rejected(s)) << s.to_string();
  EXPECT_NE(s.message().find("d_qk"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("expected 576"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("got 512"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("q.shape[3] (d_qk)"), std::string::npos) << s.message();

  ValidArgs w;
  w.args.out.shape[3] = 256;
  s = validate(w.args);
  EXPECT_TRUE(rejected(s)) << s.to_string();
  EXPECT_NE(s.message().find("expected 512"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("got 256"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("out.shape[3] (d_v)"), std::string::npos) << s.message();
}

// Broadcast views (zero strides) of an in-range problem whose element counts exceed int64:
// q, out and lse are null, and must not pass as "empty" tensors (a kernel would write
// through them; the device-pointer check skips null pointers).
TEST(ValidateMlaDecodeArgs, NullTensorsWhoseElementCountWrapsAreRejected) {
  ValidArgs v;
  MlaDecodeArgs& a = v.args;
  const int64_t b = int64_t{1} << 30, s_q = 1024, h_q = int64_t{1} << 30;
  a.q = make_tensor(nullptr, DType::kBF16, {b, s_q, h_q, 576}, {0, 0, 0, 1});    // 2^76 * 9 elements
  a.out = make_tensor(nullptr, DType::kBF16, {b, s_q, h_q, 512}, {0, 0, 0, 1});  // 2^79 elements
  a.lse = make_tensor(nullptr, DType::kFP32, {b, h_q, s_q}, {0, 0, 1});           // 2^70 elements
  a.kv_cache.shape[2] = 1;
  a.block_table = make_tensor(a.block_table.data, DType::kInt32, {b, 1}, {0, 1});
  a.cache_seqlens = make_tensor(a.cache_seqlens.data, DType::kInt32, {b});
  EXPECT_TRUE(IsInvalid(validate(a), {"mla_decode: q: expected a non-null pointer, got null"}));
}

TEST(ResolveSoftmaxScale, DefaultIsOneOverSqrtDqk) {
  EXPECT_FLOAT_EQ(detail::resolve_softmax_scale(std::nullopt, 576), 1.0f / 24.0f);
  EXPECT_FLOAT_EQ(detail::resolve_softmax_scale(std::nullopt, 64), 0.125f);
  EXPECT_EQ(detail::resolve_softmax_scale(0.3f, 576), 0.3f);
  EXPECT_EQ(detail::resolve_softmax_scale(-2.0f, 576), -2.0f);
}

// ---- validate_decode_problem -------------------------------------------------------------

TEST(ValidateDecodeProblem, AcceptsTheRequiredRange) {
  for (int h_q : {1, 16, 32, 64, 128}) {
    for (int h_kv : {1, 2}) {
      MlaDecodeProblem p = good_problem();
      p.h_q = h_q * h_kv;
      p.h_kv = h_kv;
      EXPECT_TRUE(detail::validate_decode_problem("op", p).is_ok());
    }
  }
  MlaDecodeProblem p = good_problem();
  p.b = int64_t{1} << 30;
  p.s_q = 1024;
  p.h_kv = 65535;
  p.h_q = 65535 * 2;
  EXPECT_TRUE(detail::validate_decode_problem("op", p).is_ok());
}

TEST(ValidateDecodeProblem, EveryErrorPath) {
  struct Case {
    std::function<void(MlaDecodeProblem&)> mutate;
    StatusCode code;
    std::vector<std::string> parts;
  };
  const Case cases[] = {
      {[](MlaDecodeProblem& p) { p.b = -3; }, kInv, {"op: b: expected 0 <= b <= 2^30, got -3"}},
      {[](MlaDecodeProblem& p) { p.b = (int64_t{1} << 30) + 1; }, kInv, {"b:", "got 1073741825"}},
      {[](MlaDecodeProblem& p) { p.s_q = -1; }, kInv, {"op: s_q: expected 0 <= s_q <= 1024, got -1"}},
      {[](MlaDecodeProblem& p) { p.s_q = 1025; }, kInv, {"s_q:", "got 1025"}},
      {[](MlaDecodeProblem& p) { p.h_kv = 0; }, kInv, {"op: h_kv: expected 1 <= h_kv <= 65535, got 0"}},
      {[](MlaDecodeProblem& p) { p.h_kv = 65536; p.h_q = 65536; }, kInv, {"h_kv:", "got 65536"}},
      {[](MlaDecodeProblem& p) { p.h_q = -128; }, kInv, {"op: h_q: expected >= 0, got -128"}},
      {[](MlaDecodeProblem& p) { p.h_kv = 3; }, kInv,
       {"op: h_q % h_kv: expected 0 (h_q a multiple of h_kv), got h_q = 128, h_kv = 3"}},
      {[](MlaDecodeProblem& p) { p.d_qk = 512; }, StatusCode::kUnsupported,
       {"op: d_qk: expected 576", "got 512"}},
      {[](MlaDecodeProblem& p) { p.d_v = 576; }, StatusCode::kUnsupported, {"op: d_v: expected 512, got 576"}},
  };
  for (size_t i = 0; i < std::size(cases); ++i) {
    MlaDecodeProblem p = good_problem();
    cases[i].mutate(p);
    EXPECT_TRUE(StatusIs(detail::validate_decode_problem("op", p), cases[i].code, cases[i].parts))
        << "case " << i;
  }
}

}  // namespace
}  // namespace mlakit
