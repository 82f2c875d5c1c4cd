// The validation fuzz test's bookkeeping: one case per call, the checks every call gets, the
// known-issue list, failures grouped by signature with the first reproducer of each, and the
// reproducer printed when a case crashes the process.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "validation_fuzz.h"

namespace mlakit::fuzz {

// One call: the entry point, its tensor arguments and its other arguments (printed).
struct FuzzCase {
  std::string op{};
  std::vector<Arg> args{};
  std::vector<std::pair<std::string, std::string>> scalars{};
  std::vector<int64_t> list{};  // make_tensor's shape list
  Symbols problem{};           // a problem struct's fields (b, s_q, ...), for known-issue checks
  bool host_memory = false;   // args point at real host buffers (CPU references)
};

// A known defect, tracked by issue 23's fixes: remove the entry with its fix. `skip_call`: the
// call would crash the process, so it is not made (counted as skipped); `waives`: a contract
// violation of an accepted input this defect explains (counted as waived).
struct KnownIssue {
  const char* id;
  bool (*skip_call)(const FuzzCase&);
  bool (*waives)(const FuzzCase&, const Violation&);
};

class Recorder {
 public:
  Recorder(uint64_t seed, std::vector<KnownIssue> known) : seed_(seed), known_(std::move(known)) {}

  // Before a call: a copy of `c` becomes the reproducer printed if the process dies (kept
  // until end(), so an exception that unwinds the driver still has its case). False when a
  // known issue says the call would crash.
  bool begin(int64_t index, const FuzzCase& c);
  void end();
  // After a call returning a Status: the code is one `c.op` may return (`allowed`), an error
  // message starts with "<op>: ", and, when `accepted`, `violations` (the caller's contract
  // check) is empty but for known issues.
  void check_status(const Status& s, const std::vector<StatusCode>& allowed, bool accepted,
                    const std::vector<Violation>& violations);
  // Any other failed expectation of the current case.
  void fail(const std::string& kind, const std::string& detail);

  int64_t failures() const { return failures_; }
  void print_summary(std::ostream& os) const;

 private:
  struct OpStats {
    int64_t calls = 0, accepted = 0, skipped = 0, waived = 0;
  };
  struct Signature {
    int64_t count = 0;
    std::string first;  // the first failing case's reproducer
  };

  uint64_t seed_;
  std::vector<KnownIssue> known_;
  int64_t index_ = 0;
  FuzzCase current_;  // op empty: no case under way
  std::map<std::string, OpStats> stats_;
  std::map<std::string, int64_t> known_hits_;
  std::map<std::string, Signature> signatures_;
  int64_t failures_ = 0;
};

// What the drivers share.
// Codes a GPU entry point may return in this build (without CUDA: never Ok).
const std::vector<StatusCode>& gpu_codes();
// Codes a CPU reference may return.
const std::vector<StatusCode>& reference_codes();
// A GPU entry point's status once its host-side argument checks passed (it reached the device).
bool reached_device(const Status& s);
// The references' thread count: mostly 1 (a case is small), sometimes 0 (all cores) or odd.
int reference_threads(Rng& rng);
// A logit scale: usually an ordinary value, sometimes unset (the default) or an edge value
// (NaN, inf, 0, negative).
std::optional<float> random_scale(Rng& rng);
std::string str(float v);
std::string str(std::optional<float> v);  // "unset" or the value
// A symbol's value, or `fallback` when no accepted argument had it.
int64_t symbol(const Symbols& s, const char* name, int64_t fallback = 1);


// The common path of a driver with tensor arguments: mutates them, points them at memory
// (host buffers for a reference, stand-ins otherwise), calls, and checks the status and, when
// accepted, the contract, the writes (references) and `extra` (op-specific rules).
template <typename Call, typename Extra>
void call_and_check(Rng& rng, Recorder& rec, int64_t index, FuzzCase& c, Call call, Extra extra) {
  mutate_args(rng, c.args);
  Memory memory;
  if (c.host_memory) {
    memory.attach_host(rng, c.args);
  } else {
    Memory::attach_device_stand_in(c.args);
  }
  if (!rec.begin(index, c)) return;
  const Status st = call();
  const bool accepted = c.host_memory ? st.is_ok() : reached_device(st);
  std::vector<Violation> v;
  if (accepted) {
    Symbols got;
    v = contract_violations(c.args, &got);
    extra(got, &v);
    for (const Violation& w : memory.writes_outside_outputs(c.args)) v.push_back(w);
  }
  rec.check_status(st, c.host_memory ? reference_codes() : gpu_codes(), accepted, v);
}

// The text that reproduces a case: MLAKIT_FUZZ_SEED / MLAKIT_FUZZ_CASE and the call.
std::string reproducer(uint64_t seed, int64_t index, const FuzzCase& c);

// Prints the current case's reproducer when the process dies (a sanitizer report, a signal).
void install_crash_reporter();

// One entry point's driver: generates a case, calls, checks (through the recorder).
struct OpDriver {
  const char* name;
  void (*run)(Rng& rng, Recorder& rec, int64_t index);
};
std::vector<OpDriver> decode_drivers();  // dense and sparse decode (validation_fuzz_decode.cpp)
std::vector<OpDriver> other_drivers();   // prefill, FP8 cache tools, make_tensor, merge_states
std::vector<OpDriver> attention_drivers();  // MHA prefill, GQA decode and cache tools (validation_fuzz_attention.cpp)
std::vector<OpDriver> merge_drivers();  // merge_states over N states: GPU entry and reference (validation_fuzz_merge.cpp)

}  // namespace mlakit::fuzz
