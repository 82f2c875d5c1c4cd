// The sparse FP8 MLA decode on the GPU against the CPU reference: batch sizes, query tokens,
// topk, page sizes, duplicate and invalid indices, rows without any valid index, topk_length
// and the attention sink, NaN-poisoned outputs; validation of the device path.
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "gpu_test_util.h"
#include "host/decode_layout.h"
#include "host/device.h"
#include "mlakit/mla_sparse_decode.h"
#include "support/accuracy.h"
#include "support/sparse_decode_case.h"

namespace mlakit::testing {
namespace {

struct SparseSweepCase {
  support::SparseCaseSpec spec;
  std::string name() const {
    std::ostringstream s;
    s << "b" << spec.b << "_sq" << spec.s_q << "_hq" << spec.h_q << "_topk" << spec.topk << "_page" << spec.page_size
      << (spec.with_topk_length ? "_len" : "") << (spec.with_sink ? "_sink" : "");
    return s.str();
  }
};

std::vector<SparseSweepCase> sparse_cases() {
  std::vector<SparseSweepCase> cases;
  const int64_t bs[] = {1, 4, 74, 128};
  const int sqs[] = {1, 2, 3};
  const int topks[] = {64, 128, 576, 2048};
  const int64_t pages[] = {1, 53, 64, 256};
  int rot = 0;
  for (int64_t b : bs) {
    for (int s_q : sqs) {
      for (int topk : topks) {
        ++rot;
        if (b * s_q * topk > 128 * 2 * 576) continue;  // keep the CPU reference fast
        support::SparseCaseSpec spec;
        spec.b = b;
        spec.s_q = s_q;
        // 128 and 96: two row tiles (the Hopper kernel's crossover pair, the second one partial
        // at 96); 64 and 16: one.
        spec.h_q = rot % 3 == 0 ? 128 : (rot % 3 == 1 ? 64 : (rot % 2 == 0 ? 16 : 96));
        spec.topk = topk;
        spec.page_size = pages[rot % 4];
        spec.num_blocks = (std::max<int64_t>(topk, 256) + spec.page_size - 1) / spec.page_size + 1;
        spec.with_topk_length = rot % 4 == 1;
        spec.with_sink = rot % 5 == 2;
        spec.seed = 100 + rot;
        cases.push_back({spec});
      }
    }
  }
  return cases;
}

// Every case on both kernels (the Hopper one only on compute capability 9.0).
class MlaSparseDecodeSweep : public ::testing::TestWithParam<std::tuple<SparseSweepCase, MlaKernel>> {};

TEST_P(MlaSparseDecodeSweep, MatchesReference) {
  MLAKIT_SKIP_WITHOUT_GPU();
  const MlaKernel kernel = std::get<1>(GetParam());
  if (kernel == MlaKernel::kSm90 && !is_hopper()) GTEST_SKIP() << "needs a compute capability 9.0 GPU";
  support::HostSparseCase c = support::make_sparse_case(std::get<0>(GetParam()).spec);
  MlaSparseDecodeProblem problem = c.problem();
  problem.kernel = kernel;
  const support::SparseReferenceResult ref = support::run_sparse_reference(c);

  DeviceBuffer q(c.q), cache(c.main.bytes), indices(c.main.indices), out(c.out_elems() * 2), lse(c.lse_elems() * 4);
  DeviceBuffer topk_length(std::max<size_t>(c.main.lengths.size(), 1) * 4), sink(std::max<size_t>(c.sink.size(), 1) * 4);
  if (!c.main.lengths.empty()) topk_length.upload(c.main.lengths.data(), c.main.lengths.size() * 4);
  if (!c.sink.empty()) sink.upload(c.sink.data(), c.sink.size() * 4);
  out.fill16(0x7fc0);
  lse.fill32(0x7fc00000u);
  const MlaSparseDecodeArgs args = c.args(q.get(), cache.get(), indices.get(), topk_length.get(), sink.get(),
                                          out.get(), DType::kBF16, lse.get());
  std::size_t bytes = 0;
  ASSERT_TRUE(mla_sparse_decode_workspace_size(problem, &bytes));
  DeviceBuffer ws(bytes);
  MlaDecodePlan plan;
  Status s = mla_sparse_decode_plan(problem, args.topk_length, ws.get(), bytes, nullptr, &plan);
  ASSERT_TRUE(s) << s.to_string();
  ASSERT_EQ(plan.kernel, kernel);
  s = mla_sparse_decode_fp8(args, plan, nullptr);
  ASSERT_TRUE(s) << s.to_string();
  MLAKIT_ASSERT_CUDA(cudaDeviceSynchronize());
  const auto o = support::check_half_outputs(out.download<uint16_t>(), ref.out, DType::kBF16, "out");
  EXPECT_TRUE(o.ok) << o.message << " (cosine diff " << o.cosine_diff << ")";
  const auto l = support::check_float_stats(lse.download<float>(), ref.lse, "lse");
  EXPECT_TRUE(l.ok) << l.message;
}

INSTANTIATE_TEST_SUITE_P(Sweep, MlaSparseDecodeSweep,
                         ::testing::Combine(::testing::ValuesIn(sparse_cases()),
                                            ::testing::Values(MlaKernel::kPortable, MlaKernel::kSm90)),
                         [](const ::testing::TestParamInfo<std::tuple<SparseSweepCase, MlaKernel>>& info) {
                           return std::get<0>(info.param).name() +
                                  (std::get<1>(info.param) == MlaKernel::kSm90 ? "_sm90" : "_portable");
                         });

// Without topk_length a plan may hold whole sequences per part: every output is then
// written by the attention kernel, the combine is not launched. b = default parts - 2 with
// s_q 2 (b 64 at h_q 128 on a 132-SM GPU, the benchmark's shape with topk 576) gives b parts
// of two sequences each on any GPU; outputs start NaN-poisoned, so a row the kernel did not
// write fails the comparison.
TEST(MlaSparseDecodeWholeSequences, WrittenWithoutCombine) {
  MLAKIT_SKIP_WITHOUT_GPU();
  detail::DeviceInfo dev;
  ASSERT_TRUE(detail::current_device_info(&dev));
  std::vector<MlaKernel> kernels = {MlaKernel::kPortable};
  if (is_hopper()) kernels.push_back(MlaKernel::kSm90);
  for (const MlaKernel kernel : kernels) {
    SCOPED_TRACE(kernel == MlaKernel::kSm90 ? "sm90" : "portable");
    const detail::DecodeKernelTraits traits = detail::decode_kernel_traits(kernel);
    const MlaDecodeProblem per_token{.b = 1, .s_q = 1, .h_q = 128, .h_kv = 1};
    const int default_parts = detail::decode_num_parts(per_token, traits, dev.sm_count);
    if (default_parts < 12) GTEST_SKIP() << "too few SMs for the case: " << dev.sm_count;
    const int64_t b = default_parts - 2;
    support::HostSparseCase c = support::make_sparse_case({.b = b, .s_q = 2, .h_q = 128, .topk = 576,
                                                           .num_blocks = 10, .page_size = 64, .with_sink = true,
                                                           .seed = 57});
    const detail::ScheduleConfig config = detail::decode_schedule_config(per_token, traits, dev.sm_count);
    const detail::WholeSequenceParts expected = detail::whole_sequence_parts(2 * b, 9, config);
    ASSERT_TRUE(expected.no_splits);
    ASSERT_EQ(expected.num_parts, b);

    MlaSparseDecodeProblem problem = c.problem();
    problem.kernel = kernel;
    DeviceBuffer q(c.q), cache(c.main.bytes), indices(c.main.indices), out(c.out_elems() * 2), lse(c.lse_elems() * 4);
    DeviceBuffer sink(c.sink.size() * 4);
    sink.upload(c.sink.data(), c.sink.size() * 4);
    out.fill16(0x7fc0);
    lse.fill32(0x7fc00000u);
    const MlaSparseDecodeArgs args =
        c.args(q.get(), cache.get(), indices.get(), nullptr, sink.get(), out.get(), DType::kBF16, lse.get());
    std::size_t bytes = 0;
    ASSERT_TRUE(mla_sparse_decode_workspace_size(problem, &bytes));
    DeviceBuffer ws(bytes);
    MlaDecodePlan plan;
    Status s = mla_sparse_decode_plan(problem, TensorRef{}, ws.get(), bytes, nullptr, &plan);
    ASSERT_TRUE(s) << s.to_string();
    EXPECT_EQ(plan.num_parts, expected.num_parts);
    EXPECT_TRUE(plan.no_splits);
    s = mla_sparse_decode_fp8(args, plan, nullptr);
    ASSERT_TRUE(s) << s.to_string();
    MLAKIT_ASSERT_CUDA(cudaDeviceSynchronize());
    // The device planner agrees: one split per sequence.
    const std::vector<int32_t> ws_ints = ws.download<int32_t>();
    for (int64_t i = 0; i <= 2 * b; ++i) {
      ASSERT_EQ(ws_ints[plan.split_prefix_offset / 4 + i], i) << "split prefix at sequence " << i;
    }
    const support::SparseReferenceResult ref = support::run_sparse_reference(c);
    const auto o = support::check_half_outputs(out.download<uint16_t>(), ref.out, DType::kBF16, "out");
    EXPECT_TRUE(o.ok) << o.message << " (cosine diff " << o.cosine_diff << ")";
    const auto l = support::check_float_stats(lse.download<float>(), ref.lse, "lse");
    EXPECT_TRUE(l.ok) << l.message;
  }
}

TEST(MlaSparseDecodeGraph, CaptureAndReplayMatchEagerBits) {
  MLAKIT_SKIP_WITHOUT_GPU();
  support::HostSparseCase c = support::make_sparse_case(
      {.b = 6, .s_q = 2, .h_q = 64, .topk = 576, .num_blocks = 12, .page_size = 64, .with_topk_length = true, .seed = 21});
  DeviceBuffer q(c.q), cache(c.main.bytes), indices(c.main.indices), lengths(c.main.lengths), out(c.out_elems() * 2),
      lse(c.lse_elems() * 4);
  const MlaSparseDecodeArgs args =
      c.args(q.get(), cache.get(), indices.get(), lengths.get(), nullptr, out.get(), DType::kBF16, lse.get());
  std::size_t bytes = 0;
  ASSERT_TRUE(mla_sparse_decode_workspace_size(c.problem(), &bytes));
  DeviceBuffer ws(bytes);
  cudaStream_t stream;
  MLAKIT_ASSERT_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  MlaDecodePlan plan;
  ASSERT_TRUE(mla_sparse_decode_plan(c.problem(), args.topk_length, ws.get(), bytes, stream, &plan));
  ASSERT_TRUE(mla_sparse_decode_fp8(args, plan, stream));
  MLAKIT_ASSERT_CUDA(cudaStreamSynchronize(stream));
  const auto eager_out = out.download<uint16_t>();
  const auto eager_lse = lse.download<uint32_t>();

  cudaGraph_t graph;
  MLAKIT_ASSERT_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  MlaDecodePlan captured;
  const Status plan_status = mla_sparse_decode_plan(c.problem(), args.topk_length, ws.get(), bytes, stream, &captured);
  const Status run_status = mla_sparse_decode_fp8(args, captured, stream);
  MLAKIT_ASSERT_CUDA(cudaStreamEndCapture(stream, &graph));
  ASSERT_TRUE(plan_status) << plan_status.to_string();
  ASSERT_TRUE(run_status) << run_status.to_string();
  cudaGraphExec_t exec;
  MLAKIT_ASSERT_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  out.fill16(0x7fc0);
  lse.fill32(0x7fc00000u);
  MLAKIT_ASSERT_CUDA(cudaGraphLaunch(exec, stream));
  MLAKIT_ASSERT_CUDA(cudaStreamSynchronize(stream));
  EXPECT_EQ(out.download<uint16_t>(), eager_out);
  EXPECT_EQ(lse.download<uint32_t>(), eager_lse);
  const support::SparseReferenceResult ref = support::run_sparse_reference(c);
  const auto o = support::check_half_outputs(eager_out, ref.out, DType::kBF16, "out");
  EXPECT_TRUE(o.ok) << o.message;
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

TEST(MlaSparseDecodeValidation, CausalAndHostPointersAndPlanMismatch) {
  MLAKIT_SKIP_WITHOUT_GPU();
  support::HostSparseCase c = support::make_sparse_case({.b = 2, .s_q = 1, .h_q = 16, .topk = 64, .seed = 3});
  DeviceBuffer q(c.q), cache(c.main.bytes), indices(c.main.indices), out(c.out_elems() * 2), lse(c.lse_elems() * 4);
  MlaSparseDecodeArgs args =
      c.args(q.get(), cache.get(), indices.get(), nullptr, nullptr, out.get(), DType::kBF16, lse.get());
  std::size_t bytes = 0;
  ASSERT_TRUE(mla_sparse_decode_workspace_size(c.problem(), &bytes));
  DeviceBuffer ws(bytes);
  MlaDecodePlan plan;
  ASSERT_TRUE(mla_sparse_decode_plan(c.problem(), TensorRef{}, ws.get(), bytes, nullptr, &plan));
  args.causal = true;
  Status s = mla_sparse_decode_fp8(args, plan, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("causal"), std::string::npos) << s.message();
  args.causal = false;
  args.indices.data = c.main.indices.data();  // host memory
  s = mla_sparse_decode_fp8(args, plan, nullptr);
  EXPECT_NE(s.message().find("indices: expected device memory"), std::string::npos) << s.message();
  args.indices.data = indices.get();
  MlaDecodePlan other = plan;
  other.problem.b = 5;
  s = mla_sparse_decode_fp8(args, other, nullptr);
  EXPECT_NE(s.message().find("plan: expected a plan for b * s_q = 2"), std::string::npos) << s.message();
  other = plan;
  other.sparse_topk = 128;
  s = mla_sparse_decode_fp8(args, other, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("plan: expected a plan for topk = 64, extra_topk = 0 (mla_sparse_decode_plan), got a plan "
                             "for topk = 128, extra_topk = 0"),
            std::string::npos)
      << s.message();
  // topk_length at the decode but not at the plan, and the other way round.
  const int32_t host_lengths[2] = {64, 64};
  DeviceBuffer lengths(sizeof(host_lengths));
  lengths.upload(host_lengths, sizeof(host_lengths));
  args.topk_length = make_tensor(lengths.get(), DType::kInt32, {2});
  s = mla_sparse_decode_fp8(args, plan, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("topk_length: expected none (as given to mla_sparse_decode_plan), got a tensor"),
            std::string::npos)
      << s.message();
  MlaDecodePlan with_lengths;
  ASSERT_TRUE(mla_sparse_decode_plan(c.problem(), args.topk_length, ws.get(), bytes, nullptr, &with_lengths));
  args.topk_length = TensorRef{};
  s = mla_sparse_decode_fp8(args, with_lengths, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("topk_length: expected a tensor (as given to mla_sparse_decode_plan), got none"),
            std::string::npos)
      << s.message();
}

TEST(MlaSparseDecodeValidation, KernelRequest) {
  MLAKIT_SKIP_WITHOUT_GPU();
  support::HostSparseCase c = support::make_sparse_case({.b = 2, .s_q = 1, .h_q = 16, .topk = 64, .seed = 4});
  MlaSparseDecodeProblem problem = c.problem();
  problem.kernel = static_cast<MlaKernel>(7);
  std::size_t bytes = 0;
  Status s = mla_sparse_decode_workspace_size(problem, &bytes);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("mla_sparse_decode_workspace_size: problem.kernel: expected kAuto, kPortable or kSm90, got 7"),
            std::string::npos)
      << s.message();
  DeviceBuffer ws(1 << 20);
  MlaDecodePlan plan;
  s = mla_sparse_decode_plan(problem, TensorRef{}, ws.get(), 1 << 20, nullptr, &plan);
  EXPECT_NE(s.message().find("mla_sparse_decode_plan: problem.kernel: expected kAuto, kPortable or kSm90, got 7"),
            std::string::npos)
      << s.message();
  problem.kernel = MlaKernel::kSm90;
  s = mla_sparse_decode_workspace_size(problem, &bytes);
  if (is_hopper()) {
    EXPECT_TRUE(s) << s.to_string();
  } else {
    EXPECT_EQ(s.code(), StatusCode::kUnsupportedArchitecture);
    EXPECT_NE(s.message().find("problem.kernel: kSm90 expected a compute capability 9.0 device"), std::string::npos)
        << s.message();
  }
  problem.kernel = MlaKernel::kAuto;
  ASSERT_TRUE(mla_sparse_decode_workspace_size(problem, &bytes));
  DeviceBuffer auto_ws(bytes);
  ASSERT_TRUE(mla_sparse_decode_plan(problem, TensorRef{}, auto_ws.get(), bytes, nullptr, &plan));
  EXPECT_EQ(plan.kernel, is_hopper() ? MlaKernel::kSm90 : MlaKernel::kPortable);
}

}  // namespace
}  // namespace mlakit::testing
