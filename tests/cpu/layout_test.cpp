// Host heuristics and workspace layout of the MLA decode (host/decode_layout.h): the worked
// example of the header, region alignment and sizes, and that any length vector's schedule
// fits the workspace sized without lengths.
#include "host/decode_layout.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "cpu_test_util.h"
#include "host/scheduler.h"

namespace mlakit::detail {
namespace {

using mlakit::testing::IsInvalid;
using mlakit::testing::StatusIs;

DeviceInfo h100() {
  return DeviceInfo{.ordinal = 0, .sm_count = 132, .cc_major = 9, .cc_minor = 0,
                    .max_smem_per_block_optin = 227 * 1024};
}

// The traits make_decode_layout picks for `dev` when the kernel is left to it.
DecodeKernelTraits auto_traits(const DeviceInfo& dev) {
  DecodeKernelTraits t;
  EXPECT_TRUE(select_decode_kernel("test", dev, MlaKernel::kAuto, &t).is_ok());
  return t;
}

MlaDecodeProblem problem(int64_t b, int s_q, int h_q, int h_kv) {
  return MlaDecodeProblem{.b = b, .s_q = s_q, .h_q = h_q, .h_kv = h_kv, .d_qk = 576, .d_v = 512};
}

struct Region {
  const char* name;
  std::size_t offset;
  std::size_t min_bytes;  // what its contents need
};

std::vector<Region> regions_of(const MlaDecodePlan& plan) {
  const MlaDecodeProblem& p = plan.problem;
  const auto b1 = static_cast<std::size_t>(p.b + 1);
  const auto slot_rows = static_cast<std::size_t>(plan.partial_slots) * p.h_kv *
                         static_cast<std::size_t>(decode_rows(p));
  return {
      {"part_ranges", plan.part_ranges_offset, sizeof(PartRange) * plan.num_parts},
      {"split_prefix", plan.split_prefix_offset, sizeof(int32_t) * b1},
      {"partial_prefix", plan.partial_prefix_offset, sizeof(int32_t) * b1},
      {"cost_prefix", plan.cost_prefix_offset, sizeof(int64_t) * b1},
      {"partial_out", plan.partial_out_offset, sizeof(float) * slot_rows * p.d_v},
      {"partial_lse", plan.partial_lse_offset, sizeof(float) * slot_rows},
  };
}

// Regions 256-byte aligned, each big enough, pairwise disjoint, all inside workspace_bytes.
void check_layout(const MlaDecodePlan& plan) {
  std::vector<Region> regions = regions_of(plan);
  for (const Region& r : regions) {
    EXPECT_EQ(r.offset % kWorkspaceAlignment, 0u) << r.name << " at " << r.offset;
    EXPECT_LE(r.offset + r.min_bytes, plan.workspace_bytes)
        << r.name << " [" << r.offset << ", +" << r.min_bytes << ") past workspace_bytes "
        << plan.workspace_bytes;
  }
  std::sort(regions.begin(), regions.end(),
            [](const Region& a, const Region& b) { return a.offset < b.offset; });
  for (size_t i = 1; i < regions.size(); ++i) {
    EXPECT_LE(regions[i - 1].offset + regions[i - 1].min_bytes, regions[i].offset)
        << regions[i - 1].name << " overlaps " << regions[i].name;
  }
  EXPECT_EQ(plan.workspace_bytes % kWorkspaceAlignment, 0u);
}

TEST(DecodeLayout, WorkedExampleOfTheHeader) {
  // H100 (132 SMs), portable kernel (2 CTAs/SM, 32 rows/tile), h_q 128 h_kv 1 s_q 1.
  const MlaDecodeProblem p = problem(4, 1, 128, 1);
  const DecodeKernelTraits t = decode_kernel_traits(MlaKernel::kPortable);
  EXPECT_EQ(t.kernel, MlaKernel::kPortable);
  EXPECT_EQ(t.rows_per_tile, 32);
  EXPECT_EQ(t.ctas_per_sm, 2);
  EXPECT_EQ(decode_rows(p), 128);
  EXPECT_EQ(decode_row_tiles(p, t), 4);
  EXPECT_EQ(decode_num_parts(p, t, 132), 66);

  MlaDecodePlan plan;
  ASSERT_TRUE(make_decode_layout(p, h100(), &plan, MlaKernel::kPortable).is_ok());
  EXPECT_EQ(plan.num_parts, 66);
  EXPECT_EQ(plan.partial_slots, 132);
  EXPECT_EQ(plan.block_n, t.block_n);
  EXPECT_EQ(plan.overhead_blocks, t.overhead_blocks);
  EXPECT_EQ(plan.rows_per_tile, 32);
  EXPECT_EQ(plan.device, 0);
  EXPECT_EQ(plan.workspace, nullptr);
  EXPECT_EQ(plan.problem.b, 4);
  EXPECT_EQ(plan.problem.h_q, 128);
  check_layout(plan);
}

TEST(DecodeLayout, HopperKernelOnComputeCapability90) {
  // Hopper kernel: 64 rows per CTA, 1 CTA per SM: h_q 128 s_q 1 -> 2 tiles -> 66 parts.
  const DecodeKernelTraits t = auto_traits(h100());
  EXPECT_EQ(t.kernel, MlaKernel::kSm90);
  EXPECT_EQ(t.rows_per_tile, 64);
  EXPECT_EQ(decode_num_parts(problem(4, 1, 128, 1), t, 132), 66);
  EXPECT_EQ(decode_num_parts(problem(4, 1, 16, 1), t, 132), 132);
  MlaDecodePlan plan;
  ASSERT_TRUE(make_decode_layout(problem(4, 1, 128, 1), h100(), &plan).is_ok());
  EXPECT_EQ(plan.kernel, MlaKernel::kSm90);
  check_layout(plan);
  // Other architectures: the portable kernel, and kSm90 is refused by name.
  const DeviceInfo a100{.ordinal = 0, .sm_count = 108, .cc_major = 8, .cc_minor = 0};
  EXPECT_EQ(auto_traits(a100).kernel, MlaKernel::kPortable);
  DecodeKernelTraits unused;
  EXPECT_TRUE(StatusIs(select_decode_kernel("op", a100, MlaKernel::kSm90, &unused),
                       StatusCode::kUnsupportedArchitecture, {"options.kernel", "9.0", "8.0"}));
  EXPECT_TRUE(IsInvalid(select_decode_kernel("op", h100(), static_cast<MlaKernel>(7), &unused),
                        {"options.kernel", "got 7"}));
}

TEST(DecodeLayout, RowsTilesAndParts) {
  const DecodeKernelTraits t = decode_kernel_traits(MlaKernel::kPortable);
  // rows = s_q * h_q / h_kv
  EXPECT_EQ(decode_rows(problem(1, 2, 128, 1)), 256);
  EXPECT_EQ(decode_rows(problem(1, 4, 6, 2)), 12);
  EXPECT_EQ(decode_rows(problem(1, 1, 16, 16)), 1);
  // row tiles round up
  EXPECT_EQ(decode_row_tiles(problem(1, 1, 1, 1), t), 1);
  EXPECT_EQ(decode_row_tiles(problem(1, 1, 32, 1), t), 1);
  EXPECT_EQ(decode_row_tiles(problem(1, 1, 33, 1), t), 2);
  EXPECT_EQ(decode_row_tiles(problem(1, 2, 128, 1), t), 8);
  // parts = max(1, sm_count * ctas_per_sm / (h_kv * row_tiles))
  EXPECT_EQ(decode_num_parts(problem(1, 2, 128, 1), t, 132), 33);
  EXPECT_EQ(decode_num_parts(problem(1, 1, 16, 1), t, 132), 264);
  EXPECT_EQ(decode_num_parts(problem(1, 1, 64, 2), t, 132), 132);
  EXPECT_EQ(decode_num_parts(problem(1, 1, 256, 256), t, 132), 1);
  EXPECT_EQ(decode_num_parts(problem(1, 1024, 128, 1), t, 132), 1);  // never 0
  EXPECT_EQ(decode_num_parts(problem(1, 1, 128, 1), t, 1), 1);
  const ScheduleConfig c = decode_schedule_config(problem(1, 1, 128, 1), t, 132);
  EXPECT_EQ(c.num_parts, 66);
  EXPECT_EQ(c.block_n, t.block_n);
  EXPECT_EQ(c.overhead_blocks, t.overhead_blocks);
  EXPECT_GE(c.block_n, 1);
  EXPECT_GE(c.overhead_blocks, 1);
}

TEST(DecodeLayout, PlanChargesTheKernelsSegmentOverheadForEveryShape) {
  // One row tile per kv head (streaming: h_q 16 / 64 s_q 1, h_q 32 h_kv 2 s_q 2) and several
  // (h_q 128, h_q 16 s_q 8, h_q 64 s_q 2): one segment charge per kernel family.
  const MlaDecodeProblem shapes[] = {problem(32, 1, 16, 1),  problem(32, 1, 64, 1), problem(8, 2, 64, 2),
                                     problem(32, 1, 128, 1), problem(32, 8, 16, 1), problem(8, 2, 64, 1)};
  for (MlaKernel kernel : {MlaKernel::kSm90, MlaKernel::kPortable}) {
    const DecodeKernelTraits t = decode_kernel_traits(kernel);
    ASSERT_GE(t.overhead_blocks, 1);
    for (const MlaDecodeProblem& p : shapes) {
      EXPECT_EQ(decode_schedule_config(p, t, 132).overhead_blocks, t.overhead_blocks) << p.s_q << " " << p.h_q;
      MlaDecodePlan plan;
      ASSERT_TRUE(make_decode_layout(p, h100(), &plan, kernel).is_ok());
      EXPECT_EQ(plan.overhead_blocks, t.overhead_blocks) << p.s_q << " " << p.h_q << " " << p.h_kv;
    }
  }
}

TEST(DecodeLayout, RegionsAlignedDisjointAndSizedForManyProblems) {
  const DeviceInfo devices[] = {h100(), DeviceInfo{.ordinal = 1, .sm_count = 108, .cc_major = 8},
                                DeviceInfo{.ordinal = 0, .sm_count = 1, .cc_major = 8}};
  for (const DeviceInfo& dev : devices) {
    for (int64_t b : {1, 2, 3, 63, 64, 65, 1000, 4096}) {
      for (int s_q : {1, 2, 4, 7}) {
        for (auto [h_q, h_kv] : {std::pair{1, 1}, {3, 1}, {16, 1}, {128, 1}, {32, 2}, {6, 3}}) {
          const MlaDecodeProblem p = problem(b, s_q, h_q, h_kv);
          SCOPED_TRACE("sm=" + std::to_string(dev.sm_count) + " b=" + std::to_string(b) +
                       " s_q=" + std::to_string(s_q) + " h_q=" + std::to_string(h_q) +
                       " h_kv=" + std::to_string(h_kv));
          MlaDecodePlan plan;
          ASSERT_TRUE(make_decode_layout(p, dev, &plan).is_ok());
          EXPECT_EQ(plan.device, dev.ordinal);
          EXPECT_EQ(plan.num_parts, decode_num_parts(p, auto_traits(dev), dev.sm_count));
          EXPECT_EQ(plan.partial_slots, 2 * static_cast<int64_t>(plan.num_parts));
          check_layout(plan);
          if (::testing::Test::HasFailure()) return;
        }
      }
    }
  }
}

TEST(DecodeLayout, LayoutIsAPureFunctionOfProblemAndDevice) {
  const MlaDecodeProblem p = problem(77, 2, 64, 1);
  MlaDecodePlan a, b;
  ASSERT_TRUE(make_decode_layout(p, h100(), &a).is_ok());
  ASSERT_TRUE(make_decode_layout(p, h100(), &b).is_ok());
  EXPECT_EQ(a.workspace_bytes, b.workspace_bytes);
  EXPECT_EQ(a.partial_out_offset, b.partial_out_offset);
  EXPECT_EQ(a.partial_lse_offset, b.partial_lse_offset);
  // More sequences need more prefix space.
  MlaDecodePlan bigger;
  ASSERT_TRUE(make_decode_layout(problem(7700, 2, 64, 1), h100(), &bigger).is_ok());
  EXPECT_GT(bigger.workspace_bytes, a.workspace_bytes);
}

// The workspace is sized without the lengths: every length vector's schedule must fit it.
TEST(DecodeLayout, AnyLengthsScheduleFitsTheWorkspace) {
  std::mt19937_64 rng(424242);
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t b = std::uniform_int_distribution<int64_t>(1, 300)(rng);
    const int s_q = std::uniform_int_distribution<int>(1, 4)(rng);
    const int h_kv = std::uniform_int_distribution<int>(1, 2)(rng);
    const int group = std::vector<int>{1, 3, 16, 32, 64, 128}[trial % 6];
    const int sm_count = std::uniform_int_distribution<int>(1, 160)(rng);
    const MlaDecodeProblem p = problem(b, s_q, group * h_kv, h_kv);
    const DeviceInfo dev{.ordinal = 0, .sm_count = sm_count, .cc_major = 9};
    MlaDecodePlan plan;
    ASSERT_TRUE(make_decode_layout(p, dev, &plan).is_ok());

    std::vector<int32_t> lens(b);
    const int32_t cap = std::uniform_int_distribution<int32_t>(0, 40000)(rng);
    for (auto& l : lens) l = std::uniform_int_distribution<int32_t>(0, cap)(rng);
    const ScheduleConfig c = decode_schedule_config(p, auto_traits(dev), sm_count);
    ASSERT_EQ(c.num_parts, plan.num_parts);
    ASSERT_EQ(c.block_n, plan.block_n);
    ASSERT_EQ(c.overhead_blocks, plan.overhead_blocks);
    const DecodeSchedule s = schedule_on_host(lens.data(), b, c);
    // Highest partial slot the kernels index: partial_prefix[seq] + split < partial_slots.
    EXPECT_LE(s.partial_prefix[b], plan.partial_slots) << "trial " << trial;
    EXPECT_EQ(s.parts.size() * sizeof(PartRange), sizeof(PartRange) * plan.num_parts);
  }
}

TEST(DecodeLayout, RejectsInvalidProblemsNamingTheField) {
  MlaDecodePlan plan;
  plan.num_parts = 12345;  // must stay untouched on error
  EXPECT_TRUE(IsInvalid(make_decode_layout(problem(-1, 1, 128, 1), h100(), &plan),
                        {"mla_decode_plan", "b:", "got -1"}));
  EXPECT_TRUE(IsInvalid(make_decode_layout(problem(1, 1, 128, 3), h100(), &plan),
                        {"h_q % h_kv", "h_q = 128", "h_kv = 3"}));
  MlaDecodeProblem dqk = problem(1, 1, 128, 1);
  dqk.d_qk = 512;
  EXPECT_TRUE(StatusIs(make_decode_layout(dqk, h100(), &plan), StatusCode::kUnsupported,
                       {"d_qk", "expected 576", "got 512"}));
  EXPECT_EQ(plan.num_parts, 12345);
}

}  // namespace
}  // namespace mlakit::detail

namespace mlakit::detail {
namespace {

TEST(AttachWorkspace, ChecksPointerAlignmentAndSize) {
  MlaDecodePlan layout;
  ASSERT_TRUE(make_decode_layout(MlaDecodeProblem{.b = 3, .s_q = 1, .h_q = 16, .h_kv = 1}, h100(), &layout));
  EXPECT_TRUE(IsInvalid(attach_workspace("op", nullptr, layout.workspace_bytes, 0, &layout),
                        {"workspace", "non-null", "got null"}));
  alignas(256) static char buffer[1 << 16];
  EXPECT_TRUE(IsInvalid(attach_workspace("op", buffer + 16, layout.workspace_bytes, 0, &layout),
                        {"workspace", "256-byte aligned", "16 mod 256"}));
  EXPECT_TRUE(StatusIs(attach_workspace("op", buffer, layout.workspace_bytes - 1, 0, &layout),
                       StatusCode::kWorkspaceTooSmall,
                       {"workspace_bytes", "expected >= " + std::to_string(layout.workspace_bytes)}));
  // A host buffer passes here only because this machine's runtime knows no device memory;
  // the GPU suite checks that host pointers are rejected.
  if (attach_workspace("op", buffer, layout.workspace_bytes, 0, &layout).is_ok()) {
    EXPECT_EQ(layout.workspace, buffer);
  }
}

}  // namespace
}  // namespace mlakit::detail
