// GPU behaviour of the dense MLA decode API beyond the shape sweep: CUDA-graph capture and
// replay, one plan shared by several layers, strided views, device-side validation errors,
// and invalid block-table entries.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "gpu_test_util.h"
#include "reference/host_numeric.h"
#include "support/accuracy.h"
#include "support/decode_case.h"

namespace mlakit::testing {
namespace {

support::HostDecodeCase small_case(uint64_t seed, int s_q = 2, bool causal = true, int page_size = 64) {
  support::DecodeCaseSpec spec;
  spec.seqlens = support::varlen_lengths(5, 700, 1, seed);
  spec.s_q = s_q;
  spec.h_q = 16;
  spec.h_kv = 1;
  spec.page_size = page_size;
  spec.causal = causal;
  spec.seed = seed;
  return support::make_decode_case(spec);
}

void expect_matches(const support::HostDecodeCase& hc, const std::vector<uint16_t>& out,
                    const std::vector<float>& lse) {
  const support::ReferenceResult ref = support::run_reference(hc);
  const auto o = support::check_half_outputs(out, ref.out, hc.spec.dtype, "out");
  EXPECT_TRUE(o.ok) << o.message;
  const auto l = support::check_float_stats(lse, ref.lse, "lse");
  EXPECT_TRUE(l.ok) << l.message;
}

TEST(MlaDecodeGraph, CaptureAndReplayFollowNewLengths) {
  MLAKIT_SKIP_WITHOUT_GPU();
  support::HostDecodeCase hc = small_case(5);
  DeviceDecodeCase d(hc);
  DeviceBuffer ws = make_workspace(hc.problem());
  cudaStream_t stream;
  MLAKIT_ASSERT_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  // Eager run for the expected bits.
  MlaDecodePlan plan;
  ASSERT_TRUE(mla_decode_plan(hc.problem(), d.args.cache_seqlens, ws.get(), ws.bytes(), stream, &plan));
  ASSERT_TRUE(mla_decode(d.args, plan, stream));
  MLAKIT_ASSERT_CUDA(cudaStreamSynchronize(stream));
  const auto eager_out = d.out.download<uint16_t>();
  const auto eager_lse = d.lse.download<float>();

  // Capture plan + decode, replay on poisoned outputs: bit-identical.
  cudaGraph_t graph;
  MLAKIT_ASSERT_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  MlaDecodePlan captured_plan;
  Status plan_status = mla_decode_plan(hc.problem(), d.args.cache_seqlens, ws.get(), ws.bytes(), stream,
                                       &captured_plan);
  Status run_status = mla_decode(d.args, captured_plan, stream);
  MLAKIT_ASSERT_CUDA(cudaStreamEndCapture(stream, &graph));
  ASSERT_TRUE(plan_status) << plan_status.to_string();
  ASSERT_TRUE(run_status) << run_status.to_string();
  cudaGraphExec_t exec;
  MLAKIT_ASSERT_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  d.poison_outputs();
  MLAKIT_ASSERT_CUDA(cudaGraphLaunch(exec, stream));
  MLAKIT_ASSERT_CUDA(cudaStreamSynchronize(stream));
  EXPECT_EQ(d.out.download<uint16_t>(), eager_out);
  const auto replay_lse = d.lse.download<float>();
  EXPECT_EQ(0, std::memcmp(replay_lse.data(), eager_lse.data(), eager_lse.size() * 4));
  expect_matches(hc, eager_out, eager_lse);

  // New lengths in the same device buffer (a later decoding step): the replayed plan follows.
  support::HostDecodeCase next = hc;
  for (std::size_t i = 0; i < next.seqlens.size(); ++i) next.seqlens[i] = next.seqlens[i] * (i % 3) / 3;
  d.seqlens.upload(next.seqlens.data(), next.seqlens.size() * 4);
  d.poison_outputs();
  MLAKIT_ASSERT_CUDA(cudaGraphLaunch(exec, stream));
  MLAKIT_ASSERT_CUDA(cudaStreamSynchronize(stream));
  expect_matches(next, d.out.download<uint16_t>(), d.lse.download<float>());

  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

TEST(MlaDecodePlanReuse, OnePlanServesEveryLayer) {
  MLAKIT_SKIP_WITHOUT_GPU();
  support::HostDecodeCase layer0 = small_case(11);
  support::DecodeCaseSpec spec1 = layer0.spec;
  spec1.seed = 12;  // same lengths and page layout, different q and cache contents
  support::HostDecodeCase layer1 = support::make_decode_case(spec1);
  DeviceDecodeCase d0(layer0), d1(layer1);
  DeviceBuffer ws = make_workspace(layer0.problem());
  MlaDecodePlan plan;
  ASSERT_TRUE(mla_decode_plan(layer0.problem(), d0.args.cache_seqlens, ws.get(), ws.bytes(), nullptr, &plan));
  ASSERT_TRUE(mla_decode(d0.args, plan, nullptr));
  ASSERT_TRUE(mla_decode(d1.args, plan, nullptr));
  MLAKIT_ASSERT_CUDA(cudaDeviceSynchronize());
  expect_matches(layer0, d0.out.download<uint16_t>(), d0.lse.download<float>());
  expect_matches(layer1, d1.out.download<uint16_t>(), d1.lse.download<float>());
}

// Copies `rows` rows of `row_bytes` into a buffer of `pitch_bytes` per row (and back).
DeviceBuffer padded_copy(const DeviceBuffer& src, std::size_t rows, std::size_t row_bytes, std::size_t pitch_bytes) {
  DeviceBuffer dst(rows * pitch_bytes);
  std::vector<char> nan_fill(rows * pitch_bytes, static_cast<char>(0x7f));
  dst.upload(nan_fill.data(), nan_fill.size());
  EXPECT_EQ(cudaMemcpy2D(dst.get(), pitch_bytes, src.get(), row_bytes, row_bytes, rows, cudaMemcpyDeviceToDevice),
            cudaSuccess);
  return dst;
}
template <typename T>
std::vector<T> unpad(const DeviceBuffer& src, std::size_t rows, std::size_t row_bytes, std::size_t pitch_bytes) {
  std::vector<T> out(rows * row_bytes / sizeof(T));
  EXPECT_EQ(cudaMemcpy2D(out.data(), row_bytes, src.get(), pitch_bytes, row_bytes, rows, cudaMemcpyDeviceToHost),
            cudaSuccess);
  return out;
}

TEST(MlaDecodeViews, StridedTensorsWork) {
  MLAKIT_SKIP_WITHOUT_GPU();
  const support::HostDecodeCase hc = small_case(21, 3, true);
  DeviceDecodeCase d(hc);
  const int64_t b = hc.b, s_q = hc.spec.s_q, h_q = hc.spec.h_q, page = hc.spec.page_size;
  const int64_t q_pitch = 640, kv_pitch = 608, out_pitch = 520, lse_pitch = s_q + 5;
  DeviceBuffer q = padded_copy(d.q, b * s_q * h_q, 576 * 2, q_pitch * 2);
  DeviceBuffer kv = padded_copy(d.kv, hc.num_blocks * page, 576 * 2, kv_pitch * 2);
  DeviceBuffer out(b * s_q * h_q * out_pitch * 2), lse(b * h_q * lse_pitch * 4);
  out.fill16(0x7fc0);
  lse.fill32(0x7fc00000u);

  MlaDecodeArgs a = d.args;
  a.q = make_tensor(q.get(), DType::kBF16, {b, s_q, h_q, 576}, {s_q * h_q * q_pitch, h_q * q_pitch, q_pitch, 1});
  a.kv_cache = make_tensor(kv.get(), DType::kBF16, {hc.num_blocks, page, 1, 576},
                           {page * kv_pitch, kv_pitch, kv_pitch, 1});
  a.out = make_tensor(out.get(), DType::kBF16, {b, s_q, h_q, 512}, {s_q * h_q * out_pitch, h_q * out_pitch, out_pitch, 1});
  a.lse = make_tensor(lse.get(), DType::kFP32, {b, h_q, s_q}, {h_q * lse_pitch, lse_pitch, 1});
  DeviceBuffer ws = make_workspace(hc.problem());
  MlaDecodePlan plan;
  ASSERT_TRUE(mla_decode_plan(hc.problem(), a.cache_seqlens, ws.get(), ws.bytes(), nullptr, &plan));
  Status s = mla_decode(a, plan, nullptr);
  ASSERT_TRUE(s) << s.to_string();
  MLAKIT_ASSERT_CUDA(cudaDeviceSynchronize());
  expect_matches(hc, unpad<uint16_t>(out, b * s_q * h_q, 512 * 2, out_pitch * 2),
                 unpad<float>(lse, b * h_q, s_q * 4, lse_pitch * 4));
}

class MlaDecodeDeviceValidation : public ::testing::Test {
 protected:
  void SetUp() override {
    MLAKIT_SKIP_WITHOUT_GPU();
    hc_ = small_case(31);
    d_ = std::make_unique<DeviceDecodeCase>(hc_);
    ws_ = make_workspace(hc_.problem());
    ASSERT_TRUE(mla_decode_plan(hc_.problem(), d_->args.cache_seqlens, ws_.get(), ws_.bytes(), nullptr, &plan_));
  }
  void expect_error(const MlaDecodeArgs& a, const MlaDecodePlan& plan, StatusCode code,
                    const std::vector<std::string>& fragments) {
    Status s = mla_decode(a, plan, nullptr);
    ASSERT_FALSE(s.is_ok());
    EXPECT_EQ(s.code(), code) << s.to_string();
    for (const auto& f : fragments) EXPECT_NE(s.message().find(f), std::string::npos) << s.message();
  }
  support::HostDecodeCase hc_;
  std::unique_ptr<DeviceDecodeCase> d_;
  DeviceBuffer ws_;
  MlaDecodePlan plan_;
};

TEST_F(MlaDecodeDeviceValidation, HostPointerIsRejected) {
  std::vector<uint16_t> host_q(hc_.q);
  MlaDecodeArgs a = d_->args;
  a.q.data = host_q.data();
  expect_error(a, plan_, StatusCode::kInvalidArgument, {"q", "expected device memory"});
}

TEST_F(MlaDecodeDeviceValidation, MisalignedRowsAreRejected) {
  MlaDecodeArgs a = d_->args;
  a.q.data = static_cast<char*>(a.q.data) + 2;
  expect_error(a, plan_, StatusCode::kInvalidArgument, {"q", "16-byte aligned"});
  a = d_->args;
  a.kv_cache.stride[1] = 580;  // rows 1160 bytes apart: not 16-byte aligned
  a.kv_cache.stride[0] = 580 * hc_.spec.page_size;
  expect_error(a, plan_, StatusCode::kInvalidArgument, {"kv_cache.stride[1]", "multiple of 8"});
}

TEST_F(MlaDecodeDeviceValidation, PlanOfAnotherProblemIsRejected) {
  MlaDecodePlan other = plan_;
  other.problem.h_q = 32;
  expect_error(d_->args, other, StatusCode::kInvalidArgument, {"h_q", "expected 32", "got 16"});
  expect_error(d_->args, MlaDecodePlan{}, StatusCode::kInvalidArgument, {"plan", "empty plan"});
}

TEST_F(MlaDecodeDeviceValidation, PlanChecksWorkspaceAndLengths) {
  MlaDecodePlan p;
  Status s = mla_decode_plan(hc_.problem(), d_->args.cache_seqlens, ws_.get(), ws_.bytes() - 1, nullptr, &p);
  EXPECT_EQ(s.code(), StatusCode::kWorkspaceTooSmall) << s.to_string();
  s = mla_decode_plan(hc_.problem(), d_->args.cache_seqlens, static_cast<char*>(ws_.get()) + 16, ws_.bytes(),
                      nullptr, &p);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  EXPECT_NE(s.message().find("256-byte aligned"), std::string::npos) << s.message();
  std::vector<int32_t> host_lens(hc_.seqlens);
  TensorRef lens = d_->args.cache_seqlens;
  lens.data = host_lens.data();
  s = mla_decode_plan(hc_.problem(), lens, ws_.get(), ws_.bytes(), nullptr, &p);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  EXPECT_NE(s.message().find("cache_seqlens"), std::string::npos) << s.message();
}

// Decodes hc, whose sequence 2 has a bad block-table entry: its rows are NaN, sequence 0's not.
void expect_nan_rows_only_for_sequence_2(const support::HostDecodeCase& hc) {
  GpuDecodeResult gpu = run_gpu_decode(hc);
  ASSERT_TRUE(gpu.status) << gpu.status.to_string();
  expect_matches(hc, gpu.out, gpu.lse);  // the reference gives NaN rows for sequence 2 too
  const int64_t row_elems = hc.spec.s_q * hc.spec.h_q * 512;
  EXPECT_TRUE(std::isnan(host::bf16_to_float(gpu.out[2 * row_elems])));
  EXPECT_FALSE(std::isnan(host::bf16_to_float(gpu.out[0])));
}

TEST(MlaDecodeBlockTable, OutOfRangeEntryGivesNanRowsOnlyForItsSequence) {
  MLAKIT_SKIP_WITHOUT_GPU();
  support::HostDecodeCase hc = small_case(41, 1, false);
  hc.block_table[2 * hc.max_blocks_per_seq + 0] = static_cast<int32_t>(hc.num_blocks + 5);  // sequence 2
  expect_nan_rows_only_for_sequence_2(hc);
}

// Page 16: the tile's four boxes come from four producer warps; a bad entry in the second box
// (looked up by lane 1, loaded by warp 1) still marks the stage for the consumers.
TEST(MlaDecodeBlockTable, OutOfRangeEntryInALaterBoxOfA16KeyPageTile) {
  MLAKIT_SKIP_WITHOUT_GPU();
  support::HostDecodeCase hc = small_case(41, 1, false, 16);
  ASSERT_GT(hc.seqlens[2], 16) << "sequence 2 must reach its second page";
  hc.block_table[2 * hc.max_blocks_per_seq + 1] = -3;
  expect_nan_rows_only_for_sequence_2(hc);
}

}  // namespace
}  // namespace mlakit::testing
