// Fuzz test of every entry point's argument validation (issue 23): random ranks, sizes
// (0, negative, 2^31, 2^32 + k, INT64_MAX), strides (0, negative, huge, non-contiguous last
// dimension), dtypes (invalid enum values too), null, misaligned and host pointers, and edge
// scale values, mostly as small mutations of valid arguments so that every check is reached.
//
// Each call must return (no crash: run it under scripts/sanitize.sh to see memory errors), with
// a code the entry point may return and an error message that starts with "<op>: ", and every
// input it accepts must meet the documented contract (validation_fuzz.h's check). GPU entry
// points get addresses that must never be read on the host; the CPU references get host
// buffers of exactly the bytes each tensor claims (or null), so a reference can only touch
// memory that does not exist through a validation bug.
//
// Deterministic: MLAKIT_FUZZ_SEED (default 23), MLAKIT_FUZZ_CASES (default 100000 calls, shared
// round-robin by the entry points), MLAKIT_FUZZ_CASE=<i> replays case i alone (each case has
// its own generator), MLAKIT_FUZZ_CHECK_KNOWN=<id,...|all> checks cases a kKnownIssues entry
// would skip or waive. A failure prints, per signature, the first case's call; a crash prints
// the case it happened in (under the sanitizers with abort_on_error=1, as scripts/sanitize.sh
// sets).
#include <gtest/gtest.h>

#include <cstdlib>
#include <exception>
#include <iostream>
#include <string>
#include <vector>

#include "validation_fuzz_runner.h"

namespace mlakit::fuzz {
namespace {

// Known defects being fixed: calls that would crash are skipped, contract violations they
// explain are waived (validation_fuzz_runner.h, KnownIssue). Add an entry with the issue that
// tracks the fix; remove it with the fix (check it first with MLAKIT_FUZZ_CHECK_KNOWN=<id>).
// Empty: issue 23's fixes resolved every defect this test found (docs/testing.md).
const std::vector<KnownIssue> kKnownIssues = {};

int64_t env_int(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::strtoll(v, nullptr, 10) : fallback;
}

// kKnownIssues but those MLAKIT_FUZZ_CHECK_KNOWN names (comma-separated ids, or "all"): how
// a fix is checked before its entry is removed.
std::vector<KnownIssue> known_issues_in_force() {
  const char* env = std::getenv("MLAKIT_FUZZ_CHECK_KNOWN");
  const std::string checked = env != nullptr ? "," + std::string(env) + "," : "";
  std::vector<KnownIssue> out;
  for (const KnownIssue& k : kKnownIssues) {
    if (checked != ",all," && checked.find("," + std::string(k.id) + ",") == std::string::npos) out.push_back(k);
  }
  return out;
}

TEST(ValidationFuzz, EveryEntryPointReturnsAStatusAndAcceptsOnlyWhatTheContractAllows) {
  const auto seed = static_cast<uint64_t>(env_int("MLAKIT_FUZZ_SEED", 23));
  const int64_t cases = env_int("MLAKIT_FUZZ_CASES", 100000);
  const int64_t only = env_int("MLAKIT_FUZZ_CASE", -1);
  std::vector<OpDriver> ops = decode_drivers();
  for (const OpDriver& d : other_drivers()) ops.push_back(d);
  for (const OpDriver& d : attention_drivers()) ops.push_back(d);
  for (const OpDriver& d : merge_drivers()) ops.push_back(d);
  install_crash_reporter();
  Recorder rec(seed, known_issues_in_force());
  const int64_t first = only >= 0 ? only : 0, last = only >= 0 ? only + 1 : cases;
  for (int64_t i = first; i < last; ++i) {
    // Per-case generator: a case replays alone from (seed, index).
    Rng rng(Rng(seed).next() ^ (static_cast<uint64_t>(i) * 0xD1B54A32D192ED03ull));
    try {
      ops[i % ops.size()].run(rng, rec, i);
    } catch (const std::exception& e) {
      rec.fail("exception", std::string(ops[i % ops.size()].name) + ": threw " + e.what());
    }
    rec.end();
  }
  rec.print_summary(std::cout);
  EXPECT_EQ(rec.failures(), 0) << "failures listed above, each with the first case that shows it";
}

}  // namespace
}  // namespace mlakit::fuzz
