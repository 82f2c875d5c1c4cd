// The sparse MLA prefill on the GPU against the float64 CPU reference: s_q 1 to 1024, s_kv 0
// to 8192 with topk below and above it, d_qk 576 and 512, h_q 16 / 64 / 128, invalid and
// duplicate indices, tokens with no valid index, padded (strided) views of every tensor,
// topk_length, sinks, natural-log statistics, peaked logits; NaN-poisoned outputs whose
// padding must stay untouched; validation of the device path.
//
// Reference cost is s_q * h_q * valid keys * 1088 float64 multiply-adds: the cases below
// total ~2e10 (about a second over the GPU machine's cores).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "gpu_test_util.h"
#include "mlakit/mla_sparse_prefill.h"
#include "reference/host_numeric.h"
#include "support/accuracy.h"
#include "support/sparse_prefill_case.h"

namespace mlakit::testing {
namespace {

constexpr uint16_t kPoisonBf16 = 0x7fc0;
constexpr uint32_t kPoisonF32 = 0x7fc00000u;

struct PrefillCase {
  std::string name;
  support::SparsePrefillSpec spec;
};

std::vector<PrefillCase> prefill_cases() {
  using S = support::SparsePrefillSpec;
  return {
      // s_q = 1: one CTA per row tile; the only token must have valid keys.
      {"sq1_skv32_hq16_d576_topk64_above_skv_sink",
       S{.s_q = 1, .s_kv = 32, .h_q = 16, .topk = 64, .invalid_fraction = 0.4, .empty_token = -1,
         .with_sink = true, .seed = 1}},
      // One CTA walking 512 key tiles, topk twice s_kv.
      {"sq1_skv8192_hq16_d576_topk16384",
       S{.s_q = 1, .s_kv = 8192, .h_q = 16, .topk = 16384, .empty_token = -1, .seed = 2}},
      {"sq1_skv100_hq128_d512_all_invalid",
       S{.s_q = 1, .s_kv = 100, .h_q = 128, .d_qk = 512, .topk = 128, .empty_token = 0, .strided = true,
         .seed = 3}},
      {"sq62_skv300_hq64_d512_topk128_strided_len",
       S{.s_q = 62, .s_kv = 300, .h_q = 64, .d_qk = 512, .topk = 128, .strided = true, .with_topk_length = true,
         .seed = 4}},
      {"sq62_skv8192_hq128_d576_topk512_near_end_len_natural",
       S{.s_q = 62, .s_kv = 8192, .h_q = 128, .topk = 512, .window = 1000, .empty_token = 61,
         .with_topk_length = true, .lse_base = LseBase::kNatural, .seed = 5}},
      {"sq213_skv8192_hq16_d576_topk2048_strided_sink",
       S{.s_q = 213, .s_kv = 8192, .h_q = 16, .topk = 2048, .invalid_fraction = 0.3, .empty_token = 100,
         .strided = true, .with_sink = true, .seed = 6}},
      {"sq213_skv1000_hq128_d512_topk128_sink_natural_peaked",
       S{.s_q = 213, .s_kv = 1000, .h_q = 128, .d_qk = 512, .topk = 128, .duplicate_fraction = 0.2,
         .with_sink = true, .lse_base = LseBase::kNatural, .sm_scale = 0.5f, .seed = 7}},
      // topk far above s_kv: most entries invalid, the valid ones often duplicates.
      {"sq1024_skv64_hq64_d512_topk128_above_skv_strided",
       S{.s_q = 1024, .s_kv = 64, .h_q = 64, .d_qk = 512, .topk = 128, .invalid_fraction = 0.6,
         .duplicate_fraction = 0.2, .empty_token = 1023, .strided = true, .seed = 8}},
      {"sq1024_skv2048_hq32_d576_topk64_len_sink",
       S{.s_q = 1024, .s_kv = 2048, .h_q = 32, .topk = 64, .with_topk_length = true, .with_sink = true,
         .seed = 9}},
      // No kv rows at all: every index is invalid, every row empty.
      {"sq62_skv0_hq16_d576_topk64", S{.s_q = 62, .s_kv = 0, .h_q = 16, .topk = 64, .seed = 10}},
  };
}

// Every case on both kernels (the Hopper one only on compute capability 9.0).
class MlaSparsePrefillSweep : public ::testing::TestWithParam<std::tuple<PrefillCase, MlaKernel>> {};

TEST_P(MlaSparsePrefillSweep, MatchesReference) {
  MLAKIT_SKIP_WITHOUT_GPU();
  const MlaKernel kernel = std::get<1>(GetParam());
  if (kernel == MlaKernel::kSm90 && !is_hopper()) GTEST_SKIP() << "needs a compute capability 9.0 GPU";
  const support::HostSparsePrefillCase c = support::make_sparse_prefill_case(std::get<0>(GetParam()).spec);
  const support::SparsePrefillSpec& s = c.spec;
  const support::SparsePrefillReference ref = support::run_sparse_prefill_reference(c);

  DeviceBuffer q(c.q), kv(c.kv), indices(c.indices);
  DeviceBuffer topk_length(std::max<size_t>(c.topk_length.size(), 1) * 4), sink(std::max<size_t>(c.sink.size(), 1) * 4);
  if (!c.topk_length.empty()) topk_length.upload(c.topk_length.data(), c.topk_length.size() * 4);
  if (!c.sink.empty()) sink.upload(c.sink.data(), c.sink.size() * 4);
  DeviceBuffer out(c.out_stored() * 2), max_logits(c.stat_stored() * 4), lse(c.stat_stored() * 4);
  out.fill16(kPoisonBf16);
  max_logits.fill32(kPoisonF32);
  lse.fill32(kPoisonF32);
  MlaSparsePrefillArgs args = c.args(q.get(), kv.get(), indices.get(), topk_length.get(), sink.get(), out.get(),
                                     max_logits.get(), lse.get());
  args.kernel = kernel;
  const Status st = mla_sparse_prefill(args, nullptr);
  ASSERT_TRUE(st) << st.to_string();
  MLAKIT_ASSERT_CUDA(cudaDeviceSynchronize());

  // Logical elements out of the (possibly padded) buffers; padding must keep the poison.
  const auto out_stored = out.download<uint16_t>();
  const auto max_stored = max_logits.download<uint32_t>();
  const auto lse_stored = lse.download<uint32_t>();
  std::vector<uint16_t> got_out(s.s_q * s.h_q * 512);
  std::vector<float> got_max(s.s_q * s.h_q), got_lse(s.s_q * s.h_q);
  std::vector<bool> logical_out(out_stored.size()), logical_stat(lse_stored.size());
  for (int64_t t = 0; t < s.s_q; ++t) {
    for (int h = 0; h < s.h_q; ++h) {
      const int64_t row = t * s.h_q + h;
      for (int d = 0; d < 512; ++d) {
        got_out[row * 512 + d] = out_stored[c.out_at(t, h, d)];
        logical_out[c.out_at(t, h, d)] = true;
      }
      got_max[row] = host::bits_to_float(max_stored[c.stat_at(t, h)]);
      got_lse[row] = host::bits_to_float(lse_stored[c.stat_at(t, h)]);
      logical_stat[c.stat_at(t, h)] = true;
      // docs/contract.md, Empty rows: a row with nothing to attend is exactly 0 (the tolerance would hide 1e-3).
      if (std::isinf(ref.lse[row])) {
        for (int d = 0; d < 512; ++d) {
          ASSERT_EQ(host::bf16_to_float(got_out[row * 512 + d]), 0.f) << "empty row " << t << ", head " << h;
        }
      }
    }
  }
  for (size_t i = 0; i < out_stored.size(); ++i) {
    if (!logical_out[i]) ASSERT_EQ(out_stored[i], kPoisonBf16) << "out padding written at " << i;
  }
  for (size_t i = 0; i < lse_stored.size(); ++i) {
    if (logical_stat[i]) continue;
    ASSERT_EQ(lse_stored[i], kPoisonF32) << "lse padding written at " << i;
    ASSERT_EQ(max_stored[i], kPoisonF32) << "max_logits padding written at " << i;
  }

  const auto o = support::check_half_outputs(got_out, ref.out, DType::kBF16, "out");
  EXPECT_TRUE(o.ok) << o.message << " (cosine diff " << o.cosine_diff << ")";
  const auto m = support::check_float_stats(got_max, ref.max_logits, "max_logits");
  EXPECT_TRUE(m.ok) << m.message;
  const auto l = support::check_float_stats(got_lse, ref.lse, "lse");
  EXPECT_TRUE(l.ok) << l.message;
}

INSTANTIATE_TEST_SUITE_P(Sweep, MlaSparsePrefillSweep,
                         ::testing::Combine(::testing::ValuesIn(prefill_cases()),
                                            ::testing::Values(MlaKernel::kPortable, MlaKernel::kSm90)),
                         [](const ::testing::TestParamInfo<std::tuple<PrefillCase, MlaKernel>>& info) {
                           return std::get<0>(info.param).name +
                                  (std::get<1>(info.param) == MlaKernel::kSm90 ? "_sm90" : "_portable");
                         });

// Two launches of the same problem give the same bits (no races, no order dependence), and a
// graph capture replays them.
TEST(MlaSparsePrefill, DeterministicAndGraphCapturable) {
  MLAKIT_SKIP_WITHOUT_GPU();
  const support::HostSparsePrefillCase c = support::make_sparse_prefill_case(
      {.s_q = 37, .s_kv = 500, .h_q = 64, .topk = 256, .with_topk_length = true, .with_sink = true, .seed = 21});
  DeviceBuffer q(c.q), kv(c.kv), indices(c.indices), lengths(c.topk_length), sink(c.sink);
  DeviceBuffer out(c.out_stored() * 2), max_logits(c.stat_stored() * 4), lse(c.stat_stored() * 4);
  const MlaSparsePrefillArgs args =
      c.args(q.get(), kv.get(), indices.get(), lengths.get(), sink.get(), out.get(), max_logits.get(), lse.get());
  cudaStream_t stream;
  MLAKIT_ASSERT_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  ASSERT_TRUE(mla_sparse_prefill(args, stream));
  MLAKIT_ASSERT_CUDA(cudaStreamSynchronize(stream));
  const auto first_out = out.download<uint16_t>();
  const auto first_lse = lse.download<uint32_t>();
  const auto first_max = max_logits.download<uint32_t>();

  cudaGraph_t graph;
  MLAKIT_ASSERT_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  const Status captured = mla_sparse_prefill(args, stream);
  MLAKIT_ASSERT_CUDA(cudaStreamEndCapture(stream, &graph));
  ASSERT_TRUE(captured) << captured.to_string();
  cudaGraphExec_t exec;
  MLAKIT_ASSERT_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  out.fill16(kPoisonBf16);
  lse.fill32(kPoisonF32);
  max_logits.fill32(kPoisonF32);
  MLAKIT_ASSERT_CUDA(cudaGraphLaunch(exec, stream));
  MLAKIT_ASSERT_CUDA(cudaStreamSynchronize(stream));
  EXPECT_EQ(out.download<uint16_t>(), first_out);
  EXPECT_EQ(lse.download<uint32_t>(), first_lse);
  EXPECT_EQ(max_logits.download<uint32_t>(), first_max);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

TEST(MlaSparsePrefillValidation, DevicePathErrors) {
  MLAKIT_SKIP_WITHOUT_GPU();
  const support::HostSparsePrefillCase c =
      support::make_sparse_prefill_case({.s_q = 4, .s_kv = 64, .h_q = 16, .topk = 64, .seed = 3});
  DeviceBuffer q(c.q), kv(c.kv), indices(c.indices), out(c.out_stored() * 2), max_logits(c.stat_stored() * 4),
      lse(c.stat_stored() * 4);
  MlaSparsePrefillArgs args =
      c.args(q.get(), kv.get(), indices.get(), nullptr, nullptr, out.get(), max_logits.get(), lse.get());
  args.indices.data = const_cast<int32_t*>(c.indices.data());  // host memory
  Status s = mla_sparse_prefill(args, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("indices: expected device memory"), std::string::npos) << s.message();
  args.indices.data = indices.get();
  args.kv.stride[0] = 580;  // rows no longer 16-byte aligned
  s = mla_sparse_prefill(args, nullptr);
  EXPECT_NE(s.message().find("kv.stride[0]: expected a multiple of 8"), std::string::npos) << s.message();
  args.kv.stride[0] = 576;
  args.q.shape[2] = args.kv.shape[2] = 192;
  s = mla_sparse_prefill(args, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kUnsupported) << s.to_string();
  args.q.shape[2] = args.kv.shape[2] = 576;
  args.kernel = static_cast<MlaKernel>(7);
  s = mla_sparse_prefill(args, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  EXPECT_NE(s.message().find("kernel: expected kAuto, kPortable or kSm90, got 7"), std::string::npos) << s.message();
  args.kernel = MlaKernel::kSm90;
  s = mla_sparse_prefill(args, nullptr);
  if (is_hopper()) {
    EXPECT_TRUE(s) << s.to_string();
  } else {
    EXPECT_EQ(s.code(), StatusCode::kUnsupportedArchitecture) << s.to_string();
  }
  args.kernel = MlaKernel::kAuto;
  s = mla_sparse_prefill(args, nullptr);
  EXPECT_TRUE(s) << s.to_string();
  MLAKIT_ASSERT_CUDA(cudaDeviceSynchronize());
}

}  // namespace
}  // namespace mlakit::testing
