// The GPU dense MLA decode against the CPU reference over a sweep of shapes, page sizes,
// causal masks and length patterns, with NaN in every unused cache slot and poisoned outputs;
// every case also checks the device planner against its CPU twin, bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "common/decode_schedule.h"
#include "gpu_test_util.h"
#include "host/decode_layout.h"
#include "host/scheduler.h"
#include "support/accuracy.h"
#include "support/decode_case.h"

namespace mlakit::testing {
namespace {

struct SweepCase {
  int64_t b;
  int s_q;
  int h_q;
  int h_kv;
  int s_k;
  int page;
  bool causal;
  bool varlen;
  bool zeros;  // some sequences of length 0
  DType dtype;
  std::optional<float> scale;  // unset: 1 / sqrt(576); 2.0 makes the softmax peaked (logit std ~4)

  std::string name() const {
    std::ostringstream s;
    s << "b" << b << "_sq" << s_q << "_hq" << h_q << "_hkv" << h_kv << "_sk" << s_k << "_page" << page
      << (causal ? "_causal" : "") << (varlen ? "_varlen" : "_fixed") << (zeros ? "_zeros" : "")
      << (dtype == DType::kFP16 ? "_fp16" : "_bf16") << (scale ? "_scale2" : "");
    return s.str();
  }
};

std::vector<int32_t> lengths_for(const SweepCase& c, uint64_t seed) {
  std::vector<int32_t> lens = c.varlen ? support::varlen_lengths(c.b, c.s_k, 1, seed)
                                       : support::fixed_lengths(c.b, c.s_k);
  if (c.zeros) {
    for (int64_t i = 0; i < c.b; i += 3) lens[i] = 0;  // first, fourth, ... sequence empty
  }
  return lens;
}

// Shapes: every (h_q, h_kv) pair of the sweep with every s_q, causal mode and page
// size on short sequences; long sequences on a subset; the DeepSeek-V3 shape at b=64.
std::vector<SweepCase> sweep_cases() {
  const int h_q_values[] = {1, 3, 9, 16, 64, 128};
  const int h_kv_values[] = {1, 2, 8};
  const int s_q_values[] = {1, 2, 4};
  const int pages[] = {1, 16, 64, 100};  // Hopper kernel: 16, 64 tiled; 1, 100 portable

  const int64_t small_b[] = {1, 2, 6};
  const int small_sk[] = {20, 140};
  std::vector<SweepCase> cases;
  int rot = 0;
  for (int h_q : h_q_values) {
    for (int h_kv : h_kv_values) {
      if (h_q % h_kv != 0) continue;
      for (int s_q : s_q_values) {
        for (int causal = 0; causal < (s_q > 1 ? 2 : 1); ++causal) {
          for (int page : pages) {
            ++rot;
            cases.push_back(SweepCase{small_b[rot % 3], s_q, h_q, h_kv, small_sk[rot % 2], page,
                                      causal == 1, rot % 2 == 0, rot % 5 == 0,
                                      rot % 7 == 0 ? DType::kFP16 : DType::kBF16,
                                      rot % 3 == 1 ? std::optional<float>(2.0f) : std::nullopt});
          }
        }
      }
    }
  }
  // Long sequences: one split versus many, all page sizes.
  for (int page : pages) {
    cases.push_back({2, 1, 128, 1, 4096, page, false, true, false, DType::kBF16, 2.0f});
    cases.push_back({6, 2, 16, 2, 4096, page, true, false, true, DType::kBF16});
    cases.push_back({1, 4, 64, 8, 4096, page, true, true, false, DType::kFP16});
  }
  cases.push_back({64, 1, 128, 1, 4096, 64, false, true, false, DType::kBF16});
  cases.push_back({64, 2, 128, 1, 4096, 64, true, true, true, DType::kBF16, 2.0f});
  cases.push_back({64, 4, 16, 1, 4096, 16, true, false, false, DType::kFP16});
  cases.push_back({64, 1, 9, 1, 140, 100, false, true, true, DType::kBF16});
  // More page sizes the Hopper kernel tiles (32 as 2 boxes per tile, 128 as half pages).
  cases.push_back({6, 2, 128, 1, 1000, 32, true, true, true, DType::kBF16, 2.0f});
  cases.push_back({6, 1, 64, 2, 1000, 128, false, true, false, DType::kFP16});
  cases.push_back({3, 3, 32, 1, 333, 256, true, false, false, DType::kBF16});
  return cases;
}

class MlaDecodeSweep : public ::testing::TestWithParam<SweepCase> {};

void expect_planner_matches_twin(const support::HostDecodeCase& hc, const MlaDecodePlan& plan,
                                 const DeviceBuffer& workspace) {
  const detail::ScheduleConfig config{plan.num_parts, plan.block_n, plan.overhead_blocks};
  const detail::DecodeSchedule twin = detail::schedule_on_host(hc.seqlens.data(), hc.b, config);
  std::vector<char> ws = workspace.download<char>();
  auto region = [&](std::size_t offset, std::size_t bytes) {
    return std::vector<char>(ws.begin() + offset, ws.begin() + offset + bytes);
  };
  auto bytes_of = [](const auto& v) {
    return std::vector<char>(reinterpret_cast<const char*>(v.data()),
                             reinterpret_cast<const char*>(v.data() + v.size()));
  };
  EXPECT_EQ(region(plan.part_ranges_offset, twin.parts.size() * sizeof(detail::PartRange)), bytes_of(twin.parts))
      << "part ranges differ from the CPU twin";
  EXPECT_EQ(region(plan.split_prefix_offset, twin.split_prefix.size() * 4), bytes_of(twin.split_prefix))
      << "split prefix differs from the CPU twin";
  EXPECT_EQ(region(plan.partial_prefix_offset, twin.partial_prefix.size() * 4), bytes_of(twin.partial_prefix))
      << "partial prefix differs from the CPU twin";
  EXPECT_LE(twin.partial_prefix.back(), plan.partial_slots);
}

TEST_P(MlaDecodeSweep, MatchesReference) {
  MLAKIT_SKIP_WITHOUT_GPU();
  const SweepCase& sc = GetParam();
  support::DecodeCaseSpec spec;
  spec.seqlens = lengths_for(sc, 1000 + sc.b * 7 + sc.s_k);
  spec.s_q = sc.s_q;
  spec.h_q = sc.h_q;
  spec.h_kv = sc.h_kv;
  spec.page_size = sc.page;
  spec.causal = sc.causal;
  spec.dtype = sc.dtype;
  spec.softmax_scale = sc.scale;
  spec.seed = 17 + sc.h_q * 31 + sc.page;
  const support::HostDecodeCase hc = support::make_decode_case(spec);
  const support::ReferenceResult ref = support::run_reference(hc);

  // Every kernel family the device has: the portable kernel everywhere, the Hopper kernel on
  // compute capability 9.0 (kAuto picks it there).
  std::vector<MlaKernel> kernels = {MlaKernel::kPortable};
  if (is_hopper()) kernels.push_back(MlaKernel::kSm90);
  for (MlaKernel kernel : kernels) {
    SCOPED_TRACE(kernel == MlaKernel::kSm90 ? "kernel sm90" : "kernel portable");
    const MlaDecodeOptions options{.kernel = kernel};
    DeviceBuffer workspace = make_workspace(hc.problem(), options);
    MlaDecodePlan plan;
    GpuDecodeResult gpu = run_gpu_decode(hc, &workspace, &plan, options);
    ASSERT_TRUE(gpu.status) << gpu.status.to_string();
    EXPECT_EQ(plan.kernel, kernel);
    expect_planner_matches_twin(hc, plan, workspace);
    const support::AccuracyReport out = support::check_half_outputs(gpu.out, ref.out, sc.dtype, "out");
    EXPECT_TRUE(out.ok) << out.message << " (cosine diff " << out.cosine_diff << ")";
    const support::AccuracyReport lse = support::check_float_stats(gpu.lse, ref.lse, "lse");
    EXPECT_TRUE(lse.ok) << lse.message;
  }
}

INSTANTIATE_TEST_SUITE_P(Sweep, MlaDecodeSweep, ::testing::ValuesIn(sweep_cases()),
                         [](const ::testing::TestParamInfo<SweepCase>& info) { return info.param.name(); });

}  // namespace
}  // namespace mlakit::testing
