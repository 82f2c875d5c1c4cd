// GPU behaviour of the GQA decode API beyond the sweep (gqa_decode_test.cpp): the errors of
// the plan / workspace / run entry points (each naming its argument), CUDA-graph capture and
// replay with new lengths, and one plan shared by several layers.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "gpu_test_util.h"
#include "gqa_test_util.h"

namespace mlakit::testing {
namespace {

// Passes when `s` has `code` and its message names every argument of `names` (whole words).
::testing::AssertionResult FailsNaming(const Status& s, StatusCode code, const std::vector<std::string>& names) {
  if (s.code() != code) {
    return ::testing::AssertionFailure() << "expected code " << status_code_name(code) << ", got " << s.to_string();
  }
  for (const std::string& name : names) {
    if (!names_argument(s.message(), name)) {
      return ::testing::AssertionFailure() << "message \"" << s.message() << "\" does not name " << name;
    }
  }
  return ::testing::AssertionSuccess();
}

// Every tensor the call takes is present: int8 cache with per-token scales, append, ALiBi,
// finished, lse; causal with a window, so that the plan's problem has every field set.
GqaShape api_shape(uint32_t seed = 31) {
  return {.lengths = {33, 70, 5}, .s_q = 2, .h_q = 8, .h_kv = 2, .d = 128, .page = 16, .format = GqaFormat::kInt8,
          .append = true, .seed = seed};
}
const GqaOptions kApiOptions{.rope = {RopeStyle::kNeox, 10000.0, 0}, .causal = true, .window = 16, .alibi = true,
                             .finished = true};

// A 4096-byte aligned host block, large enough to stand for any tensor of these cases.
struct HostBlock {
  std::unique_ptr<void, decltype(&std::free)> memory{std::aligned_alloc(4096, 1 << 22), &std::free};
  void* get() const { return memory.get(); }
};

class GqaDecodeApi : public ::testing::Test {
 protected:
  void SetUp() override {
    MLAKIT_SKIP_WITHOUT_GPU();
    c_ = std::make_unique<GqaGpuCase>(api_shape(), kApiOptions);
    ws_ = gqa_workspace(c_->problem());
    const Status s = gqa_decode_plan(c_->problem(), c_->args.cache_seqlens, ws_.get(), ws_.bytes(), nullptr, &plan_);
    ASSERT_TRUE(s) << s.to_string();
  }
  Status plan_with(void* workspace, std::size_t bytes, const TensorRef& seqlens, GqaDecodePlan* plan) {
    return gqa_decode_plan(c_->problem(), seqlens, workspace, bytes, nullptr, plan);
  }
  std::unique_ptr<GqaGpuCase> c_;
  DeviceBuffer ws_;
  GqaDecodePlan plan_;
};

TEST_F(GqaDecodeApi, NullPointersAreRejected) {
  EXPECT_TRUE(FailsNaming(gqa_decode_workspace_size(c_->problem(), nullptr), StatusCode::kInvalidArgument, {"bytes"}));
  EXPECT_TRUE(FailsNaming(plan_with(ws_.get(), ws_.bytes(), c_->args.cache_seqlens, nullptr),
                          StatusCode::kInvalidArgument, {"plan"}));
  GqaDecodePlan p;
  EXPECT_TRUE(FailsNaming(plan_with(nullptr, ws_.bytes(), c_->args.cache_seqlens, &p), StatusCode::kInvalidArgument,
                          {"workspace"}));
}

TEST_F(GqaDecodeApi, SmallOrMisalignedWorkspaceIsRejected) {
  GqaDecodePlan p;
  const Status small = plan_with(ws_.get(), ws_.bytes() - 1, c_->args.cache_seqlens, &p);
  EXPECT_EQ(small.code(), StatusCode::kWorkspaceTooSmall) << small.to_string();
  EXPECT_TRUE(names_argument(small.message(), "workspace_bytes") || names_argument(small.message(), "workspace"))
      << small.message();
  DeviceBuffer larger(ws_.bytes() + 256);
  for (std::size_t shift : {4, 16, 128}) {
    const Status s = plan_with(static_cast<char*>(larger.get()) + shift, ws_.bytes(), c_->args.cache_seqlens, &p);
    EXPECT_TRUE(FailsNaming(s, StatusCode::kInvalidArgument, {"workspace"})) << "shift " << shift;
    EXPECT_NE(s.message().find("256"), std::string::npos) << s.message();
  }
}

// A plan made for another problem: each field of GqaDecodeProblem differing from the
// arguments' is an error naming it; so is an empty plan, and one of another device.
TEST_F(GqaDecodeApi, PlanOfAnotherProblemIsRejected) {
  const struct {
    const char* field;
    void (*mutate)(GqaDecodeProblem&);
  } fields[] = {
      {"b", [](GqaDecodeProblem& p) { p.b += 1; }},
      {"s_q", [](GqaDecodeProblem& p) { p.s_q = 1; }},
      {"h_q", [](GqaDecodeProblem& p) { p.h_q *= 2; }},
      {"h_kv", [](GqaDecodeProblem& p) { p.h_kv = 1; }},
      {"d", [](GqaDecodeProblem& p) { p.d = 64; }},
      {"causal", [](GqaDecodeProblem& p) { p.causal = !p.causal; }},
      {"window", [](GqaDecodeProblem& p) { p.window += 1; }},
  };
  for (const auto& f : fields) {
    GqaDecodePlan other = plan_;
    f.mutate(other.problem);
    EXPECT_TRUE(FailsNaming(gqa_decode(c_->args, other, nullptr), StatusCode::kInvalidArgument, {f.field}))
        << "plan.problem." << f.field << " changed";
  }
  EXPECT_TRUE(FailsNaming(gqa_decode(c_->args, GqaDecodePlan{}, nullptr), StatusCode::kInvalidArgument, {"plan"}));
  GqaDecodePlan other_device = plan_;
  other_device.device += 1;
  EXPECT_TRUE(FailsNaming(gqa_decode(c_->args, other_device, nullptr), StatusCode::kInvalidArgument, {"device"}));
  // The decode's own plan still works after all that.
  c_->reset();
  ASSERT_TRUE(gqa_decode(c_->args, plan_, nullptr));
  MLAKIT_ASSERT_CUDA(cudaDeviceSynchronize());
}

// Host memory handed to the GPU entry points: an error naming the argument, before any launch.
TEST_F(GqaDecodeApi, HostPointersAreRejected) {
  HostBlock host;
  ASSERT_NE(host.get(), nullptr);
  const struct {
    const char* name;
    TensorRef& (*tensor)(GqaDecodeArgs&);
  } tensors[] = {
      {"q", [](GqaDecodeArgs& a) -> TensorRef& { return a.q; }},
      {"k_cache.values", [](GqaDecodeArgs& a) -> TensorRef& { return a.k_cache.values; }},
      {"v_cache.values", [](GqaDecodeArgs& a) -> TensorRef& { return a.v_cache.values; }},
      {"k_cache.scale", [](GqaDecodeArgs& a) -> TensorRef& { return a.k_cache.scale; }},
      {"v_cache.scale", [](GqaDecodeArgs& a) -> TensorRef& { return a.v_cache.scale; }},
      {"block_table", [](GqaDecodeArgs& a) -> TensorRef& { return a.block_table; }},
      {"cache_seqlens", [](GqaDecodeArgs& a) -> TensorRef& { return a.cache_seqlens; }},
      {"k_new", [](GqaDecodeArgs& a) -> TensorRef& { return a.k_new; }},
      {"v_new", [](GqaDecodeArgs& a) -> TensorRef& { return a.v_new; }},
      {"alibi_slopes", [](GqaDecodeArgs& a) -> TensorRef& { return a.alibi_slopes; }},
      {"finished", [](GqaDecodeArgs& a) -> TensorRef& { return a.finished; }},
      {"out", [](GqaDecodeArgs& a) -> TensorRef& { return a.out; }},
      {"lse", [](GqaDecodeArgs& a) -> TensorRef& { return a.lse; }},
  };
  for (const auto& t : tensors) {
    GqaDecodeArgs a = c_->args;
    t.tensor(a).data = host.get();
    const Status s = gqa_decode(a, plan_, nullptr);
    EXPECT_TRUE(FailsNaming(s, StatusCode::kInvalidArgument, {t.name})) << t.name;
    EXPECT_NE(s.message().find("device"), std::string::npos) << s.message();
  }
  GqaDecodePlan p;
  TensorRef host_lengths = c_->args.cache_seqlens;
  host_lengths.data = host.get();
  EXPECT_TRUE(FailsNaming(plan_with(ws_.get(), ws_.bytes(), host_lengths, &p), StatusCode::kInvalidArgument,
                          {"cache_seqlens"}));
  EXPECT_TRUE(FailsNaming(plan_with(host.get(), ws_.bytes(), c_->args.cache_seqlens, &p),
                          StatusCode::kInvalidArgument, {"workspace"}));
}

// The GPU entry takes q's dtype for out (float32 is the CPU reference's alone).
TEST_F(GqaDecodeApi, Float32OutIsRejected) {
  GqaDecodeArgs a = c_->args;
  a.out.dtype = DType::kFP32;
  EXPECT_TRUE(FailsNaming(gqa_decode(a, plan_, nullptr), StatusCode::kInvalidArgument, {"out"}));
}

// Plan + decode captured in a CUDA graph: a replay repeats the eager call's bytes, and a replay
// after new lengths were written to the same device buffer follows them (plan included).
TEST(GqaDecodeGraph, CaptureAndReplayFollowNewLengths) {
  MLAKIT_SKIP_WITHOUT_GPU();
  GqaGpuCase c({.lengths = {111, 40, 300, 17, 175}, .s_q = 2, .h_q = 16, .h_kv = 2, .d = 128,
                .page = 16, .format = GqaFormat::kInt8, .append = true, .seed = 41},
               {.rope = {RopeStyle::kNeox, 10000.0, 0}, .causal = true, .alibi = true});
  ASSERT_TRUE(c.run_reference());
  ASSERT_EQ(c.reference_sanity(), "");
  DeviceBuffer ws = gqa_workspace(c.problem());
  cudaStream_t stream;
  MLAKIT_ASSERT_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  c.reset();
  GqaDecodePlan plan;
  ASSERT_TRUE(gqa_decode_plan(c.problem(), c.args.cache_seqlens, ws.get(), ws.bytes(), stream, &plan));
  ASSERT_TRUE(gqa_decode(c.args, plan, stream));
  MLAKIT_ASSERT_CUDA(cudaStreamSynchronize(stream));
  const auto eager = c.download();
  EXPECT_EQ(c.check(eager), "");

  cudaGraph_t graph;
  MLAKIT_ASSERT_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  GqaDecodePlan captured;
  const Status plan_status = gqa_decode_plan(c.problem(), c.args.cache_seqlens, ws.get(), ws.bytes(), stream, &captured);
  const Status run_status = gqa_decode(c.args, captured, stream);
  MLAKIT_ASSERT_CUDA(cudaStreamEndCapture(stream, &graph));
  ASSERT_TRUE(plan_status) << plan_status.to_string();
  ASSERT_TRUE(run_status) << run_status.to_string();
  cudaGraphExec_t exec;
  MLAKIT_ASSERT_CUDA(cudaGraphInstantiate(&exec, graph, 0));

  c.reset();
  poison_gqa_partials(captured);
  MLAKIT_ASSERT_CUDA(cudaGraphLaunch(exec, stream));
  MLAKIT_ASSERT_CUDA(cudaStreamSynchronize(stream));
  EXPECT_TRUE(c.download() == eager) << "the replay differs from the eager call";

  // Other lengths (shorter: the slots past the first lengths are NaN) in the same device buffer.
  c.set_lengths({27, 20, 225, 4, 87});
  ASSERT_TRUE(c.run_reference());
  ASSERT_EQ(c.reference_sanity(), "");
  for (int replay = 0; replay < 2; ++replay) {
    c.reset();
    poison_gqa_partials(captured);
    MLAKIT_ASSERT_CUDA(cudaGraphLaunch(exec, stream));
    MLAKIT_ASSERT_CUDA(cudaStreamSynchronize(stream));
    EXPECT_EQ(c.check(c.download()), "") << "replay " << replay << " with new lengths";
  }

  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// Layers with equal problems and lengths share one plan (different caches, q and tables).
TEST(GqaDecodePlanReuse, OnePlanServesEveryLayer) {
  MLAKIT_SKIP_WITHOUT_GPU();
  GqaGpuCase layer0(api_shape(51), kApiOptions), layer1(api_shape(52), kApiOptions);
  ASSERT_TRUE(layer0.run_reference());
  ASSERT_TRUE(layer1.run_reference());
  DeviceBuffer ws = gqa_workspace(layer0.problem());
  GqaDecodePlan plan;
  ASSERT_TRUE(gqa_decode_plan(layer0.problem(), layer0.args.cache_seqlens, ws.get(), ws.bytes(), nullptr, &plan));
  layer0.reset();
  layer1.reset();
  ASSERT_TRUE(gqa_decode(layer0.args, plan, nullptr));
  ASSERT_TRUE(gqa_decode(layer1.args, plan, nullptr));
  MLAKIT_ASSERT_CUDA(cudaDeviceSynchronize());
  EXPECT_EQ(layer0.check(layer0.download()), "");
  EXPECT_EQ(layer1.check(layer1.download()), "");
}

}  // namespace
}  // namespace mlakit::testing
