// Stress test of the sparse MLA prefill (issue 23): many small problems, each called
// knobs().calls times on the same tensors. Every kv row no counted index lists is NaN, and so
// are the stored rows past s_kv and the padding of strided views (support/sparse_prefill_case);
// outputs are poisoned before every call and their padding must keep the poison; call 0 is
// checked against the float64 reference (docs/contract.md) and every later call bit for bit against
// call 0.
#include <optional>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "gpu_test_util.h"
#include "mlakit/mla_sparse_prefill.h"
#include "stress_test_util.h"
#include "support/accuracy.h"
#include "support/sparse_prefill_case.h"

namespace mlakit::testing {
namespace {

using stress::CaseRng;
using Spec = support::SparsePrefillSpec;

constexpr uint64_t kSalt = 0x9ef111;
// Float64 multiply-adds of a random case's reference (s_q * h_q * topk * 1088), about 0.1 s on
// one core: it bounds topk of the larger random problems.
constexpr double kReferenceBudget = 1e8;
constexpr uint16_t kPoison16 = 0xffff;  // run_repeated fills outputs with 0xFF bytes
constexpr uint32_t kPoison32 = 0xffffffffu;

std::string case_name(int index, const Spec& s) {
  std::ostringstream o;
  o << "case " << index << " (sq" << s.s_q << "_skv" << s.s_kv << "_hq" << s.h_q << "_d" << s.d_qk << "_topk"
    << s.topk << "_invalid" << s.invalid_fraction << "_window" << s.window << "_empty" << s.empty_token
    << (s.strided ? "_strided" : "") << (s.with_topk_length ? "_len" : "") << (s.with_sink ? "_sink" : "")
    << (s.lse_base == LseBase::kNatural ? "_natural" : "") << (s.sm_scale ? "_scale" : "")
    << "_seed" << s.seed << ")";
  return o.str();
}

// First in every run, so that a few cases reach every kernel instance: h_q 16 / 32 / 64 / 128,
// d_qk 576 and 512, topk 64 to 4096 (above s_kv too), s_kv 0 and 1, topk_length, the sink,
// natural-log statistics, strided views, tokens with no valid index, FlashMLA's shapes at
// small scale (h_q 128, topk 2048, d_qk 576 and 512).
std::vector<Spec> coverage_cases() {
  return {
      Spec{.s_q = 1, .s_kv = 0, .h_q = 16, .topk = 64, .seed = 1},
      Spec{.s_q = 4, .s_kv = 1, .h_q = 32, .topk = 64, .empty_token = -1, .with_sink = true, .seed = 2},
      Spec{.s_q = 17, .s_kv = 300, .h_q = 64, .d_qk = 512, .topk = 128, .strided = true, .with_topk_length = true,
           .seed = 3},
      Spec{.s_q = 8, .s_kv = 8192, .h_q = 128, .topk = 2048, .window = 1000, .empty_token = 7,
           .with_topk_length = true, .with_sink = true, .lse_base = LseBase::kNatural, .seed = 4},
      Spec{.s_q = 33, .s_kv = 1000, .h_q = 128, .d_qk = 512, .topk = 64, .empty_token = 32, .strided = true,
           .with_sink = true, .sm_scale = 0.5f, .seed = 5},
      Spec{.s_q = 2, .s_kv = 4096, .h_q = 16, .topk = 4096, .empty_token = -1, .seed = 6},
      Spec{.s_q = 64, .s_kv = 64, .h_q = 32, .d_qk = 512, .topk = 256, .invalid_fraction = 0.5,
           .duplicate_fraction = 0.2, .empty_token = 63, .seed = 7},
      Spec{.s_q = 4, .s_kv = 8192, .h_q = 128, .d_qk = 512, .topk = 2048, .empty_token = -1, .seed = 8},
      Spec{.s_q = 3, .s_kv = 5000, .h_q = 64, .topk = 1024, .with_topk_length = true, .with_sink = true,
           .lse_base = LseBase::kNatural, .seed = 9},
  };
}

Spec random_case(int index) {
  CaseRng r(kSalt, index);
  Spec s;
  s.s_q = r.uniform(1, 64);
  s.s_kv = r.chance(0.05) ? 0 : (r.chance(0.05) ? 1 : r.uniform(1, 8192));
  s.h_q = r.pick({16, 32, 64, 128});
  s.d_qk = r.pick({576, 512});
  const double per_key = static_cast<double>(s.s_q) * s.h_q * 1088;
  const int cap = static_cast<int>(std::clamp(kReferenceBudget / per_key, 64.0, 4096.0));
  s.topk = 64 * r.uniform(1, cap / 64);
  s.invalid_fraction = r.uniform(0, 50) / 100.0;
  s.window = r.chance(0.3) ? r.uniform(1, static_cast<int>(std::max<int64_t>(s.s_kv, 1))) : 0;
  s.empty_token = r.chance(0.5) ? r.uniform(0, static_cast<int>(s.s_q) - 1) : -1;
  s.strided = r.chance(0.3);
  s.with_topk_length = r.chance(0.4);
  s.with_sink = r.chance(0.4);
  s.lse_base = r.chance(0.3) ? LseBase::kNatural : LseBase::kBase2;
  s.sm_scale = r.chance(0.15) ? std::optional<float>(0.5f) : std::nullopt;
  s.seed = r.seed();
  return s;
}

// The logical elements of one call's (possibly padded) outputs against the reference; the
// padding must still hold the poison.
std::string check_call(const support::HostSparsePrefillCase& c, const support::SparsePrefillReference& ref,
                       const stress::OutputBytes& got) {
  const Spec& s = c.spec;
  const auto out_stored = stress::from_bytes<uint16_t>(got[0]);
  const auto max_stored = stress::from_bytes<uint32_t>(got[1]);
  const auto lse_stored = stress::from_bytes<uint32_t>(got[2]);
  std::vector<uint16_t> out(s.s_q * s.h_q * 512);
  std::vector<float> max_logits(s.s_q * s.h_q), lse(s.s_q * s.h_q);
  std::vector<bool> logical_out(out_stored.size()), logical_stat(lse_stored.size());
  for (int64_t t = 0; t < s.s_q; ++t) {
    for (int h = 0; h < s.h_q; ++h) {
      const int64_t row = t * s.h_q + h;
      for (int d = 0; d < 512; ++d) {
        out[row * 512 + d] = out_stored[c.out_at(t, h, d)];
        logical_out[c.out_at(t, h, d)] = true;
      }
      std::memcpy(&max_logits[row], &max_stored[c.stat_at(t, h)], 4);
      std::memcpy(&lse[row], &lse_stored[c.stat_at(t, h)], 4);
      logical_stat[c.stat_at(t, h)] = true;
    }
  }
  for (size_t i = 0; i < out_stored.size(); ++i) {
    if (!logical_out[i] && out_stored[i] != kPoison16) return "out padding written at " + std::to_string(i);
  }
  for (size_t i = 0; i < lse_stored.size(); ++i) {
    if (logical_stat[i]) continue;
    if (lse_stored[i] != kPoison32) return "lse padding written at " + std::to_string(i);
    if (max_stored[i] != kPoison32) return "max_logits padding written at " + std::to_string(i);
  }
  std::string bad = stress::verdict(support::check_half_outputs(out, ref.out, DType::kBF16, "out"));
  if (bad.empty()) bad = stress::check_exact_zeros(out, ref.out, "out");
  if (bad.empty()) bad = stress::verdict(support::check_float_stats(max_logits, ref.max_logits, "max_logits"));
  if (bad.empty()) bad = stress::verdict(support::check_float_stats(lse, ref.lse, "lse"));
  return bad;
}

void run_case(const Spec& spec, const std::string& name, MlaKernel kernel, stress::Tally* tally) {
  support::HostSparsePrefillCase c = support::make_sparse_prefill_case(spec);
  if (spec.with_topk_length && spec.s_q >= 3) {
    c.topk_length[1] = 1;  // one key
    c.topk_length[2] = 0;  // nothing to attend
  }
  support::poison_unlisted_rows(c);
  const support::SparsePrefillReference ref = support::run_sparse_prefill_reference(c);
  ASSERT_FALSE(stress::has_nan(ref.out) || stress::has_nan(ref.max_logits) || stress::has_nan(ref.lse))
      << name << ": the reference has NaN";

  DeviceBuffer q(c.q), kv(c.kv), indices(c.indices);
  DeviceBuffer topk_length(std::max<size_t>(c.topk_length.size(), 1) * 4);
  DeviceBuffer sink(std::max<size_t>(c.sink.size(), 1) * 4);
  if (!c.topk_length.empty()) topk_length.upload(c.topk_length.data(), c.topk_length.size() * 4);
  if (!c.sink.empty()) sink.upload(c.sink.data(), c.sink.size() * 4);
  DeviceBuffer out(c.out_stored() * 2), max_logits(c.stat_stored() * 4), lse(c.stat_stored() * 4);
  MlaSparsePrefillArgs args = c.args(q.get(), kv.get(), indices.get(), topk_length.get(), sink.get(), out.get(),
                                     max_logits.get(), lse.get());
  args.kernel = kernel;

  const stress::RepeatResult r = stress::run_repeated(
      {{"out", &out}, {"max_logits", &max_logits}, {"lse", &lse}}, nullptr,
      [&] { return mla_sparse_prefill(args, nullptr); },
      [&](const stress::OutputBytes& got) { return check_call(c, ref, got); });
  tally->add(r, false);
  EXPECT_TRUE(r.failure.empty()) << name << ", kernel " << stress::kernel_name(kernel) << ": " << r.failure;
}

class SparsePrefill : public ::testing::TestWithParam<MlaKernel> {};

TEST_P(SparsePrefill, RepeatedCallsAreExactAndCorrect) {
  const MlaKernel kernel = GetParam();
  if (const std::string why = stress::why_kernel_cannot_run(kernel); !why.empty()) GTEST_SKIP() << why;
  const std::vector<Spec> coverage = coverage_cases();
  stress::Tally tally("sparse prefill", kernel, /*planned=*/false);  // one CTA covers all of a token's keys
  for (int i = 0; i < stress::knobs().cases; ++i) {
    const Spec spec = i < static_cast<int>(coverage.size()) ? coverage[i] : random_case(i);
    run_case(spec, case_name(i, spec), kernel, &tally);
    if (HasFatalFailure() || tally.failed_cases() >= stress::kMaxFailedCases) break;
  }
  tally.print();
}

INSTANTIATE_TEST_SUITE_P(Stress, SparsePrefill, ::testing::Values(MlaKernel::kPortable, MlaKernel::kSm90),
                         stress::kernel_param_name);

}  // namespace
}  // namespace mlakit::testing
