// Shared machinery of the stress tests (stress_test_*.cpp): the knobs, the random-case helpers,
// calling one case many times on the same tensors with poisoned outputs and workspace, and the
// per-family tally printed at the end of each test.
//
// Every test is parameterised by kernel family (Stress/<Op>.RepeatedCallsAreExactAndCorrect/
// portable and /sm90), or, where the plan picks no kernel family (the GQA decode), by q's dtype
// (Stress/GqaDecodeStress.RepeatedCallsAreExactAndCorrect/bf16 and /fp16). Its case list starts
// with fixed coverage cases that reach every kernel instance of the family (so a sanitizer run
// with a few cases still does), followed by random ones; case i is the same whatever the number
// of cases.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <random>
#include <string>
#include <vector>

#include "gpu_test_util.h"
#include "mlakit/gqa_decode.h"
#include "mlakit/mla_decode.h"
#include "support/accuracy.h"

namespace mlakit::testing::stress {

// Environment knobs, read once:
//   MLAKIT_STRESS_CALLS  calls per case, >= 1 (default 20; a sanitizer run sets 2)
//   MLAKIT_STRESS_CASES  cases per test, >= 1 (default 32: coverage cases, then random ones)
//   MLAKIT_STRESS_SEED   seed of the random cases (default 1; coverage cases never change)
struct Knobs {
  int calls;
  int cases;
  uint64_t seed;
};
const Knobs& knobs();

using ::mlakit::testing::kernel_name;  // gpu_test_util.h
std::string kernel_param_name(const ::testing::TestParamInfo<MlaKernel>& info);

// Why `kernel` cannot run on this machine; empty when it can.
std::string why_kernel_cannot_run(MlaKernel kernel);

// Random choices of one case, seeded from (knobs().seed, op, case index).
class CaseRng {
 public:
  CaseRng(uint64_t op_salt, int case_index);
  int uniform(int lo, int hi);  // in [lo, hi]
  bool chance(double p);
  template <typename T>
  T pick(std::initializer_list<T> values) {
    return values.begin()[uniform(0, static_cast<int>(values.size()) - 1)];
  }
  uint64_t seed() { return rng_(); }  // for the case's tensors

 private:
  std::mt19937_64 rng_;
};

// What a plan did with the batch: read back from its workspace after mla_*_plan.
bool plan_splits(const MlaDecodePlan& plan);  // some sequence cut into >= 2 pieces

// One output buffer of a call, compared bit for bit across calls.
struct Output {
  std::string name;
  DeviceBuffer* buffer;
};
using OutputBytes = std::vector<std::vector<uint8_t>>;  // one per Output, in order

// Checks one call's downloaded outputs against the reference: "" when they pass, else what failed.
using ReferenceCheck = std::function<std::string(const OutputBytes&)>;

struct RepeatResult {
  int calls = 0;
  std::string failure;  // empty: every call passed
};

// Calls `launch` (one call of the operation, on the null stream) knobs().calls times on the
// same inputs. Before each call every output is filled with 0xFF bytes (NaN as bf16, fp16 and
// float32), and so are `plan`'s partial-result regions when a plan is given: a combine reading
// a partial before it is written would otherwise find the previous call's identical values.
// After each call: synchronise and download. Call 0 must pass `check`; every later call must
// give call 0's bits (same inputs and plan, same bits), and one that does not is checked too,
// to tell "wrong" from "only different".
RepeatResult run_repeated(const std::vector<Output>& outputs, const MlaDecodePlan* plan,
                          const std::function<Status()>& launch, const ReferenceCheck& check);
// The same for the GQA decode, whose plan has the MLA decode plan's workspace regions.
RepeatResult run_repeated(const std::vector<Output>& outputs, const GqaDecodePlan& plan,
                          const std::function<Status()>& launch, const ReferenceCheck& check);

// What a call after call 0 must do.
enum class LaterCalls {
  kRepeatCall0Bits,  // give call 0's bits (as above)
  kPassCheck,        // pass `check` (an operation whose float32 sums may run in any order)
};
// The same for an operation without a plan but with a caller's workspace (the MHA prefill
// backward): `workspace` is filled with 0xFF bytes before each call too (the operation must not
// rely on what a previous call left there).
RepeatResult run_repeated(const std::vector<Output>& outputs, DeviceBuffer* workspace, LaterCalls later,
                          const std::function<Status()>& launch, const ReferenceCheck& check);

template <typename T>
std::vector<T> from_bytes(const std::vector<uint8_t>& bytes) {
  std::vector<T> v(bytes.size() / sizeof(T));
  std::memcpy(v.data(), bytes.data(), v.size() * sizeof(T));
  return v;
}

// "" when the report passed, else its message (with the cosine difference).
std::string verdict(const support::AccuracyReport& r);
// 16-bit outputs: where the reference is exactly 0 (rows with nothing to attend, which docs/contract.md
// wants exactly 0 and the tolerance would hide) the result must be +-0.
std::string check_exact_zeros(const std::vector<uint16_t>& got, const std::vector<float>& ref,
                              const std::string& name);
bool has_nan(const std::vector<float>& v);

// Calls, cases and failures of one test, printed as one line for the log.
class Tally {
 public:
  // planned: the op has a plan whose splits are worth counting.
  Tally(const char* op, MlaKernel kernel, bool planned = true) : Tally(op, kernel_name(kernel), planned) {}
  // An operation without kernel families: `variant` names the test's parameter instead.
  Tally(const char* op, const char* variant, bool planned = true) : op_(op), variant_(variant), planned_(planned) {}
  void add(const RepeatResult& r, bool split);
  int64_t calls() const { return calls_; }
  int failed_cases() const { return failed_; }
  void print() const;

 private:
  const char* op_;
  const char* variant_;
  bool planned_;
  int64_t calls_ = 0;
  int cases_ = 0, split_ = 0, failed_ = 0;
};

// A failing case is reported with EXPECT; after this many the test stops (the log stays readable).
inline constexpr int kMaxFailedCases = 10;

}  // namespace mlakit::testing::stress
