// The sparse decode over DeepSeek V4 tokens (d_qk 512, 584-byte cache) and with a second cache
// (either layout), on both kernels, against the CPU reference: h_q 16-128, s_q 1-4, topk and
// extra_topk 64-2048 with lengths (zero, clamped past topk), invalid and duplicate indices,
// page sizes 1/2/61/64/69/576 for either cache, sinks, NaN in every byte no counted index
// lists and in the outputs; each case run three times on the same inputs, bitwise equal.
#include <gtest/gtest.h>

#include <algorithm>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "gpu_test_util.h"
#include "mlakit/mla_sparse_decode.h"
#include "support/accuracy.h"
#include "support/sparse_decode_case.h"

namespace mlakit::testing {
namespace {

struct V4Case {
  support::SparseCaseSpec spec;
  std::string name() const {
    std::ostringstream s;
    s << (spec.v4 ? "v4" : "v32") << "_b" << spec.b << "_sq" << spec.s_q << "_hq" << spec.h_q << "_topk" << spec.topk
      << "_page" << spec.page_size << (spec.with_topk_length ? "_len" : "");
    if (spec.extra_topk > 0) {
      s << "_extra" << spec.extra_topk << "_page" << spec.extra_page_size << (spec.with_extra_topk_length ? "_len" : "");
    }
    return s.str() + (spec.with_sink ? "_sink" : "");
  }
};

std::vector<V4Case> v4_cases() {
  std::vector<V4Case> cases;
  const int h_qs[] = {16, 32, 64, 128};
  const int topks[] = {64, 128, 512, 2048};
  const int extra_topks[] = {0, 64, 512, 1024, 2048};
  const int64_t pages[] = {1, 2, 61, 64, 69, 576};
  for (int i = 0; i < 24; ++i) {
    support::SparseCaseSpec s;
    s.v4 = i % 6 != 5;  // every sixth case: the V3.2 layout with a second cache
    s.h_q = h_qs[i % 4];
    s.s_q = 1 + (i / 4) % 4;
    s.topk = topks[(i / 2) % 4];
    s.extra_topk = s.v4 ? extra_topks[i % 5] : 512;
    s.b = std::max<int64_t>(1, 8192 / (s.s_q * (s.topk + s.extra_topk)));  // keep the CPU reference fast
    s.b = std::min<int64_t>(s.b, 9);
    s.page_size = pages[i % 6];
    s.num_blocks = (std::max(s.topk, 256) * 2 + s.page_size - 1) / s.page_size + 1;
    s.extra_page_size = pages[(i + 3) % 6];
    s.extra_num_blocks = (std::max(s.extra_topk, 256) + s.extra_page_size - 1) / s.extra_page_size + 1;
    s.with_topk_length = i % 3 == 1;
    s.with_extra_topk_length = s.extra_topk > 0 && i % 4 == 2;
    s.with_sink = i % 5 == 3;
    s.seed = 500 + i;
    cases.push_back({s});
  }
  return cases;
}

class MlaSparseDecodeV4 : public ::testing::TestWithParam<std::tuple<V4Case, MlaKernel>> {};

TEST_P(MlaSparseDecodeV4, MatchesReferenceAndRepeatsBitwise) {
  MLAKIT_SKIP_WITHOUT_GPU();
  const MlaKernel kernel = std::get<1>(GetParam());
  if (kernel == MlaKernel::kSm90 && !is_hopper()) GTEST_SKIP() << "needs a compute capability 9.0 GPU";
  support::HostSparseCase c = support::make_sparse_case(std::get<0>(GetParam()).spec);
  if (c.spec.with_topk_length && c.spec.b >= 3) {
    c.main.lengths[0] = 0;                 // no first-cache key
    c.main.lengths[1] = c.spec.topk + 5;   // clamped to topk
  }
  support::poison_unlisted_tokens(c);
  const support::SparseReferenceResult ref = support::run_sparse_reference(c);

  auto lengths_of = [](const std::vector<int32_t>& l) {
    DeviceBuffer d(std::max<size_t>(l.size(), 1) * 4);
    if (!l.empty()) d.upload(l.data(), l.size() * 4);
    return d;
  };
  DeviceBuffer q(c.q), cache(c.main.bytes), indices(c.main.indices), out(c.out_elems() * 2), lse(c.lse_elems() * 4);
  DeviceBuffer lengths = lengths_of(c.main.lengths), sink(std::max<size_t>(c.sink.size(), 1) * 4);
  if (!c.sink.empty()) sink.upload(c.sink.data(), c.sink.size() * 4);
  DeviceBuffer extra_cache(std::max<size_t>(c.extra.bytes.size(), 16)),
      extra_indices(std::max<size_t>(c.extra.indices.size(), 1) * 4), extra_lengths = lengths_of(c.extra.lengths);
  if (c.has_extra()) {
    extra_cache.upload(c.extra.bytes.data(), c.extra.bytes.size());
    extra_indices.upload(c.extra.indices.data(), c.extra.indices.size() * 4);
  }
  MlaSparseDecodeArgs args =
      c.args(q.get(), cache.get(), indices.get(), lengths.get(), sink.get(), out.get(), DType::kBF16, lse.get());
  c.with_extra(&args, extra_cache.get(), extra_indices.get(), extra_lengths.get());

  MlaSparseDecodeProblem problem = c.problem();
  problem.kernel = kernel;
  std::size_t bytes = 0;
  ASSERT_TRUE(mla_sparse_decode_workspace_size(problem, &bytes));
  DeviceBuffer ws(bytes);
  MlaDecodePlan plan;
  Status s = mla_sparse_decode_plan(problem, args.topk_length, args.extra_topk_length, ws.get(), bytes, nullptr, &plan);
  ASSERT_TRUE(s) << s.to_string();
  std::vector<uint16_t> first_out;
  std::vector<uint32_t> first_lse;
  for (int run = 0; run < 3; ++run) {
    out.fill16(0x7fc0);
    lse.fill32(0x7fc00000u);
    s = mla_sparse_decode_fp8(args, plan, nullptr);
    ASSERT_TRUE(s) << s.to_string();
    MLAKIT_ASSERT_CUDA(cudaDeviceSynchronize());
    if (run == 0) {
      first_out = out.download<uint16_t>();
      first_lse = lse.download<uint32_t>();
      const auto o = support::check_half_outputs(first_out, ref.out, DType::kBF16, "out");
      EXPECT_TRUE(o.ok) << o.message << " (cosine diff " << o.cosine_diff << ")";
      const auto l = support::check_float_stats(lse.download<float>(), ref.lse, "lse");
      EXPECT_TRUE(l.ok) << l.message;
    } else {
      ASSERT_EQ(out.download<uint16_t>(), first_out) << "run " << run << " differs from run 0";
      ASSERT_EQ(lse.download<uint32_t>(), first_lse) << "run " << run << " differs from run 0";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Sweep, MlaSparseDecodeV4,
                         ::testing::Combine(::testing::ValuesIn(v4_cases()),
                                            ::testing::Values(MlaKernel::kPortable, MlaKernel::kSm90)),
                         [](const ::testing::TestParamInfo<std::tuple<V4Case, MlaKernel>>& info) {
                           return std::get<0>(info.param).name() +
                                  (std::get<1>(info.param) == MlaKernel::kSm90 ? "_sm90" : "_portable");
                         });

// The plan must be made for the decode's second cache: its extra_topk and its lengths tensor.
TEST(MlaSparseDecodeV4Validation, PlanForAnotherSecondCache) {
  MLAKIT_SKIP_WITHOUT_GPU();
  support::HostSparseCase c = support::make_sparse_case({.b = 2, .s_q = 1, .h_q = 16, .topk = 64, .seed = 3,
                                                         .v4 = true, .extra_topk = 64, .extra_num_blocks = 2,
                                                         .extra_page_size = 64});
  DeviceBuffer q(c.q), cache(c.main.bytes), indices(c.main.indices), out(c.out_elems() * 2), lse(c.lse_elems() * 4);
  DeviceBuffer extra_cache(c.extra.bytes), extra_indices(c.extra.indices);
  MlaSparseDecodeArgs args =
      c.args(q.get(), cache.get(), indices.get(), nullptr, nullptr, out.get(), DType::kBF16, lse.get());
  c.with_extra(&args, extra_cache.get(), extra_indices.get(), nullptr);
  MlaSparseDecodeProblem one_cache = c.problem();
  one_cache.extra_topk = 0;
  std::size_t bytes = 0;
  ASSERT_TRUE(mla_sparse_decode_workspace_size(c.problem(), &bytes));
  DeviceBuffer ws(bytes);
  MlaDecodePlan plan;
  ASSERT_TRUE(mla_sparse_decode_plan(one_cache, TensorRef{}, ws.get(), bytes, nullptr, &plan));
  Status s = mla_sparse_decode_fp8(args, plan, nullptr);
  EXPECT_NE(s.message().find("plan: expected a plan for topk = 64, extra_topk = 64"), std::string::npos) << s.message();
  const int32_t host_lengths[2] = {3, 4};
  DeviceBuffer lengths(sizeof(host_lengths));
  lengths.upload(host_lengths, sizeof(host_lengths));
  const TensorRef extra_topk_length = make_tensor(lengths.get(), DType::kInt32, {2});
  s = mla_sparse_decode_plan(one_cache, TensorRef{}, extra_topk_length, ws.get(), bytes, nullptr, &plan);
  EXPECT_NE(s.message().find("extra_topk_length: expected none for problem.extra_topk = 0"), std::string::npos)
      << s.message();
  ASSERT_TRUE(mla_sparse_decode_plan(c.problem(), TensorRef{}, extra_topk_length, ws.get(), bytes, nullptr, &plan));
  s = mla_sparse_decode_fp8(args, plan, nullptr);
  EXPECT_NE(s.message().find("extra_topk_length: expected a tensor (as given to mla_sparse_decode_plan), got none"),
            std::string::npos)
      << s.message();
  args.extra_indices.data = c.extra.indices.data();  // host memory
  args.extra_topk_length = extra_topk_length;
  s = mla_sparse_decode_fp8(args, plan, nullptr);
  EXPECT_NE(s.message().find("extra_indices: expected device memory"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace mlakit::testing
