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

bool has_device() {
  detail::DeviceInfo info;
  return detail::current_device_info(&info).is_ok();
}

// A valid, small problem on host memory: b 2, s_q 2, h_q 4, h_kv 2, page 16.
struct ValidArgs {
  ValidArgs()
      : c(support::make_decode_case({.seqlens = {20, 5}, .s_q = 2, .h_q = 4, .h_kv = 2,
                                     .page_size = 16, .seed = 3})),
        out(c.out_elems(), 0x7fc0),
        lse(c.lse_elems(), NAN),
        args(c.args(c.q.data(), c.kv.data(), c.block_table.data(), c.seqlens.data(), out.data(),
                    lse.data())) {}
  ValidArgs(const ValidArgs&) = delete;  // args point into this object's buffers
  ValidArgs& operator=(const ValidArgs&) = delete;
  support::HostDecodeCase c;
  std::vector<uint16_t> out;
  std::vector<float> lse;
  MlaDecodeArgs args;
};

Status validate(const MlaDecodeArgs& a) {
  MlaDecodeProblem p;
  return detail::validate_mla_decode_args("mla_decode", a, &p);
}

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

MlaDecodeProblem good_problem() {
  return MlaDecodeProblem{.b = 4, .s_q = 1, .h_q = 128, .h_kv = 1, .d_qk = 576, .d_v = 512};
}

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

// ---- validate_mla_decode_device_args ------------------------------------------------------

// Valid args at fake, well-aligned addresses (the device checks never dereference) and a
// plan laid out for them on device 0.
struct DeviceArgs {
  DeviceArgs() {
    EXPECT_TRUE(detail::validate_mla_decode_args("mla_decode", v.args, &problem).is_ok());
    auto at = [](std::uintptr_t a) { return reinterpret_cast<void*>(a); };
    v.args.q.data = at(0x1000000);
    v.args.kv_cache.data = at(0x2000000);
    v.args.block_table.data = at(0x3000000);
    v.args.cache_seqlens.data = at(0x4000000);
    v.args.out.data = at(0x5000000);
    v.args.lse.data = at(0x6000000);
    const detail::DeviceInfo dev{.ordinal = 0, .sm_count = 132, .cc_major = 9};
    EXPECT_TRUE(detail::make_decode_layout(problem, dev, &plan).is_ok());
    plan.workspace = at(0x7000000);
  }
  Status validate() const {
    return detail::validate_mla_decode_device_args("mla_decode", v.args, problem, plan, 0);
  }
  static void* shift(void* p, int bytes) { return static_cast<char*>(p) + bytes; }
  ValidArgs v;
  MlaDecodeProblem problem;
  MlaDecodePlan plan;
};

TEST(ValidateDeviceArgs, AcceptsAlignedArgsAndAMatchingPlan) {
  DeviceArgs d;
  const Status s = d.validate();
  if (!has_device()) {
    EXPECT_TRUE(s.is_ok()) << s.to_string();  // pointer-location checks pass without devices
  } else {
    // Host addresses on a machine with a GPU: only the pointer-location check may object.
    EXPECT_TRUE(s.is_ok() || s.message().find("expected device memory") != std::string::npos)
        << s.to_string();
  }
}

TEST(ValidateDeviceArgs, RowAlignment) {
  struct Case {
    std::function<void(MlaDecodeArgs&)> mutate;
    std::vector<std::string> parts;
  };
  const Case cases[] = {
      {[](A& a) { a.q.data = DeviceArgs::shift(a.q.data, 2); },
       {"mla_decode: q: expected a 16-byte aligned pointer, got an address = 2 mod 16"}},
      {[](A& a) { a.q.stride[2] = 580; }, {"q.stride[2]: expected a multiple of 8 elements (16 bytes), got 580"}},
      {[](A& a) { a.q.stride[0] = 4612; }, {"q.stride[0]: expected a multiple of 8 elements (16 bytes), got 4612"}},
      {[](A& a) { a.kv_cache.data = DeviceArgs::shift(a.kv_cache.data, 8); },
       {"kv_cache: expected a 16-byte aligned pointer, got an address = 8 mod 16"}},
      {[](A& a) { a.kv_cache.stride[2] = 580; }, {"kv_cache.stride[2]: expected a multiple of 8 elements", "got 580"}},
      {[](A& a) { a.kv_cache.stride[1] = 1156; }, {"kv_cache.stride[1]: expected a multiple of 8 elements", "got 1156"}},
      {[](A& a) { a.out.data = DeviceArgs::shift(a.out.data, 2); },
       {"out: expected a 4-byte aligned pointer, got an address = 2 mod 4"}},
      {[](A& a) { a.out.stride[2] = 513; }, {"out.stride[2]: expected a multiple of 2 elements (4 bytes), got 513"}},
      {[](A& a) { a.lse.data = DeviceArgs::shift(a.lse.data, 2); },
       {"lse: expected a 4-byte aligned pointer, got an address = 2 mod 4"}},
      {[](A& a) { a.block_table.data = DeviceArgs::shift(a.block_table.data, 1); },
       {"block_table: expected a 4-byte aligned pointer, got an address = 1 mod 4"}},
      {[](A& a) { a.cache_seqlens.data = DeviceArgs::shift(a.cache_seqlens.data, 3); },
       {"cache_seqlens: expected a 4-byte aligned pointer, got an address = 3 mod 4"}},
  };
  for (size_t i = 0; i < std::size(cases); ++i) {
    DeviceArgs d;
    cases[i].mutate(d.v.args);
    EXPECT_TRUE(IsInvalid(d.validate(), cases[i].parts)) << "case " << i;
  }
}

TEST(ValidateDeviceArgs, EmptyOrForeignPlan) {
  DeviceArgs d;
  d.plan.workspace = nullptr;
  EXPECT_TRUE(IsInvalid(d.validate(), {"mla_decode: plan: expected a plan filled by mla_decode_plan, got an empty plan"}));
  DeviceArgs e;
  e.plan.num_parts = 0;
  EXPECT_TRUE(IsInvalid(e.validate(), {"plan: expected a plan filled by mla_decode_plan"}));
  DeviceArgs f;
  EXPECT_TRUE(IsInvalid(detail::validate_mla_decode_device_args("mla_decode", f.v.args, f.problem, MlaDecodePlan{}, 0),
                        {"empty plan"}));
  DeviceArgs g;
  g.plan.device = 1;
  EXPECT_TRUE(IsInvalid(g.validate(), {"plan.device: expected 0 (the current device), got 1"}));
  DeviceArgs h;
  h.plan.sparse_topk = 2048;
  EXPECT_TRUE(IsInvalid(h.validate(),
                        {"plan: expected a plan made by mla_decode_plan, got a sparse decode plan (topk = 2048)"}));
}

TEST(ValidateDeviceArgs, PlanForAnotherProblem) {
  struct Case {
    std::function<void(MlaDecodeProblem&)> mutate;
    std::vector<std::string> parts;
  };
  const Case cases[] = {
      {[](MlaDecodeProblem& p) { p.b = 3; }, {"mla_decode: b: expected 3 (the plan's), got 2 (from the arguments)"}},
      {[](MlaDecodeProblem& p) { p.s_q = 1; }, {"s_q: expected 1 (the plan's), got 2"}},
      {[](MlaDecodeProblem& p) { p.h_q = 128; }, {"h_q: expected 128 (the plan's), got 4"}},
      {[](MlaDecodeProblem& p) { p.h_kv = 1; }, {"h_kv: expected 1 (the plan's), got 2"}},
      {[](MlaDecodeProblem& p) { p.d_qk = 512; }, {"d_qk: expected 512 (the plan's), got 576"}},
      {[](MlaDecodeProblem& p) { p.d_v = 256; }, {"d_v: expected 256 (the plan's), got 512"}},
  };
  for (size_t i = 0; i < std::size(cases); ++i) {
    DeviceArgs d;
    cases[i].mutate(d.plan.problem);
    EXPECT_TRUE(IsInvalid(d.validate(), cases[i].parts)) << "case " << i;
  }
}

// ---- public entry points: checks before the device query ---------------------------------

TEST(EntryPoints, WorkspaceSizeNeedsBytesPointer) {
  EXPECT_TRUE(IsInvalid(mla_decode_workspace_size(good_problem(), nullptr),
                        {"mla_decode_workspace_size: bytes: expected a non-null pointer, got null"}));
}

TEST(EntryPoints, WorkspaceSizeRejectsInvalidProblems) {
  std::size_t bytes = 777;
  MlaDecodeProblem p = good_problem();
  p.h_q = -1;
  EXPECT_TRUE(IsInvalid(mla_decode_workspace_size(p, &bytes),
                        {"mla_decode_workspace_size: h_q: expected >= 0, got -1"}));
  p = good_problem();
  p.d_v = 128;
  EXPECT_TRUE(StatusIs(mla_decode_workspace_size(p, &bytes), StatusCode::kUnsupported,
                       {"mla_decode_workspace_size: d_v: expected 512, got 128"}));
  EXPECT_EQ(bytes, 777u);
}

TEST(EntryPoints, WorkspaceSizeOfAValidProblem) {
  std::size_t bytes = 0;
  const Status s = mla_decode_workspace_size(good_problem(), &bytes);
  if (!has_device()) {
    EXPECT_EQ(s.code(), StatusCode::kNoDevice) << s.to_string();
  } else if (s.is_ok()) {
    EXPECT_GT(bytes, 0u);
    EXPECT_EQ(bytes % detail::kWorkspaceAlignment, 0u);
  }
}

TEST(EntryPoints, PlanNeedsPlanPointer) {
  ValidArgs v;
  alignas(256) static unsigned char workspace[256];
  EXPECT_TRUE(IsInvalid(mla_decode_plan(good_problem(), v.args.cache_seqlens, workspace, sizeof(workspace),
                                        nullptr, nullptr),
                        {"mla_decode_plan: plan: expected a non-null pointer, got null"}));
}

TEST(EntryPoints, PlanRejectsInvalidProblems) {
  ValidArgs v;
  MlaDecodePlan plan;
  plan.num_parts = 4321;
  MlaDecodeProblem p = good_problem();
  p.s_q = 1025;
  EXPECT_TRUE(IsInvalid(mla_decode_plan(p, v.args.cache_seqlens, nullptr, 0, nullptr, &plan),
                        {"mla_decode_plan: s_q: expected 0 <= s_q <= 1024, got 1025"}));
  p = good_problem();
  p.h_kv = 7;
  EXPECT_TRUE(IsInvalid(mla_decode_plan(p, v.args.cache_seqlens, nullptr, 0, nullptr, &plan),
                        {"mla_decode_plan: h_q % h_kv", "h_q = 128, h_kv = 7"}));
  EXPECT_EQ(plan.num_parts, 4321) << "plan written on error";
}

TEST(EntryPoints, DecodeValidatesArgsBeforeTheDevice) {
  ValidArgs v;
  const MlaDecodePlan plan;
  v.args.lse.dtype = DType::kFP16;
  EXPECT_TRUE(IsInvalid(mla_decode(v.args, plan, nullptr), {"mla_decode: lse.dtype: expected float32, got fp16"}));
  ValidArgs w;
  w.args.block_table.shape[0] = 1;
  EXPECT_TRUE(IsInvalid(mla_decode(w.args, plan, nullptr), {"mla_decode: block_table.shape[0] (b): expected 2, got 1"}));
}

TEST(EntryPoints, DecodeWithValidArgsReachesTheDeviceQuery) {
  ValidArgs v;
  const Status s = mla_decode(v.args, MlaDecodePlan{}, nullptr);
  if (!has_device()) {
    EXPECT_EQ(s.code(), StatusCode::kNoDevice) << s.to_string();
  } else {
    EXPECT_FALSE(s.is_ok());  // host pointers and an empty plan
  }
  for (uint16_t x : v.out) ASSERT_EQ(x, 0x7fc0) << "out written by a failed call";
}

// ---- the CPU reference validates like the GPU entry point ---------------------------------

TEST(ReferenceValidation, RejectsBadArgsWithTheSameMessages) {
  const std::function<void(A&)> mutations[] = {
      [](A& a) { a.q.dtype = DType::kFP32; },
      [](A& a) { a.kv_cache.dtype = DType::kFP16; },
      [](A& a) { a.kv_cache.shape[3] = 512; },
      [](A& a) { a.block_table.shape[0] = 3; },
      [](A& a) { a.cache_seqlens.dtype = DType::kFP32; },
      [](A& a) { a.out.shape[2] = 8; },
      [](A& a) { a.lse.stride[2] = 4; },
      [](A& a) { a.softmax_scale = INFINITY; },
      [](A& a) { a.q = make_tensor(a.q.data, DType::kBF16, {2, 2, 4, 576}, {1, 2}); },
      [](A& a) { a.q.shape[2] = a.out.shape[2] = a.lse.shape[1] = 3; },
      [](A& a) { a.out.shape[3] = 256; },
  };
  for (size_t i = 0; i < std::size(mutations); ++i) {
    ValidArgs v;
    mutations[i](v.args);
    MlaDecodeProblem p;
    const Status want = detail::validate_mla_decode_args("reference::mla_decode", v.args, &p);
    ASSERT_FALSE(want.is_ok()) << "case " << i;
    const Status got = reference::mla_decode(v.args, 1);
    EXPECT_EQ(got.code(), want.code()) << "case " << i;
    EXPECT_EQ(got.message(), want.message()) << "case " << i;
    EXPECT_EQ(got.message().rfind("reference::mla_decode: ", 0), 0u) << got.message();
    for (uint16_t x : v.out) ASSERT_EQ(x, 0x7fc0) << "case " << i << ": out written on error";
    for (float x : v.lse) ASSERT_TRUE(std::isnan(x)) << "case " << i << ": lse written on error";
  }
}

TEST(ReferenceValidation, OutMayBeFloat32ForTheReferenceOnly) {
  ValidArgs v;
  std::vector<float> out32(v.c.out_elems());
  v.args.out.data = out32.data();
  v.args.out.dtype = DType::kFP32;
  MlaDecodeProblem p;
  EXPECT_TRUE(detail::validate_mla_decode_args("reference::mla_decode", v.args, &p, true).is_ok());
  EXPECT_TRUE(IsInvalid(validate(v.args), {"mla_decode: out.dtype: expected bf16 (the dtype of q), got float32"}));
  EXPECT_TRUE(IsInvalid(mla_decode(v.args, MlaDecodePlan{}, nullptr), {"out.dtype: expected bf16", "got float32"}));
  EXPECT_TRUE(reference::mla_decode(v.args, 1).is_ok());
  // Any other dtype is still rejected, naming both accepted ones.
  v.args.out.dtype = DType::kFP16;
  EXPECT_TRUE(IsInvalid(reference::mla_decode(v.args, 1),
                        {"reference::mla_decode: out.dtype: expected bf16 or float32, got fp16"}));
}

TEST(StatusValue, ToStringAndCodeNames) {
  EXPECT_EQ(Status::ok().to_string(), "Ok");
  EXPECT_TRUE(Status::ok().is_ok());
  EXPECT_TRUE(static_cast<bool>(Status::ok()));
  const Status s(StatusCode::kWorkspaceTooSmall, "op: workspace_bytes: expected >= 512, got 256");
  EXPECT_FALSE(static_cast<bool>(s));
  EXPECT_EQ(s.to_string(), "WorkspaceTooSmall: op: workspace_bytes: expected >= 512, got 256");
  EXPECT_STREQ(status_code_name(StatusCode::kInvalidArgument), "InvalidArgument");
  EXPECT_STREQ(status_code_name(StatusCode::kUnsupported), "Unsupported");
  EXPECT_STREQ(status_code_name(StatusCode::kUnsupportedArchitecture), "UnsupportedArchitecture");
  EXPECT_STREQ(status_code_name(StatusCode::kCudaError), "CudaError");
  EXPECT_STREQ(status_code_name(StatusCode::kNoDevice), "NoDevice");
}

}  // namespace
}  // namespace mlakit
