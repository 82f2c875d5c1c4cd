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
// Backward (Stress/MhaPrefillBackward.RepeatedCallsAreCorrect/{deterministic,default}; kernel
// kAuto): dq, dk, dv and every workspace byte are 0xFF before each call. Deterministic mode: call
// 0 is checked against the float64 reference (SPEC section 8, backward rule) and every later call
// bit for bit against call 0; default mode: every call is checked against the reference (the
// order of the float32 sums may vary, so equal bits are not required).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "gpu_test_util.h"
#include "mlakit/mha_prefill.h"
#include "stress_test_util.h"
#include "support/mha_backward_case.h"
#include "support/mha_prefill_case.h"

namespace mlakit::testing {
namespace {

using stress::CaseRng;
using Spec = support::MhaPrefillSpec;

constexpr uint64_t kSalt = 0x3a4d26;
// Float64 multiply-adds of a random case's reference (h_q * (d_qk + d_v) * visible pairs),
// about 0.1 s on one core: larger random problems are shrunk to it.
constexpr double kReferenceBudget = 1e8;
constexpr uint16_t kPoison16 = 0xffff;  // run_repeated fills outputs with 0xFF bytes
constexpr uint32_t kPoison32 = 0xffffffffu;

Spec spec_of(std::vector<int32_t> lq, std::vector<int32_t> lk, int h_q, int h_kv, int d_qk, int d_v, bool causal,
             uint64_t seed) {
  Spec s;
  s.lq = std::move(lq);
  s.lk = std::move(lk);
  s.h_q = h_q;
  s.h_kv = h_kv;
  s.d_qk = d_qk;
  s.d_v = d_v;
  s.causal = causal;
  s.seed = seed;
  return s;
}

// First in every run, so that a few cases reach every kernel instance: each head-dim pair
// causal and not, GQA 1 / 4 / 8, fp16, padded and packed views, no lse, explicit scales, empty
// query and key sequences, Lq > Lk under causal, rows in no sequence, an oversized max_seqlen.
std::vector<Spec> coverage_cases() {
  std::vector<Spec> c;
  c.push_back(spec_of({1, 63, 0}, {65, 64, 5}, 4, 4, 64, 64, true, 1));
  c.push_back(spec_of({129, 0}, {127, 200}, 8, 2, 64, 64, false, 2));
  c.push_back(spec_of({300, 7}, {64, 0}, 8, 1, 128, 128, true, 3));  // 236 rows with no key; no keys at all
  c.push_back(spec_of({65, 128}, {300, 128}, 4, 1, 128, 128, false, 4));
  c.push_back(spec_of({200, 1}, {129, 1}, 8, 8, 192, 128, true, 5));
  c.push_back(spec_of({127}, {255}, 4, 1, 192, 128, false, 6));
  c.push_back(spec_of({64, 33}, {64, 190}, 2, 2, 256, 256, true, 7));
  c.push_back(spec_of({150, 0, 20}, {90, 0, 40}, 8, 1, 256, 256, false, 8));
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
  Spec p = spec_of({100, 0, 257}, {100, 0, 257}, 8, 2, 128, 128, true, 9);
  p.packed_qkv = true;
  p.tail_q = p.tail_k = 4;
  c.push_back(p);
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

// A device copy of `host` (an empty vector, e.g. k and v of a packed qkv case: a 1-byte
// allocation and no copy).
template <typename T>
DeviceBuffer to_device(const std::vector<T>& host) {
  return host.empty() ? DeviceBuffer(0) : DeviceBuffer(host);
}

void run_case(const Spec& spec, const std::string& name, MlaKernel kernel, stress::Tally* tally) {
  const support::HostMhaPrefillCase c = support::make_mha_prefill_case(spec);
  const support::MhaPrefillReference ref = support::run_mha_prefill_reference(c);
  {
    const int64_t rows = c.rows_in_sequences();
    std::vector<float> in_sequences(ref.out.begin(), ref.out.begin() + rows * spec.h_q * spec.d_v);
    ASSERT_FALSE(stress::has_nan(in_sequences)) << name << ": the reference has NaN";
  }

  const DeviceBuffer q = to_device(c.q), k = to_device(c.k), v = to_device(c.v);
  const DeviceBuffer cu_q = to_device(c.cu_q), cu_k = to_device(c.cu_k);
  DeviceBuffer out(c.out_stored * 2), lse(c.lse_stored * 4);
  MhaPrefillArgs args = c.args(q.get(), k.get(), v.get(), cu_q.get(), cu_k.get(), out.get(), lse.get());
  args.kernel = kernel;
  std::size_t bytes = 0;
  const Status ws = mha_prefill_workspace_size(args, &bytes);
  ASSERT_TRUE(ws) << name << ": " << ws.to_string();
  DeviceBuffer workspace(bytes);

  std::vector<stress::Output> outputs = {{"out", &out}};
  if (spec.with_lse) outputs.push_back({"lse", &lse});
  const stress::RepeatResult r = stress::run_repeated(
      outputs, static_cast<const MlaDecodePlan*>(nullptr),
      [&] { return mha_prefill(args, workspace.get(), bytes, nullptr); },
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
// v of the cases with peaked softmax rows (key ramp, scale 0.5): see MhaBackwardSpec.
constexpr float kPeakedVScale = 4.f;

BackwardSpec backward_of(const Spec& problem) {
  BackwardSpec b;
  b.problem = problem;
  if (problem.key_ramp > 0 || problem.softmax_scale == 0.5f) b.v_scale = kPeakedVScale;
  return b;
}

// Rows aligned to 4 bytes but not 16, in every view (the GPU entry takes them).
void align4_views(BackwardSpec* s) {
  s->problem.q_pad = {.offset = 2, .head_pad = 2, .token_pad = 0};
  s->problem.k_pad = {.offset = 0, .head_pad = 0, .token_pad = 2};
  s->problem.v_pad = {.offset = 6, .head_pad = 2, .token_pad = 2};
  s->problem.out_pad = {.offset = 2, .head_pad = 0, .token_pad = 2};
  s->problem.lse_pad = 1;
  s->dout_pad = {.offset = 0, .head_pad = 2, .token_pad = 0};
  s->dq_pad = {.offset = 2, .head_pad = 0, .token_pad = 6};
  s->dk_pad = {.offset = 4, .head_pad = 2, .token_pad = 2};
  s->dv_pad = {.offset = 2, .head_pad = 2, .token_pad = 0};
}

// First in every run, small enough for the sanitizers (all of them within their 13 cases): each
// head-dim pair in bf16 and in fp16 (every kernel instance), causal and not, GQA 1 / 4 / 8,
// padded, packed and 4-byte-aligned views, peaked and flat explicit scales, empty query and key
// sequences, Lq > Lk under causal (rows that see no key), keys no query sees, rows in no
// sequence, an oversized max_seqlen.
std::vector<BackwardSpec> backward_coverage_cases() {
  std::vector<BackwardSpec> c;
  c.push_back(backward_of(spec_of({1, 63, 0, 33}, {65, 64, 5, 31}, 4, 4, 64, 64, true, 21)));
  c.push_back(backward_of(spec_of({129, 0}, {127, 200}, 8, 2, 64, 64, false, 22)));
  c.push_back(backward_of(spec_of({300, 7}, {64, 0}, 8, 1, 128, 128, true, 23)));  // 236 rows with no key
  c.push_back(backward_of(spec_of({65, 128}, {300, 128}, 4, 1, 128, 128, false, 24)));
  Spec peaked = spec_of({200, 1}, {129, 3}, 8, 8, 192, 128, true, 25);
  peaked.softmax_scale = 0.5f;
  peaked.key_ramp = 3;
  c.push_back(backward_of(peaked));
  c.push_back(backward_of(spec_of({127}, {255}, 4, 1, 192, 128, false, 26)));
  c.push_back(backward_of(spec_of({64, 33}, {64, 190}, 2, 2, 256, 256, true, 27)));
  c.push_back(backward_of(spec_of({150, 0, 20}, {90, 0, 40}, 8, 1, 256, 256, false, 28)));
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
  Spec p = spec_of({100, 0, 130}, {100, 0, 130}, 8, 2, 128, 128, true, 29);
  p.packed_qkv = true;
  p.tail_q = p.tail_k = 4;
  c.push_back(backward_of(p));
  BackwardSpec a = backward_of(spec_of({70, 5}, {90, 5}, 4, 2, 64, 64, true, 30));
  align4_views(&a);
  c.push_back(a);
  // Only sequences without queries: dq has nothing to write, dk and dv are all 0.
  Spec e = spec_of({0, 0}, {10, 64}, 4, 2, 128, 128, true, 31);
  e.tail_q = 6;
  c.push_back(backward_of(e));
  return c;
}

BackwardSpec random_backward_case(int index) {
  CaseRng r(kBackwardSalt, index);
  BackwardSpec b = backward_of(random_problem(r));
  const int layout = r.uniform(0, 99);
  if (layout < 25) {
    b.dout_pad = {.offset = 0, .head_pad = 8, .token_pad = 16};
    b.dq_pad = {.offset = 8, .head_pad = 16, .token_pad = 8};
    b.dk_pad = {.offset = 0, .head_pad = 8, .token_pad = 24};
    b.dv_pad = {.offset = 16, .head_pad = 8, .token_pad = 0};
  } else if (layout < 35 && !b.problem.packed_qkv) {
    align4_views(&b);
  }
  shrink_to_budget(&b.problem, kBackwardReferenceBudget, [&] { return support::backward_reference_macs(b); });
  return b;
}

using Grads = std::vector<std::vector<uint16_t>>;  // dq, dk, dv buffers

// Calls `launch` knobs().calls times on the same inputs; before each call every gradient buffer
// and the workspace are filled with 0xFF bytes. Call 0 must pass `check`; in the deterministic
// mode every later call must give call 0's bits (one that does not is checked too, to tell
// "wrong" from "only different"), in the default mode every later call must pass `check`.
stress::RepeatResult run_backward_repeated(const std::vector<DeviceBuffer*>& grads, DeviceBuffer* workspace,
                                           bool deterministic, const std::function<Status()>& launch,
                                           const std::function<std::string(const Grads&)>& check) {
  static const char* const kNames[] = {"dq", "dk", "dv"};
  stress::RepeatResult r;
  Grads first;
  int differing_calls = 0;
  std::string first_difference;
  for (int call = 0; call < stress::knobs().calls; ++call) {
    for (DeviceBuffer* g : grads) g->fill_bytes(0xFF);
    workspace->fill_bytes(0xFF);
    const Status s = launch();
    if (!s) {
      r.failure = "call " + std::to_string(call) + ": " + s.to_string();
      return r;
    }
    if (const cudaError_t err = cudaDeviceSynchronize(); err != cudaSuccess) {
      r.failure = "call " + std::to_string(call) + ": " + cudaGetErrorString(err);
      return r;
    }
    ++r.calls;
    Grads got;
    for (const DeviceBuffer* g : grads) got.push_back(g->download<uint16_t>());
    if (call == 0 || !deterministic) {
      if (std::string bad = check(got); !bad.empty()) {
        r.failure = "call " + std::to_string(call) + ": " + bad;
        return r;
      }
      if (call == 0) first = std::move(got);
      continue;
    }
    if (got == first) continue;
    if (++differing_calls > 1) continue;
    first_difference = "call " + std::to_string(call) + " (deterministic mode):";
    for (size_t i = 0; i < got.size(); ++i) {
      int64_t n = 0, at = -1;
      for (size_t e = 0; e < got[i].size(); ++e) {
        if (got[i][e] == first[i][e]) continue;
        if (at < 0) at = static_cast<int64_t>(e);
        ++n;
      }
      if (n > 0) {
        first_difference += std::string(" ") + kNames[i] + " differs from call 0 in " + std::to_string(n) +
                            " elements, first at buffer element " + std::to_string(at) + ";";
      }
    }
    const std::string bad = check(got);
    first_difference += bad.empty() ? " within the reference's tolerances" : " against the reference: " + bad;
  }
  if (differing_calls > 0) {
    r.failure = first_difference + " (" + std::to_string(differing_calls) + " of " + std::to_string(r.calls - 1) +
                " later calls differ from call 0)";
  }
  return r;
}

void run_backward_case(const BackwardSpec& spec, const std::string& name, bool deterministic, stress::Tally* tally) {
  const support::HostMhaBackwardCase c = support::make_mha_backward_case(spec);
  const support::MhaBackwardReference ref = support::run_mha_backward_reference(c);

  const DeviceBuffer q = to_device(c.fwd.q), k = to_device(c.fwd.k), v = to_device(c.fwd.v);
  const DeviceBuffer cu_q = to_device(c.fwd.cu_q), cu_k = to_device(c.fwd.cu_k);
  const DeviceBuffer dout = to_device(c.dout), out = to_device(c.out), lse = to_device(c.lse);
  DeviceBuffer dq(c.dq_stored * 2), dk(c.dk_stored * 2), dv(c.dv_stored * 2);
  MhaPrefillBackwardArgs args = c.args({.q = q.get(),
                                        .k = k.get(),
                                        .v = v.get(),
                                        .cu_q = cu_q.get(),
                                        .cu_k = cu_k.get(),
                                        .dout = dout.get(),
                                        .out = out.get(),
                                        .lse = lse.get(),
                                        .dq = dq.get(),
                                        .dk = dk.get(),
                                        .dv = dv.get()});
  args.deterministic = deterministic;
  args.kernel = MlaKernel::kAuto;
  std::size_t bytes = 0;
  const Status ws = mha_prefill_backward_workspace_size(args, &bytes);
  ASSERT_TRUE(ws) << name << ": " << ws.to_string();
  DeviceBuffer workspace(bytes);

  const stress::RepeatResult r = run_backward_repeated(
      {&dq, &dk, &dv}, &workspace, deterministic,
      [&] { return mha_prefill_backward(args, workspace.get(), bytes, nullptr); },
      [&](const Grads& got) { return support::check_mha_backward_outputs(c, ref, got[0], got[1], got[2], kPoison16); });
  tally->add(r, false);
  EXPECT_TRUE(r.failure.empty()) << name << ", " << (deterministic ? "deterministic" : "default") << " mode: "
                                 << r.failure;
}

class MhaPrefillBackward : public ::testing::TestWithParam<bool> {};  // deterministic

TEST_P(MhaPrefillBackward, RepeatedCallsAreCorrect) {
  const bool deterministic = GetParam();
  if (const std::string why = stress::why_kernel_cannot_run(MlaKernel::kPortable); !why.empty()) GTEST_SKIP() << why;
  const std::vector<BackwardSpec> coverage = backward_coverage_cases();
  stress::Tally tally("MHA prefill backward", deterministic ? "deterministic" : "default", /*planned=*/false);
  for (int i = 0; i < stress::knobs().cases; ++i) {
    const BackwardSpec spec = i < static_cast<int>(coverage.size()) ? coverage[i] : random_backward_case(i);
    run_backward_case(spec, "case " + std::to_string(i) + " (" + support::describe(spec) + ")", deterministic, &tally);
    if (HasFatalFailure() || tally.failed_cases() >= stress::kMaxFailedCases) break;
  }
  tally.print();
}

INSTANTIATE_TEST_SUITE_P(Stress, MhaPrefillBackward, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return std::string(info.param ? "deterministic" : "default");
                         });

}  // namespace
}  // namespace mlakit::testing
