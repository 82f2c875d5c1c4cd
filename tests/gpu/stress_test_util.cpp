#include "stress_test_util.h"

#include <cstdio>
#include <cstdlib>
#include <stdexcept>

namespace mlakit::testing::stress {
namespace {

void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(err));
}

// A positive integer from the environment, or `fallback` when unset or not one.
int64_t env_positive(const char* name, int64_t fallback) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return fallback;
  char* end = nullptr;
  const long long v = std::strtoll(text, &end, 10);
  if (*end != '\0' || v < 1) {
    std::fprintf(stderr, "[stress] %s=%s is not a positive integer; using %lld\n", name, text,
                 static_cast<long long>(fallback));
    return fallback;
  }
  return v;
}

// Fills the plan's partial-result regions (partial_out, then partial_lse: the last two regions
// of the workspace, set_decode_num_parts) with 0xFF bytes. The plan's own regions before them
// stay. The GQA decode plan has the same regions.
template <typename Plan>
void poison_partials(const Plan& plan) {
  // Offset 0 would be the schedule itself (a plan without partial regions).
  if (plan.partial_out_offset == 0 || plan.workspace_bytes <= plan.partial_out_offset) return;
  char* begin = static_cast<char*>(plan.workspace) + plan.partial_out_offset;
  check_cuda(cudaMemset(begin, 0xFF, plan.workspace_bytes - plan.partial_out_offset), "poison partials");
}

}  // namespace

const Knobs& knobs() {
  static const Knobs k{
      .calls = static_cast<int>(env_positive("MLAKIT_STRESS_CALLS", 20)),
      .cases = static_cast<int>(env_positive("MLAKIT_STRESS_CASES", 32)),
      .seed = static_cast<uint64_t>(env_positive("MLAKIT_STRESS_SEED", 1)),
  };
  return k;
}

std::string kernel_param_name(const ::testing::TestParamInfo<MlaKernel>& info) {
  return kernel_name(info.param);
}

std::string why_kernel_cannot_run(MlaKernel kernel) {
  std::string why;
  if (!gpu_available(&why)) return "GPU test skipped: " + why;
  if (kernel == MlaKernel::kSm90 && !is_hopper()) return "the sm90 kernel needs a compute capability 9.0 GPU";
  return "";
}

CaseRng::CaseRng(uint64_t op_salt, int case_index) {
  std::seed_seq seq{knobs().seed, op_salt, static_cast<uint64_t>(case_index)};
  rng_.seed(seq);
}

int CaseRng::uniform(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }

bool CaseRng::chance(double p) { return std::uniform_real_distribution<double>(0.0, 1.0)(rng_) < p; }

bool plan_splits(const MlaDecodePlan& plan) {
  std::vector<int32_t> prefix(plan.problem.b + 1);
  check_cuda(cudaMemcpy(prefix.data(), static_cast<const char*>(plan.workspace) + plan.split_prefix_offset,
                        prefix.size() * sizeof(int32_t), cudaMemcpyDeviceToHost),
             "split prefix");
  for (int64_t i = 0; i < plan.problem.b; ++i) {
    if (prefix[i + 1] - prefix[i] >= 2) return true;
  }
  return false;
}

namespace {

// run_repeated with `poison_more()` after the outputs' poison before each call.
RepeatResult run_repeated_impl(const std::vector<Output>& outputs, const std::function<void()>& poison_more,
                               LaterCalls later, const std::function<Status()>& launch,
                               const ReferenceCheck& check) {
  RepeatResult r;
  OutputBytes first;
  int differing_calls = 0;
  std::string first_difference;
  for (int call = 0; call < knobs().calls; ++call) {
    for (const Output& o : outputs) o.buffer->fill_bytes(0xFF);
    poison_more();
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
    OutputBytes got;
    for (const Output& o : outputs) got.push_back(o.buffer->download<uint8_t>());
    if (call == 0 || later == LaterCalls::kPassCheck) {
      if (std::string bad = check(got); !bad.empty()) {
        r.failure = "call " + std::to_string(call) + ": " + bad;
        return r;
      }
      if (call == 0) first = std::move(got);
      continue;
    }
    if (got == first) continue;  // the same bits pass the same checks
    if (++differing_calls > 1) continue;
    first_difference = "call " + std::to_string(call) + ":";
    for (size_t i = 0; i < outputs.size(); ++i) {
      if (got[i] != first[i]) first_difference += " " + difference_from_call0(got[i], first[i], outputs[i].name) + ";";
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

}  // namespace

RepeatResult run_repeated(const std::vector<Output>& outputs, const MlaDecodePlan* plan,
                          const std::function<Status()>& launch, const ReferenceCheck& check) {
  return run_repeated_impl(
      outputs, [&] { if (plan != nullptr) poison_partials(*plan); }, LaterCalls::kRepeatCall0Bits, launch, check);
}

RepeatResult run_repeated(const std::vector<Output>& outputs, const GqaDecodePlan& plan,
                          const std::function<Status()>& launch, const ReferenceCheck& check) {
  return run_repeated_impl(outputs, [&] { poison_partials(plan); }, LaterCalls::kRepeatCall0Bits, launch, check);
}

RepeatResult run_repeated(const std::vector<Output>& outputs, DeviceBuffer* workspace, LaterCalls later,
                          const std::function<Status()>& launch, const ReferenceCheck& check) {
  return run_repeated_impl(outputs, [&] { workspace->fill_bytes(0xFF); }, later, launch, check);
}

std::string verdict(const support::AccuracyReport& r) {
  if (r.ok) return "";
  return r.message + " (cosine diff " + std::to_string(r.cosine_diff) + ")";
}

std::string check_exact_zeros(const std::vector<uint16_t>& got, const std::vector<float>& ref,
                              const std::string& name) {
  int64_t failures = 0;
  std::string first;
  for (size_t i = 0; i < got.size() && i < ref.size(); ++i) {
    if (ref[i] != 0.f || (got[i] & 0x7fff) == 0) continue;
    if (failures++ == 0) {
      char bits[8];
      std::snprintf(bits, sizeof(bits), "%04x", got[i]);
      first = name + "[" + std::to_string(i) + "]: got bits 0x" + bits + ", expected exactly 0";
    }
  }
  return failures == 0 ? "" : first + " (" + std::to_string(failures) + " elements)";
}

bool has_nan(const std::vector<float>& v) {
  for (float x : v) {
    if (x != x) return true;
  }
  return false;
}

void Tally::add(const RepeatResult& r, bool split) {
  calls_ += r.calls;
  ++cases_;
  split_ += split ? 1 : 0;
  failed_ += r.failure.empty() ? 0 : 1;
}

void Tally::print() const {
  const std::string splits = planned_ ? " (" + std::to_string(split_) + " with split plans)" : "";
  std::printf("[stress] %s / %s: %lld calls over %d cases%s, %d failing cases\n", op_, variant_,
              static_cast<long long>(calls_), cases_, splits.c_str(), failed_);
  std::fflush(stdout);
}

}  // namespace mlakit::testing::stress
