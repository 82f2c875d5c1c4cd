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

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <iostream>
#include <string>
#include <vector>

#include "validation_fuzz_runner.h"

namespace mlakit::fuzz {
namespace {

const Arg* arg_named(const FuzzCase& c, const char* name) {
  for (const Arg& a : c.args) {
    if (a.spec.name == name) return &a;
  }
  return nullptr;
}

// make_tensor computes row-major strides with signed products that overflow for huge shapes.
bool make_tensor_overflows(const FuzzCase& c) {
  if (c.op != "make_tensor" || c.list.size() > static_cast<std::size_t>(kMaxRank)) return false;
  int64_t step = 1;
  for (auto it = c.list.rbegin(); it != c.list.rend(); ++it) {
    if (__builtin_mul_overflow(step, *it, &step)) return true;
  }
  return false;
}

// reference::mla_decode allocates per-key vectors of the sequence's length before it looks at
// the block table, so a huge cache_seqlens entry exhausts memory.
bool reference_huge_seqlens(const FuzzCase& c) {
  const Arg* a = arg_named(c, "cache_seqlens");
  if (c.op != "reference::mla_decode" || a == nullptr || a->ref.data == nullptr || a->ref.rank != 1 ||
      a->ref.dtype != DType::kInt32 || a->ref.shape[0] < 0 || a->ref.stride[0] < 0) {
    return false;
  }
  // A host buffer of the claimed layout (maybe misaligned); with stride 0 every entry is the first.
  const auto* lengths = static_cast<const std::byte*>(a->ref.data);
  const int64_t entries = a->ref.stride[0] == 0 ? std::min<int64_t>(a->ref.shape[0], 1) : a->ref.shape[0];
  for (int64_t i = 0; i < entries; ++i) {
    int32_t length;
    std::memcpy(&length, lengths + 4 * i * a->ref.stride[0], 4);
    if (length > (1 << 20)) return true;
  }
  return false;
}

// An output with more elements than its host buffer has bytes can only alias itself (stride
// 0): a reference would loop over all of them (2^62 for a broadcast batch).
bool reference_aliased_huge_output(const FuzzCase& c) {
  for (const Arg& a : c.args) {
    if (!c.host_memory || !a.spec.output || a.ref.data == nullptr || a.ref.rank < 1 || a.ref.rank > kMaxRank) continue;
    int64_t elements = 1;
    for (int i = 0; i < a.ref.rank; ++i) {
      if (__builtin_mul_overflow(elements, std::max<int64_t>(a.ref.shape[i], 0), &elements)) return true;
    }
    if (elements > Memory::kMaxBytes) return true;
  }
  return false;
}

// The references load 2- and 4-byte elements through typed pointers and never check alignment
// (the GPU entry points do): a misaligned tensor is undefined behaviour (UBSan reports it).
bool reference_misaligned(const FuzzCase& c) {
  for (const Arg& a : c.args) {
    const auto size = static_cast<int>(dtype_size(a.ref.dtype));
    if (c.host_memory && a.ref.data != nullptr && size > 1 && a.misalign_bytes % size != 0) return true;
  }
  return false;
}

bool waives_kind(const Violation& v, const char* kind) { return v.kind == kind; }

// Known defects being fixed (issue 23). Remove an entry with its fix (check it first with
// MLAKIT_FUZZ_CHECK_KNOWN=<id>); the test then checks those cases too.
const std::vector<KnownIssue> kKnownIssues = {
    // make_tensor's row-major stride products overflow (signed, UB) for huge shapes: the call is
    // not made.
    {"make_tensor-stride-overflow", make_tensor_overflows, nullptr},
    // reference::mla_decode runs out of memory for lengths > 2^20: the call is not made.
    {"reference-mla_decode-huge-cache_seqlens", reference_huge_seqlens, nullptr},
    // Misaligned host tensors given to the references: the call is not made.
    {"reference-misaligned-loads", reference_misaligned, nullptr},
    // softmax_scale / sm_scale NaN means "default" today (kDefaultSoftmaxScale), to become an
    // explicit optional scale: accepted NaN is waived.
    {"nan-scale-sentinel", nullptr, [](const FuzzCase&, const Violation& v) { return waives_kind(v, "scale-nan"); }},
    // Outputs whose strides alias elements (a stride 0, or strides that are multiples of each
    // other within a dimension's extent) are accepted: waived. The references are not called
    // where such an output has more elements than they could loop over.
    {"output-overlap", reference_aliased_huge_output,
     [](const FuzzCase&, const Violation& v) { return waives_kind(v, "overlap"); }},
    // The sparse decode and prefill narrow sizes to int before comparing them (q.shape[2] =
    // 2^32 + 4 passes as h_q = 4 when the other tensors say 4): waived for those entry points.
    {"sparse-64bit-narrowing", nullptr,
     [](const FuzzCase& c, const Violation& v) {
       return c.op.find("sparse") != std::string::npos && waives_kind(v, "dims-narrowed");
     }},
};

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
