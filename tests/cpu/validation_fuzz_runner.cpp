#include "validation_fuzz_runner.h"

#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <sstream>


namespace mlakit::fuzz {
namespace {

// The case under way, for the crash reporter (a pointer, so a case costs no text until it fails).
struct CrashContext {
  const FuzzCase* c = nullptr;
  uint64_t seed = 0;
  int64_t index = 0;
};
CrashContext g_crash;

void print_crash_case() {
  if (g_crash.c == nullptr) return;
  const std::string text =
      "\nvalidation fuzz: the process died in this case:\n" + reproducer(g_crash.seed, g_crash.index, *g_crash.c);
  (void)!write(STDERR_FILENO, text.data(), text.size());
}

void on_signal(int sig) {
  print_crash_case();
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

constexpr std::size_t kMaxSignaturesShown = 40;

}  // namespace

std::string reproducer(uint64_t seed, int64_t index, const FuzzCase& c) {
  std::ostringstream s;
  s << "MLAKIT_FUZZ_SEED=" << seed << " MLAKIT_FUZZ_CASE=" << index << " (" << (c.host_memory ? "host buffers" : "device stand-ins")
    << "): " << c.op << "(\n"
    << describe(c.args);
  for (const auto& [name, value] : c.scalars) s << "  " << name << " = " << value << "\n";
  if (c.op == "make_tensor") {
    s << "  shape = {";
    for (std::size_t i = 0; i < c.list.size(); ++i) s << (i ? ", " : "") << c.list[i];
    s << "}\n";
  }
  s << ")";
  return s.str();
}

void install_crash_reporter() {
  // Sanitizer reports end in abort() with abort_on_error=1 (scripts/sanitize.sh sets it; GCC's
  // UBSan runs no death callback), as do std::terminate and assert. ASan owns the other signals.
  std::signal(SIGABRT, on_signal);
#if !defined(__SANITIZE_ADDRESS__)
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL}) std::signal(sig, on_signal);
#endif
}

bool Recorder::begin(int64_t index, const FuzzCase& c) {
  index_ = index;
  current_ = c;
  g_crash = CrashContext{&current_, seed_, index};
  ++stats_[c.op].calls;
  for (const KnownIssue& k : known_) {
    if (k.skip_call != nullptr && k.skip_call(c)) {
      ++known_hits_[k.id];
      ++stats_[c.op].skipped;
      return false;
    }
  }
  return true;
}

void Recorder::end() {
  current_ = FuzzCase{};
  g_crash.c = nullptr;
}

void Recorder::check_status(const Status& s, const std::vector<StatusCode>& allowed, bool accepted,
                            const std::vector<Violation>& violations) {
  const std::string& op = current_.op;
  if (std::find(allowed.begin(), allowed.end(), s.code()) == allowed.end()) {
    fail("status code", std::string(status_code_name(s.code())) + " returned: " + s.message());
  }
  if (!s.is_ok() && s.message().rfind(op + ": ", 0) != 0) {
    fail("message", std::string(status_code_name(s.code())) + " message without \"" + op + ": \": \"" + s.message() + "\"");
  }
  if (!accepted) return;
  ++stats_[op].accepted;
  for (const Violation& v : violations) {
    const auto known = std::find_if(known_.begin(), known_.end(),
                                    [&](const KnownIssue& k) { return k.waives != nullptr && k.waives(current_, v); });
    if (known != known_.end()) {
      ++known_hits_[known->id];
      ++stats_[op].waived;
    } else {
      fail("accepted: " + v.kind, v.detail + " (" + status_code_name(s.code()) + ")");
    }
  }
}

void Recorder::fail(const std::string& kind, const std::string& detail) {
  ++failures_;
  // One signature per entry point, kind and argument (the detail's first word, e.g. "q.shape[2]").
  const std::string op = current_.op.empty() ? "(no call under way)" : current_.op;
  const std::string key = op + " | " + kind + " | " + detail.substr(0, detail.find_first_of(":= "));
  Signature& sig = signatures_[key];
  if (sig.count++ == 0) sig.first = reproducer(seed_, index_, current_) + "\n  -> " + detail;
}

void Recorder::print_summary(std::ostream& os) const {
  os << "validation fuzz (seed " << seed_ << "): calls / accepted / skipped (known issue) / waived violations\n";
  for (const auto& [op, st] : stats_) {
    os << "  " << op << ": " << st.calls << " / " << st.accepted << " / " << st.skipped << " / " << st.waived << "\n";
  }
  for (const auto& [id, hits] : known_hits_) os << "  known issue " << id << ": " << hits << " cases\n";
  os << failures_ << " failures in " << signatures_.size() << " signatures\n";
  std::size_t shown = 0;
  for (const auto& [key, sig] : signatures_) {
    if (shown++ == kMaxSignaturesShown) break;
    os << "FAILURE x" << sig.count << ": " << key << "\n  first: " << sig.first << "\n";
  }
}

const std::vector<StatusCode>& gpu_codes() {
  using enum StatusCode;
  static const std::vector<StatusCode> codes =
      MLAKIT_WITH_CUDA ? std::vector<StatusCode>{kOk, kInvalidArgument, kUnsupported, kUnsupportedArchitecture,
                                                 kWorkspaceTooSmall, kCudaError, kNoDevice}
                       : std::vector<StatusCode>{kInvalidArgument, kUnsupported, kNoDevice};
  return codes;
}

// ResourceExhausted: host memory a reference needed could not be allocated (a case is small, but
// the code is part of the references' contract).
const std::vector<StatusCode>& reference_codes() {
  static const std::vector<StatusCode> codes = {StatusCode::kOk, StatusCode::kInvalidArgument,
                                                StatusCode::kUnsupported, StatusCode::kResourceExhausted};
  return codes;
}

bool reached_device(const Status& s) {
  using enum StatusCode;
  return s.is_ok() || s.code() == kNoDevice || s.code() == kUnsupportedArchitecture || s.code() == kCudaError;
}

int reference_threads(Rng& rng) { return rng.chance(0.9) ? 1 : static_cast<int>(rng.pick({0, 2, -1, 3})); }

std::optional<float> random_scale(Rng& rng) {
  if (rng.chance(0.2)) return std::nullopt;
  return rng.chance(0.7) ? static_cast<float>(rng.uniform(1, 1000)) / 1000.0f : rng.edge_float();
}

std::string str(float v) {
  std::ostringstream s;
  s.precision(9);
  s << v;
  return s.str();
}

std::string str(std::optional<float> v) { return v ? str(*v) : "unset"; }

int64_t symbol(const Symbols& s, const char* name, int64_t fallback) {
  const auto it = s.find(name);
  return it == s.end() ? fallback : it->second;
}

}  // namespace mlakit::fuzz
