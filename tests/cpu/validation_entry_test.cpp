// Validation of the dense MLA decode, continued (validation_test.cpp has the argument and
// problem checks): validate_mla_decode_device_args, the public entry points' checks that run
// before any device query, and the CPU reference's rejection of bad args.
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
using A = MlaDecodeArgs;

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
