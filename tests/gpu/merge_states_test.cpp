// merge_states on the GPU against the float64 reference on the same inputs (docs/contract.md,
// accuracy rules): every dtype pair, 1 to 128 states, 1 to 3 row dimensions, the 16-byte and
// the one-value paths, strided and transposed views, both LSE bases, empty states holding NaN,
// outputs poisoned before each call; MLAKIT_STRESS_CALLS (20) calls per case bitwise equal; in
// place; a CUDA graph; device checks. Sanitizer runs include this suite (scripts/gpu_check.sh).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "gpu_test_util.h"
#include "mlakit/merge.h"
#include "reference/host_numeric.h"
#include "support/accuracy.h"
#include "stress_test_util.h"
#include "support/merge_case.h"

namespace mlakit::testing {
namespace {

using support::HostMergeCase;
using support::MergeCall;
using support::MergeSpec;


struct Result {
  std::vector<uint8_t> out;  // out_dtype bytes
  std::vector<float> lse;
};

// The reference's float32 out (unrounded) and LSE.
Result reference_result(const HostMergeCase& c) {
  Result r;
  r.out.resize(c.out_elements() * sizeof(float));
  r.lse.resize(c.rows);
  MergeCall call(c, c.o.data(), c.lse.data(), r.out.data(), r.lse.data());
  call.args.out.dtype = DType::kFP32;
  const Status s = reference::merge_states(call.args);
  EXPECT_TRUE(s) << s.to_string();
  return r;
}

// Device copies of a case's inputs and (poisoned) outputs.
struct DeviceMergeCase {
  DeviceBuffer o, lse, out, out_lse;
  explicit DeviceMergeCase(const HostMergeCase& c)
      : o(c.o), lse(c.lse), out(c.out_elements() * dtype_size(c.spec.out_dtype) + 16), out_lse(c.rows * 4 + 16) {}
  void poison() {
    out.fill_bytes(0xFF);  // NaN in every float dtype
    out_lse.fill_bytes(0xFF);
  }
  Result download(const HostMergeCase& c) const {
    Result r;
    r.out.resize(c.out_elements() * dtype_size(c.spec.out_dtype));
    out.download_to(r.out.data(), r.out.size());
    r.lse.resize(c.rows);
    out_lse.download_to(r.lse.data(), r.lse.size() * 4);
    return r;
  }
};

::testing::AssertionResult matches_reference(const HostMergeCase& c, const Result& got, const Result& want) {
  const int64_t n = c.out_elements();
  std::vector<float> want_out(n);
  std::memcpy(want_out.data(), want.out.data(), n * sizeof(float));
  support::AccuracyReport report;
  if (c.spec.out_dtype == DType::kFP32) {
    // float32 accumulation against float64: well inside the 16-bit rule, checked at 1e-5.
    for (int64_t i = 0; i < n; ++i) {
      const float a = host::load_as<float>(got.out.data(), i), b = want_out[i];
      const bool same_special = (std::isnan(a) && std::isnan(b)) || (std::isinf(a) && a == b);
      if (!same_special && !(std::fabs(a - b) <= 1e-5f * std::fmax(1.f, std::fabs(b)))) {
        return ::testing::AssertionFailure() << "out[" << i << "]: got " << a << ", expected " << b;
      }
    }
  } else {
    std::vector<uint16_t> half(n);
    std::memcpy(half.data(), got.out.data(), n * 2);
    report = support::check_half_outputs(half, want_out, c.spec.out_dtype, "out");
    if (!report.ok) return ::testing::AssertionFailure() << report.message;
  }
  report = support::check_float_stats(got.lse, want.lse, "out_lse");
  if (!report.ok) return ::testing::AssertionFailure() << report.message;
  return ::testing::AssertionSuccess();
}

void run_case(const MergeSpec& spec) {
  SCOPED_TRACE(describe(spec));
  const HostMergeCase c(spec);
  const Result want = reference_result(c);
  DeviceMergeCase dev(c);
  MergeCall call(c, dev.o.get(), dev.lse.get(), dev.out.get(), dev.out_lse.get());
  Result first;
  for (int k = 0; k < stress::knobs().calls; ++k) {  // 20; a sanitizer run sets 2
    dev.poison();
    const Status s = merge_states(call.args, nullptr);
    ASSERT_TRUE(s) << s.to_string();
    MLAKIT_ASSERT_CUDA(cudaDeviceSynchronize());
    const Result got = dev.download(c);
    if (k == 0) {
      ASSERT_TRUE(matches_reference(c, got, want));
      first = got;
    } else {
      ASSERT_EQ(got.out, first.out) << "call " << k << " differs from the first";
      ASSERT_EQ(std::memcmp(got.lse.data(), first.lse.data(), got.lse.size() * 4), 0) << "call " << k;
    }
  }
}

TEST(MergeStatesGpu, MatchesTheReferenceOverDtypesShapesAndLayouts) {
  MLAKIT_SKIP_WITHOUT_GPU();
  std::vector<MergeSpec> specs;
  uint64_t seed = 1;
  for (DType in : {DType::kBF16, DType::kFP16, DType::kFP32}) {
    for (DType out : {DType::kBF16, DType::kFP16, DType::kFP32}) {
      specs.push_back({.num_states = 3, .row_shape = {32, 8}, .d = 128, .in_dtype = in, .out_dtype = out,
                       .seed = seed++});
    }
  }
  // Context-parallel decode shapes (MLA d 512, GQA d 128), many states, small d, 1 and 3 row dims.
  specs.push_back({.num_states = 2, .row_shape = {16, 1, 128}, .d = 512, .transposed_lse = true, .seed = seed++});
  specs.push_back({.num_states = 8, .row_shape = {64, 32}, .d = 128, .in_dtype = DType::kFP32, .seed = seed++});
  specs.push_back({.num_states = 128, .row_shape = {40}, .d = 64, .empty_fraction = 0.5, .seed = seed++});
  specs.push_back({.num_states = 33, .row_shape = {3, 7, 5}, .d = 16, .out_dtype = DType::kFP32, .seed = seed++});
  specs.push_back({.num_states = 1, .row_shape = {100}, .d = 256, .seed = seed++});
  specs.push_back({.num_states = 5, .row_shape = {77}, .d = 8, .in_dtype = DType::kFP16, .seed = seed++});
  // Bases.
  specs.push_back({.num_states = 4, .row_shape = {50, 4}, .d = 128, .lse_base = LseBase::kBase2, .seed = seed++});
  specs.push_back({.num_states = 4, .row_shape = {50, 4}, .d = 128, .lse_base = LseBase::kBase2,
                   .out_lse_base = LseBase::kBase2, .seed = seed++});
  specs.push_back({.num_states = 4, .row_shape = {50, 4}, .d = 128, .out_lse_base = LseBase::kBase2, .seed = seed++});
  // The one-value path: d not a multiple of a chunk, rows off 16 bytes, a misaligned start.
  specs.push_back({.num_states = 3, .row_shape = {20, 3}, .d = 7, .seed = seed++});
  specs.push_back({.num_states = 3, .row_shape = {20, 3}, .d = 128, .row_pad = 3, .seed = seed++});
  specs.push_back({.num_states = 2, .row_shape = {31}, .d = 64, .in_dtype = DType::kFP32, .o_offset = 1, .seed = seed++});
  specs.push_back({.num_states = 6, .row_shape = {9, 4}, .d = 96, .row_pad = 8, .transposed_lse = true,
                   .seed = seed++});
  // d 0: the merged LSEs alone.
  specs.push_back({.num_states = 3, .row_shape = {50, 3}, .d = 0, .seed = seed++});
  // Every state empty in most rows; a large merge (grid-stride loop over several waves).
  specs.push_back({.num_states = 3, .row_shape = {64}, .d = 128, .empty_fraction = 0.95, .seed = seed++});
  specs.push_back({.num_states = 2, .row_shape = {4096, 32}, .d = 128, .seed = seed++});
  for (const MergeSpec& spec : specs) {
    run_case(spec);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

TEST(MergeStatesGpu, InPlaceGivesTheOutOfPlaceResult) {
  MLAKIT_SKIP_WITHOUT_GPU();
  for (DType dtype : {DType::kBF16, DType::kFP32}) {
    const MergeSpec spec{.num_states = 4, .row_shape = {128, 16}, .d = 128, .in_dtype = dtype, .out_dtype = dtype,
                         .transposed_lse = true, .seed = 42};
    SCOPED_TRACE(describe(spec));
    const HostMergeCase c(spec);
    DeviceMergeCase dev(c);
    MergeCall call(c, dev.o.get(), dev.lse.get(), dev.out.get(), dev.out_lse.get());
    dev.poison();
    ASSERT_TRUE(merge_states(call.args, nullptr));
    MLAKIT_ASSERT_CUDA(cudaDeviceSynchronize());
    const Result want = dev.download(c);
    // out = o[2], out_lse = lse[2].
    call.args.out = call.o_views[2];
    call.args.out_lse = call.lse_views[2];
    ASSERT_TRUE(merge_states(call.args, nullptr));
    MLAKIT_ASSERT_CUDA(cudaDeviceSynchronize());
    const std::vector<uint8_t> o = dev.o.download<uint8_t>();
    const std::vector<float> lse = dev.lse.download<float>();
    const std::size_t elem = dtype_size(dtype);
    ASSERT_EQ(std::memcmp(o.data() + 2 * c.o_state_stride * elem, want.out.data(), want.out.size()), 0);
    // lse[2] is stored transposed: compare through its view.
    const TensorRef view = c.lse_view(lse.data(), 2);
    for (int64_t i0 = 0; i0 < 128; ++i0) {
      for (int64_t i1 = 0; i1 < 16; ++i1) {
        const float got = static_cast<const float*>(view.data)[i0 * view.stride[0] + i1 * view.stride[1]];
        ASSERT_EQ(std::memcmp(&got, &want.lse[i0 * 16 + i1], 4), 0) << i0 << " " << i1;
      }
    }
  }
}

TEST(MergeStatesGpu, ACapturedGraphRepeatsTheEagerResult) {
  MLAKIT_SKIP_WITHOUT_GPU();
  const MergeSpec spec{.num_states = 4, .row_shape = {256, 8}, .d = 128, .seed = 7};
  const HostMergeCase c(spec);
  DeviceMergeCase dev(c);
  MergeCall call(c, dev.o.get(), dev.lse.get(), dev.out.get(), dev.out_lse.get());
  cudaStream_t stream;
  MLAKIT_ASSERT_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  dev.poison();
  ASSERT_TRUE(merge_states(call.args, stream));
  MLAKIT_ASSERT_CUDA(cudaStreamSynchronize(stream));
  const Result eager = dev.download(c);
  cudaGraph_t graph;
  MLAKIT_ASSERT_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const Status captured = merge_states(call.args, stream);
  MLAKIT_ASSERT_CUDA(cudaStreamEndCapture(stream, &graph));
  ASSERT_TRUE(captured) << captured.to_string();
  cudaGraphExec_t exec;
  MLAKIT_ASSERT_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < 3; ++replay) {
    dev.poison();
    MLAKIT_ASSERT_CUDA(cudaGraphLaunch(exec, stream));
    MLAKIT_ASSERT_CUDA(cudaStreamSynchronize(stream));
    const Result got = dev.download(c);
    ASSERT_EQ(got.out, eager.out) << "replay " << replay;
    ASSERT_EQ(std::memcmp(got.lse.data(), eager.lse.data(), got.lse.size() * 4), 0) << "replay " << replay;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

TEST(MergeStatesGpu, HostMemoryIsAnErrorNamingTheArgument) {
  MLAKIT_SKIP_WITHOUT_GPU();
  const MergeSpec spec{.num_states = 2, .row_shape = {8}, .d = 64};
  HostMergeCase c(spec);
  DeviceMergeCase dev(c);
  MergeCall call(c, dev.o.get(), dev.lse.get(), dev.out.get(), dev.out_lse.get());
  std::vector<float> host_lse(c.lse);
  call.lse_views[1].data = host_lse.data() + c.rows;
  const Status s = merge_states(call.args, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  EXPECT_NE(s.message().find("merge_states: lse[1]"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace mlakit::testing
