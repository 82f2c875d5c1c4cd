// Stress test of the dense MHA prefill (issue 26) and its backward: many small varlen problems
// (b 1 to 4, lengths 0 to 300, every head-dim pair, causal and not, GQA ratios 1 / 2 / 4 / 8,
// bf16 and fp16, padded and packed-qkv views, lse or none, explicit scales), each called
// knobs().calls times on the same tensors. Every q / k / v (and dout) row in no sequence is NaN,
// and so are the padding of padded views and the guard rows past the tensors
// (support/mha_prefill_case.h, support/mha_backward_case.h); outputs are poisoned before every
// call and everything outside the rows of a sequence must keep the poison.
//
// Forward (Stress/MhaPrefill.RepeatedCallsAreExactAndCorrect/{portable,sm90}): call 0 is checked
// against the float64 reference (docs/contract.md) and every later call bit for bit against
// call 0.
//
// Backward (Stress/MhaPrefillBackward.RepeatedCallsAreCorrect/{deterministic,default} on kernel
// kAuto, {deterministic,default}_sm90 on kSm90 with d (64, 64), (128, 128) and (192, 128) cases): dq, dk, dv and every
// workspace byte are 0xFF before each call. Deterministic mode: call 0 is checked against the float64 reference (SPEC section 8, backward rule) and every later call
// bit for bit against call 0; default mode: every call is checked against the reference (the
// order of the float32 sums may vary, so equal bits are not required).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "common/mha_backward_tiling.h"
#include "gpu_test_util.h"
#include "mlakit/mha_prefill.h"
#include "stress_test_util.h"
#include "support/mha_backward_case.h"
#include "support/mha_prefill_case.h"

namespace mlakit::testing {
namespace {

using stress::CaseRng;
using support::mha_prefill_spec;
using Spec = support::MhaPrefillSpec;

constexpr uint64_t kSalt = 0x3a4d26;
// Float64 multiply-adds of a random case's reference (h_q * (d_qk + d_v) * visible pairs),
// about 0.1 s on one core: larger random problems are shrunk to it.
constexpr double kReferenceBudget = 1e8;
constexpr uint16_t kPoison16 = 0xffff;  // run_repeated fills outputs with 0xFF bytes
constexpr uint32_t kPoison32 = 0xffffffffu;

// First in every run, so that a few cases reach every kernel instance: each head-dim pair
// causal and not, GQA 1 / 4 / 8, fp16, padded and packed views, no lse, explicit scales, empty
// query and key sequences, Lq > Lk under causal, rows in no sequence, an oversized max_seqlen,
// the Hopper kernel's tail split.
std::vector<Spec> coverage_cases() {
  std::vector<Spec> c;
  c.push_back(mha_prefill_spec({{1, 63, 0}, {65, 64, 5}}, 4, 4, 64, 64, true, 1));
  c.push_back(mha_prefill_spec({{129, 0}, {127, 200}}, 8, 2, 64, 64, false, 2));
  c.push_back(mha_prefill_spec({{300, 7}, {64, 0}}, 8, 1, 128, 128, true, 3));  // 236 rows with no key; no keys at all
  c.push_back(mha_prefill_spec({{65, 128}, {300, 128}}, 4, 1, 128, 128, false, 4));
  c.push_back(mha_prefill_spec({{200, 1}, {129, 1}}, 8, 8, 192, 128, true, 5));
  c.push_back(mha_prefill_spec({{127}, {255}}, 4, 1, 192, 128, false, 6));
  c.push_back(mha_prefill_spec({{64, 33}, {64, 190}}, 2, 2, 256, 256, true, 7));
  c.push_back(mha_prefill_spec({{150, 0, 20}, {90, 0, 40}}, 8, 1, 256, 256, false, 8));
  c[0].tail_q = 5;
  c[1].tail_k = 70;
  c[2].dtype = DType::kFP16;
  c[2].tail_q = c[2].tail_k = 9;
  support::pad_all_views(&c[3]);
  c[3].with_lse = false;
  c[4].softmax_scale = 0.5f;
  c[4].key_ramp = 3;
  c[5].max_seqlen_slack = 130;
  c[5].dtype = DType::kFP16;
  support::pad_all_views(&c[6]);
  c[6].tail_q = 2;
  c[7].softmax_scale = 0.02f;
  c[7].tail_q = 1;
  c[7].tail_k = 3;
  // q, k, v slices of one qkv buffer, causal self-attention.
  Spec p = mha_prefill_spec({{100, 0, 257}, {100, 0, 257}}, 8, 2, 128, 128, true, 9);
  p.packed_qkv = true;
  p.tail_q = p.tail_k = 4;
  c.push_back(p);
  // The Hopper kernel's tail split (8 tiles over 900 keys: 3 pieces each; the empty second
  // sequence's pieces see no key).
  c.push_back(mha_prefill_spec({{130, 50}, {900, 0}}, 2, 1, 128, 128, false, 10));
  return c;
}

int random_length(CaseRng& r) {
  if (r.chance(0.1)) return 0;
  if (r.chance(0.1)) return 1;
  if (r.chance(0.2)) return r.pick({63, 64, 65, 127, 128, 129, 255, 256, 257});
  return r.uniform(1, 300);
}

// A random problem from `r`'s next draws (the forward's and the backward's cases).
Spec random_problem(CaseRng& r) {
  Spec s;
  const int b = r.uniform(1, 4);
  const bool self_attention = r.chance(0.3);
  for (int i = 0; i < b; ++i) {
    s.lq.push_back(random_length(r));
    s.lk.push_back(self_attention ? s.lq.back() : random_length(r));
  }
  const int dims = r.uniform(0, 3);
  const int d_qk[] = {64, 128, 192, 256}, d_v[] = {64, 128, 128, 256};
  s.d_qk = d_qk[dims];
  s.d_v = d_v[dims];
  s.causal = r.chance(0.5);
  s.h_kv = r.pick({1, 2});
  s.h_q = s.h_kv * r.pick({1, 2, 4, 8});
  s.dtype = r.chance(0.25) ? DType::kFP16 : DType::kBF16;
  s.tail_q = r.chance(0.4) ? r.uniform(1, 70) : 0;
  s.tail_k = r.chance(0.4) ? r.uniform(1, 70) : 0;
  const int layout = r.uniform(0, 99);
  if (layout < 15 && self_attention && s.d_qk == s.d_v) {
    s.packed_qkv = true;
    s.tail_k = s.tail_q;
  } else if (layout < 40) {
    support::pad_all_views(&s);
  }
  s.with_lse = r.chance(0.8);
  if (r.chance(0.15)) s.softmax_scale = r.pick({0.5f, 0.02f});
  if (r.chance(0.2)) s.key_ramp = 3;
  if (r.chance(0.15)) s.max_seqlen_slack = r.uniform(1, 200);
  s.seed = r.seed();
  return s;
}

// Keeps a reference cheap: halves the longest sequence (both sides) until `macs` fits `budget`.
template <typename Macs>
void shrink_to_budget(Spec* s, double budget, Macs macs) {
  while (macs() > budget) {
    size_t longest = 0;
    for (size_t i = 1; i < s->lq.size(); ++i) {
      if (std::max(s->lq[i], s->lk[i]) > std::max(s->lq[longest], s->lk[longest])) longest = i;
    }
    s->lq[longest] /= 2;
    s->lk[longest] /= 2;
  }
}

Spec random_case(int index) {
  CaseRng r(kSalt, index);
  Spec s = random_problem(r);
  shrink_to_budget(&s, kReferenceBudget, [&] { return support::reference_macs(s); });
  return s;
}

void run_case(const Spec& spec, const std::string& name, MlaKernel kernel, stress::Tally* tally) {
  const support::HostMhaPrefillCase c = support::make_mha_prefill_case(spec);
  const support::MhaPrefillReference ref = support::run_mha_prefill_reference(c);
  {
    const int64_t rows = c.rows_in_sequences();
    std::vector<float> in_sequences(ref.out.begin(), ref.out.begin() + rows * spec.h_q * spec.d_v);
    ASSERT_FALSE(stress::has_nan(in_sequences)) << name << ": the reference has NaN";
  }

  DeviceMhaPrefillCase d(c, kernel);
  const Status ws = d.allocate_workspace();
  ASSERT_TRUE(ws) << name << ": " << ws.to_string();

  std::vector<stress::Output> outputs = {{"out", &d.out}};
  if (spec.with_lse) outputs.push_back({"lse", &d.lse});
  // The workspace (the Hopper kernel's tail split) poisoned before every call too; every call
  // repeats call 0's bits.
  const stress::RepeatResult r = stress::run_repeated(
      outputs, &d.workspace, stress::LaterCalls::kRepeatCall0Bits, [&] { return d.launch(); },
      [&](const stress::OutputBytes& got) {
        const auto out_bits = stress::from_bytes<uint16_t>(got[0]);
        if (!spec.with_lse) {
          return support::check_mha_prefill_outputs(c, ref, out_bits, nullptr, kPoison16, kPoison32);
        }
        const auto lse_bits = stress::from_bytes<uint32_t>(got[1]);
        return support::check_mha_prefill_outputs(c, ref, out_bits, &lse_bits, kPoison16, kPoison32);
      });
  tally->add(r, false);
  EXPECT_TRUE(r.failure.empty()) << name << ", kernel " << stress::kernel_name(kernel) << ": " << r.failure;
}

class MhaPrefill : public ::testing::TestWithParam<MlaKernel> {};

TEST_P(MhaPrefill, RepeatedCallsAreExactAndCorrect) {
  const MlaKernel kernel = GetParam();
  if (const std::string why = stress::why_kernel_cannot_run(kernel); !why.empty()) GTEST_SKIP() << why;
  const std::vector<Spec> coverage = coverage_cases();
  stress::Tally tally("MHA prefill", kernel, /*planned=*/false);  // no plan: nothing is split
  for (int i = 0; i < stress::knobs().cases; ++i) {
    const Spec spec = i < static_cast<int>(coverage.size()) ? coverage[i] : random_case(i);
    run_case(spec, "case " + std::to_string(i) + " (" + support::describe(spec) + ")", kernel, &tally);
    if (HasFatalFailure() || tally.failed_cases() >= stress::kMaxFailedCases) break;
  }
  tally.print();
}

INSTANTIATE_TEST_SUITE_P(Stress, MhaPrefill, ::testing::Values(MlaKernel::kPortable, MlaKernel::kSm90),
                         stress::kernel_param_name);

// ---------------------------------------------------------------------------------------------
// The backward.

using BackwardSpec = support::MhaBackwardSpec;

constexpr uint64_t kBackwardSalt = 0x3a4d27;
// Float64 multiply-adds of a random case's forward and backward references together
// (h_q * (5 d_qk + 4 d_v) * visible pairs), about 0.07 s on one core.
constexpr double kBackwardReferenceBudget = 1.5e8;

// The backward of `problem`; peaked softmax rows (key ramp, scale 0.5) take the smaller v.
BackwardSpec backward_of(const Spec& problem) {
  BackwardSpec b;
  b.problem = problem;
  if (problem.key_ramp > 0 || problem.softmax_scale == 0.5f) b.v_scale = support::kPeakedRowsVScale;
  return b;
}

// First in every run, small enough for the sanitizers (all of them within their 13 cases): each
// head-dim pair in bf16 and in fp16 (every kernel instance), causal and not, GQA 1 / 4 / 8,
// padded, packed and 4-byte-aligned views, peaked and flat explicit scales, empty query and key
// sequences, Lq > Lk under causal (rows that see no key), keys no query sees, rows in no
// sequence, an oversized max_seqlen. The Hopper kernel runs the ones without causal (cases 1,
// 3 and 5: d 64, 128 and 192) in a tail split on 132 SMs.
std::vector<BackwardSpec> backward_coverage_cases() {
  std::vector<BackwardSpec> c;
  c.push_back(backward_of(mha_prefill_spec({{1, 63, 0, 33}, {65, 64, 5, 31}}, 4, 4, 64, 64, true, 21)));
  c.push_back(backward_of(mha_prefill_spec({{129, 0}, {127, 200}}, 8, 2, 64, 64, false, 22)));
  c.push_back(backward_of(mha_prefill_spec({{300, 7}, {64, 0}}, 8, 1, 128, 128, true, 23)));  // 236 rows with no key
  c.push_back(backward_of(mha_prefill_spec({{65, 128}, {300, 128}}, 4, 1, 128, 128, false, 24)));
  Spec peaked = mha_prefill_spec({{200, 1}, {129, 3}}, 8, 8, 192, 128, true, 25);
  peaked.softmax_scale = 0.5f;
  peaked.key_ramp = 3;
  c.push_back(backward_of(peaked));
  c.push_back(backward_of(mha_prefill_spec({{127}, {255}}, 4, 1, 192, 128, false, 26)));
  c.push_back(backward_of(mha_prefill_spec({{64, 33}, {64, 190}}, 2, 2, 256, 256, true, 27)));
  c.push_back(backward_of(mha_prefill_spec({{150, 0, 20}, {90, 0, 40}}, 8, 1, 256, 256, false, 28)));
  c[0].problem.tail_q = 5;
  c[1].problem.dtype = DType::kFP16;
  c[1].problem.tail_k = 70;
  c[2].problem.tail_q = c[2].problem.tail_k = 9;
  c[3].problem.dtype = DType::kFP16;
  support::pad_all_views(&c[3]);
  c[5].problem.dtype = DType::kFP16;
  c[5].problem.max_seqlen_slack = 130;
  support::pad_all_views(&c[6]);
  c[6].problem.tail_q = 2;
  c[7].problem.dtype = DType::kFP16;
  c[7].problem.softmax_scale = 0.02f;
  c[7].problem.tail_q = 1;
  c[7].problem.tail_k = 3;
  // q, k, v slices of one qkv buffer, causal self-attention.
  Spec p = mha_prefill_spec({{100, 0, 130}, {100, 0, 130}}, 8, 2, 128, 128, true, 29);
  p.packed_qkv = true;
  p.tail_q = p.tail_k = 4;
  c.push_back(backward_of(p));
  BackwardSpec a = backward_of(mha_prefill_spec({{70, 5}, {90, 5}}, 4, 2, 64, 64, true, 30));
  support::align4_all_views(&a);
  c.push_back(a);
  // Only sequences without queries: dq has nothing to write, dk and dv are all 0.
  Spec e = mha_prefill_spec({{0, 0}, {10, 64}}, 4, 2, 128, 128, true, 31);
  e.tail_q = 6;
  c.push_back(backward_of(e));
  return c;
}

// hopper: head dims the Hopper kernel serves ((64, 64) or (192, 128) where drawn, (128, 128) otherwise).
BackwardSpec random_backward_case(int index, bool hopper) {
  CaseRng r(kBackwardSalt, index);
  BackwardSpec b = backward_of(random_problem(r));
  if (hopper && !mlakit::detail::mha_backward_hopper_dims(b.problem.d_qk, b.problem.d_v)) {
    b.problem.d_qk = b.problem.d_v = 128;
  }
  const int layout = r.uniform(0, 99);
  if (layout < 25) {
    b.dout_pad = {.offset = 0, .head_pad = 8, .token_pad = 16};
    b.dq_pad = {.offset = 8, .head_pad = 16, .token_pad = 8};
    b.dk_pad = {.offset = 0, .head_pad = 8, .token_pad = 24};
    b.dv_pad = {.offset = 16, .head_pad = 8, .token_pad = 0};
  } else if (layout < 35 && !b.problem.packed_qkv && !hopper) {  // kSm90 refuses 4-byte rows (the validation test's)
    support::align4_all_views(&b);
  }
  shrink_to_budget(&b.problem, kBackwardReferenceBudget, [&] { return support::backward_reference_macs(b); });
  return b;
}

void run_backward_case(const BackwardSpec& spec, const std::string& name, bool deterministic, MlaKernel kernel,
                       stress::Tally* tally) {
  const support::HostMhaBackwardCase c = support::make_mha_backward_case(spec);
  const support::MhaBackwardReference ref = support::run_mha_backward_reference(c);

  DeviceMhaBackwardCase d(c, deterministic, kernel);
  const Status ws = d.allocate_workspace();
  ASSERT_TRUE(ws) << name << ": " << ws.to_string();

  // Deterministic mode: every call repeats call 0's bits; default mode: every call passes the check.
  const stress::RepeatResult r = stress::run_repeated(
      {{"dq", &d.dq}, {"dk", &d.dk}, {"dv", &d.dv}}, &d.workspace,
      deterministic ? stress::LaterCalls::kRepeatCall0Bits : stress::LaterCalls::kPassCheck, [&] { return d.launch(); },
      [&](const stress::OutputBytes& got) {
        return support::check_mha_backward_outputs(c, ref, stress::from_bytes<uint16_t>(got[0]),
                                                   stress::from_bytes<uint16_t>(got[1]),
                                                   stress::from_bytes<uint16_t>(got[2]), kPoison16);
      });
  tally->add(r, false);
  EXPECT_TRUE(r.failure.empty()) << name << ", " << support::backward_mode_name(deterministic) << " mode: "
                                 << r.failure;
}

// Both modes on kAuto and on the Hopper kernel (kSm90: the coverage cases of its head dims and
// random cases made d 128 where they drew others).
struct BackwardStressParam {
  bool deterministic;
  MlaKernel kernel;
};

class MhaPrefillBackward : public ::testing::TestWithParam<BackwardStressParam> {};

TEST_P(MhaPrefillBackward, RepeatedCallsAreCorrect) {
  const auto [deterministic, kernel] = GetParam();
  const bool sm90 = kernel == MlaKernel::kSm90;
  if (const std::string why = stress::why_kernel_cannot_run(sm90 ? MlaKernel::kSm90 : MlaKernel::kPortable);
      !why.empty()) {
    GTEST_SKIP() << why;
  }
  const std::vector<BackwardSpec> coverage = backward_coverage_cases();
  const std::string mode = std::string(support::backward_mode_name(deterministic)) + (sm90 ? ", sm90" : "");
  stress::Tally tally("MHA prefill backward", mode.c_str(), /*planned=*/false);
  for (int i = 0; i < stress::knobs().cases; ++i) {
    const BackwardSpec spec = i < static_cast<int>(coverage.size()) ? coverage[i] : random_backward_case(i, sm90);
    if (sm90 && (!mlakit::detail::mha_backward_hopper_dims(spec.problem.d_qk, spec.problem.d_v) ||
                 !support::tma_copied_rows_aligned(spec))) {
      continue;  // refused: the sweep checks that
    }
    run_backward_case(spec, "case " + std::to_string(i) + " (" + support::describe(spec) + ")", deterministic, kernel,
                      &tally);
    if (HasFatalFailure() || tally.failed_cases() >= stress::kMaxFailedCases) break;
  }
  tally.print();
}

INSTANTIATE_TEST_SUITE_P(Stress, MhaPrefillBackward,
                         ::testing::Values(BackwardStressParam{true, MlaKernel::kAuto},
                                           BackwardStressParam{false, MlaKernel::kAuto},
                                           BackwardStressParam{true, MlaKernel::kSm90},
                                           BackwardStressParam{false, MlaKernel::kSm90}),
                         [](const ::testing::TestParamInfo<BackwardStressParam>& info) {
                           return std::string(support::backward_mode_name(info.param.deterministic)) +
                                  (info.param.kernel == MlaKernel::kSm90 ? "_sm90" : "");
                         });

}  // namespace
}  // namespace mlakit::testing
