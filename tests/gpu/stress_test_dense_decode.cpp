// Stress test of the dense MLA decode (issue 23): many small problems, each called
// knobs().calls times on the same tensors with one plan. NaN fills every cache slot no
// sequence owns (support/decode_case); outputs and the plan's partial results are poisoned
// before every call; call 0 is checked against the float64 reference (docs/contract.md) and every later
// call bit for bit against call 0.
#include <optional>
#include <gtest/gtest.h>

#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

#include "gpu_test_util.h"
#include "stress_test_util.h"
#include "support/accuracy.h"
#include "support/decode_case.h"

namespace mlakit::testing {
namespace {

using stress::CaseRng;

constexpr uint64_t kSalt = 0xde75e;
// Float64 multiply-adds of a random case's reference (s_q * h_q * 1088 per cached token),
// about 0.1 s on one core: it bounds the lengths of the larger random problems.
constexpr double kReferenceBudget = 1e8;

enum class Expect { kAny, kSplit, kUnsplit };  // the plan a coverage case is built to get

struct DenseCase {
  support::DecodeCaseSpec spec;
  Expect expect = Expect::kAny;

  std::string name(int index) const {
    std::ostringstream s;
    s << "case " << index << " (b" << spec.seqlens.size() << "_sq" << spec.s_q << "_hq" << spec.h_q << "_hkv"
      << spec.h_kv << "_page" << spec.page_size << (spec.causal ? "_causal" : "")
      << (spec.dtype == DType::kFP16 ? "_fp16" : "_bf16") << (spec.softmax_scale == 2.0f ? "_scale2" : "")
      << "_seed" << spec.seed << ", lengths";
    for (int32_t l : spec.seqlens) s << " " << l;
    s << ")";
    return s.str();
  }
};

DenseCase make_case(std::vector<int32_t> lengths, int s_q, int h_q, int h_kv, int page, bool causal, DType dtype,
                    Expect expect, uint64_t seed) {
  return DenseCase{{.seqlens = std::move(lengths), .s_q = s_q, .h_q = h_q, .h_kv = h_kv, .page_size = page,
                    .causal = causal, .dtype = dtype, .seed = seed},
                   expect};
}

// First in every run, so that a few cases reach every kernel instance: h_q 16 / 32 / 64 / 128,
// s_q 1-4, causal, bf16 and fp16, the sm90 kernel's cache tiles for pages 16, 32, 64, 128 and
// 256 and its portable fallback (pages 61 and 1), Q by TMA and by cp.async (24 heads per kv
// head divide no 64-row tile), h_kv > 1, empty sequences and rows, split plans (few long
// sequences: more parts than sequences on any GPU) and unsplit ones (every sequence one block).
std::vector<DenseCase> coverage_cases() {
  constexpr DType kBF16 = DType::kBF16, kFP16 = DType::kFP16;
  std::vector<DenseCase> cases = {
      make_case({1500, 0}, 1, 128, 1, 64, false, kBF16, Expect::kSplit, 1),
      make_case({1, 17, 700}, 2, 64, 1, 16, true, kFP16, Expect::kSplit, 2),
      make_case({0, 32, 33, 900}, 3, 32, 1, 32, true, kBF16, Expect::kSplit, 3),
      make_case({61, 1000}, 4, 16, 1, 61, true, kBF16, Expect::kSplit, 4),
      make_case({1, 64, 63, 2, 10, 64, 5, 33}, 1, 128, 1, 64, false, kBF16, Expect::kUnsplit, 5),
      make_case({16, 1, 64, 3}, 2, 64, 1, 16, true, kFP16, Expect::kUnsplit, 6),
      make_case({129, 300}, 2, 48, 2, 128, true, kFP16, Expect::kSplit, 7),
      make_case({256, 257, 0}, 1, 128, 4, 256, false, kBF16, Expect::kSplit, 8),
      make_case({1, 100, 0}, 1, 16, 1, 1, false, kFP16, Expect::kAny, 9),
      make_case({2, 200}, 4, 128, 1, 32, true, kFP16, Expect::kSplit, 10),
      make_case({4, 3, 65}, 4, 64, 1, 64, true, kBF16, Expect::kAny, 11),
      // FlashMLA's test shape at small scale: h_q 128, s_q 2 causal, page 64.
      make_case({1024, 1000}, 2, 128, 1, 64, true, kBF16, Expect::kSplit, 12),
  };
  cases[7].spec.softmax_scale = 2.0f;  // peaked softmax
  return cases;
}

// 0, 1, a page or 64-key tile boundary +-1, or anything up to `cap`.
int32_t random_length(CaseRng& r, int page, int cap) {
  int len = 0;
  switch (r.uniform(0, 9)) {
    case 0: len = 0; break;
    case 1: len = 1; break;
    case 2:
    case 3: len = page * r.uniform(1, std::max(1, cap / page)) + r.uniform(-1, 1); break;
    case 4: len = 64 * r.uniform(1, std::max(1, cap / 64)) + r.uniform(-1, 1); break;
    default: len = r.uniform(0, cap);
  }
  return std::clamp(len, 0, cap);
}

DenseCase random_case(int index) {
  CaseRng r(kSalt, index);
  DenseCase c;
  support::DecodeCaseSpec& s = c.spec;
  const int b = r.uniform(1, 8);
  s.s_q = r.uniform(1, 4);
  s.h_q = r.pick({16, 24, 32, 48, 64, 96, 128});
  s.h_kv = r.chance(0.7) ? 1 : r.pick({2, 4});  // every h_q above is a multiple of 8
  s.page_size = r.chance(0.2) ? r.uniform(1, 256) : r.pick({1, 16, 32, 61, 64, 64, 128, 256});
  s.causal = s.s_q > 1 && r.chance(0.5);
  s.dtype = r.chance(0.5) ? DType::kBF16 : DType::kFP16;
  s.softmax_scale = r.chance(0.2) ? std::optional<float>(2.0f) : std::nullopt;
  s.spare_blocks = r.uniform(1, 4);
  s.seed = r.seed();
  const double per_token = static_cast<double>(b) * s.s_q * s.h_q * 1088;
  const int cap = static_cast<int>(std::clamp(kReferenceBudget / per_token, 1.0, 8192.0));
  for (int i = 0; i < b; ++i) s.seqlens.push_back(random_length(r, s.page_size, cap));
  return c;
}

// Builds, plans and calls one case, adding it to the tally.
void run_case(const DenseCase& dc, const std::string& name, MlaKernel kernel, stress::Tally* tally) {
  const support::HostDecodeCase hc = support::make_decode_case(dc.spec);
  const support::ReferenceResult ref = support::run_reference(hc);
  ASSERT_FALSE(stress::has_nan(ref.out) || stress::has_nan(ref.lse)) << name << ": the reference has NaN";

  DeviceDecodeCase d(hc);
  const MlaDecodeOptions options{.kernel = kernel};
  DeviceBuffer workspace = make_workspace(hc.problem(), options);
  MlaDecodePlan plan;
  const Status s = mla_decode_plan(hc.problem(), d.args.cache_seqlens, workspace.get(), workspace.bytes(), nullptr,
                                   &plan, options);
  ASSERT_TRUE(s) << name << ": " << s.to_string();
  ASSERT_EQ(plan.kernel, kernel) << name;
  const bool split = stress::plan_splits(plan);
  if (dc.expect != Expect::kAny) {
    EXPECT_EQ(split, dc.expect == Expect::kSplit) << name << ": the coverage case lost its " << (split ? "un" : "")
                                                  << "split plan";
  }

  const auto check = [&](const stress::OutputBytes& got) {
    const std::vector<uint16_t> out = stress::from_bytes<uint16_t>(got[0]);
    std::string bad = stress::verdict(support::check_half_outputs(out, ref.out, dc.spec.dtype, "out"));
    if (bad.empty()) bad = stress::check_exact_zeros(out, ref.out, "out");
    if (bad.empty()) bad = stress::verdict(support::check_float_stats(stress::from_bytes<float>(got[1]), ref.lse, "lse"));
    return bad;
  };
  const stress::RepeatResult r = stress::run_repeated(
      {{"out", &d.out}, {"lse", &d.lse}}, &plan, [&] { return mla_decode(d.args, plan, nullptr); }, check);
  tally->add(r, split);
  EXPECT_TRUE(r.failure.empty()) << name << ", kernel " << stress::kernel_name(kernel) << ": " << r.failure;
}

class DenseDecode : public ::testing::TestWithParam<MlaKernel> {};

TEST_P(DenseDecode, RepeatedCallsAreExactAndCorrect) {
  const MlaKernel kernel = GetParam();
  if (const std::string why = stress::why_kernel_cannot_run(kernel); !why.empty()) GTEST_SKIP() << why;
  const std::vector<DenseCase> coverage = coverage_cases();
  stress::Tally tally("dense decode", kernel);
  for (int i = 0; i < stress::knobs().cases; ++i) {
    const DenseCase dc = i < static_cast<int>(coverage.size()) ? coverage[i] : random_case(i);
    run_case(dc, dc.name(i), kernel, &tally);
    if (HasFatalFailure() || tally.failed_cases() >= stress::kMaxFailedCases) break;
  }
  tally.print();
}

INSTANTIATE_TEST_SUITE_P(Stress, DenseDecode, ::testing::Values(MlaKernel::kPortable, MlaKernel::kSm90),
                         stress::kernel_param_name);

}  // namespace
}  // namespace mlakit::testing
