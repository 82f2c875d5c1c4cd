#include "apps/run_options.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>

namespace mlakit::app {
namespace {

constexpr const char* kOp = "mlakit-run";
constexpr int kDqk = 576;
constexpr int kDv = 512;
constexpr int kHalfBytes = 2;
constexpr int kSpareBlocks = 3;  // support::DecodeCaseSpec's cache blocks owned by no sequence

// Integer flags and their ranges. s_k stops at 2^28 so that the varlen lengths, normal(s_k,
// s_k / 2), stay far inside int32; page at the library's 2^30.
struct IntFlag {
  const char* name;
  int64_t min, max;
  void (*set)(RunOptions*, int64_t);
};
constexpr IntFlag kIntFlags[] = {
    {"--b", 1, int64_t{1} << 20, [](RunOptions* o, int64_t v) { o->b = v; }},
    {"--s_q", 1, 1024, [](RunOptions* o, int64_t v) { o->s_q = static_cast<int>(v); }},
    {"--h_q", 1, 1024, [](RunOptions* o, int64_t v) { o->h_q = static_cast<int>(v); }},
    {"--h_kv", 1, 1024, [](RunOptions* o, int64_t v) { o->h_kv = static_cast<int>(v); }},
    {"--s_k", 1, int64_t{1} << 28, [](RunOptions* o, int64_t v) { o->s_k = static_cast<int>(v); }},
    {"--page", 1, int64_t{1} << 30, [](RunOptions* o, int64_t v) { o->page = static_cast<int>(v); }},
};

struct SwitchFlag {
  const char* name;
  void (*set)(RunOptions*);
};
constexpr SwitchFlag kSwitchFlags[] = {
    {"--causal", [](RunOptions* o) { o->causal = true; }},
    {"--fixed", [](RunOptions* o) { o->varlen = false; }},
    {"--fp16", [](RunOptions* o) { o->dtype = DType::kFP16; }},
    {"--cpu", [](RunOptions* o) { o->force_cpu = true; }},
    {"--help", [](RunOptions* o) { o->help = true; }},
    {"-h", [](RunOptions* o) { o->help = true; }},
};

Status invalid(const std::string& what) { return Status(StatusCode::kInvalidArgument, std::string(kOp) + ": " + what); }

// The whole of `text` as a decimal integer in [flag.min, flag.max].
Status parse_int(const IntFlag& flag, const char* text, int64_t* value) {
  const char* end = text + std::strlen(text);
  const auto [ptr, ec] = std::from_chars(text, end, *value);
  if (ec == std::errc() && ptr == end && *value >= flag.min && *value <= flag.max) {
    return Status::ok();
  }
  return invalid(std::string(flag.name) + ": expected an integer in [" + std::to_string(flag.min) + ", " +
                 std::to_string(flag.max) + "], got \"" + text + "\"");
}

std::string gib(double bytes) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f GiB", bytes / double(1 << 30));
  return text;
}

std::string gflop(double flops) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f GFLOP", flops * 1e-9);
  return text;
}

bool fits_cpu(const RunOptions& o) {
  return problem_flops(o) <= kCpuFlopLimit && problem_host_bytes(o) <= kCpuHostBytesLimit;
}

// The CPU problem of the main job when none is asked for: small, causal MTP, the caller's
// dtype and length distribution.
RunOptions small_cpu_problem(const RunOptions& requested) {
  RunOptions o = requested;
  o.b = 4;
  o.s_q = 2;
  o.h_q = 16;
  o.h_kv = 1;
  o.s_k = 300;
  o.page = 64;
  o.causal = true;
  return o;
}

std::string over_limits(const RunOptions& o) {
  return "the requested problem (" + describe_problem(o) + ") needs " + gflop(problem_flops(o)) + " and " +
         gib(problem_host_bytes(o)) + " of host tensors, over the CPU reference's limits (" + gflop(kCpuFlopLimit) +
         ", " + gib(kCpuHostBytesLimit) + ")";
}

}  // namespace

std::string run_usage() {
  return "usage: mlakit-run [--b N] [--s_q N] [--h_q N] [--h_kv N] [--s_k N] [--page N] [--causal]\n"
         "                  [--fixed] [--fp16] [--cpu] [--help]\n"
         "Runs the dense MLA decode on the GPU (default: b=64 h_q=128 h_kv=1 s_q=1 s_k~4096 varlen,\n"
         "page 64, bf16), checks it against the CPU reference and prints time, TFLOP/s and GB/s.\n"
         "  --b N      batch size, 1..1048576            --s_q N   query tokens per sequence, 1..1024\n"
         "  --h_q N    query heads, 1..1024              --h_kv N  kv heads, 1..1024, dividing h_q\n"
         "  --s_k N    mean sequence length, 1..2^28     --page N  page size, 1..2^30\n"
         "  --causal   causal mask (s_q > 1)             --fixed   every length = s_k (default normal(s_k, s_k/2))\n"
         "  --fp16     fp16 instead of bf16              --cpu     run the CPU reference even with a GPU\n"
         "Without a GPU (or with --cpu) the CPU reference runs: the requested problem when it is small\n"
         "enough, otherwise a smaller one, named in the output.\n";
}

Status parse_run_options(int argc, const char* const* argv, RunOptions* options) {
  RunOptions o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const auto as_switch = std::find_if(std::begin(kSwitchFlags), std::end(kSwitchFlags),
                                        [&](const SwitchFlag& f) { return arg == f.name; });
    if (as_switch != std::end(kSwitchFlags)) {
      as_switch->set(&o);
      continue;
    }
    const auto as_int = std::find_if(std::begin(kIntFlags), std::end(kIntFlags),
                                     [&](const IntFlag& f) { return arg == f.name; });
    if (as_int == std::end(kIntFlags)) return invalid("unknown option \"" + arg + "\" (--help lists the options)");
    if (i + 1 >= argc) return invalid(arg + ": expected a value, got none");
    int64_t value = 0;
    MLAKIT_RETURN_IF_ERROR(parse_int(*as_int, argv[++i], &value));
    as_int->set(&o, value);
    o.problem_given = true;
  }
  if (o.h_q % o.h_kv != 0) {
    return invalid("--h_kv: expected a divisor of h_q (" + std::to_string(o.h_q) + "), got " +
                   std::to_string(o.h_kv));
  }
  *options = o;
  return Status::ok();
}

std::string describe_problem(const RunOptions& o) {
  return "b=" + std::to_string(o.b) + " s_q=" + std::to_string(o.s_q) + " h_q=" + std::to_string(o.h_q) +
         " h_kv=" + std::to_string(o.h_kv) + (o.varlen ? " s_k~" : " s_k=") + std::to_string(o.s_k) +
         " page=" + std::to_string(o.page) + (o.causal ? " causal " : " ") + dtype_name(o.dtype);
}

double problem_flops(const RunOptions& o) {
  return double(o.b) * o.s_q * o.h_q * double(o.s_k) * (2.0 * kDqk + 2.0 * kDv);
}

double problem_host_bytes(const RunOptions& o) {
  const double blocks = double(o.b) * (std::ceil(double(o.s_k) / o.page) + 1) + kSpareBlocks;
  const double q = double(o.b) * o.s_q * o.h_q * kDqk * kHalfBytes;
  const double cache = blocks * o.page * o.h_kv * kDqk * kHalfBytes;
  const double outputs = double(o.b) * o.s_q * o.h_q * kDv * (kHalfBytes + sizeof(float));
  return q + cache + outputs;
}

Status check_host_memory(const RunOptions& o, double available_bytes) {
  const double needed = problem_host_bytes(o);
  if (needed <= available_bytes) return Status::ok();
  return invalid("problem size (" + describe_problem(o) + "): expected host tensors of at most " +
                 gib(available_bytes) + " (the host's memory), got " + gib(needed) + ": lower --b, --s_k or --page");
}

CpuProblem choose_cpu_problem(const RunOptions& requested) {
  if (!requested.problem_given) {
    const RunOptions small = small_cpu_problem(requested);
    return {small, "the GPU problem (" + describe_problem(requested) + ", " + gflop(problem_flops(requested)) +
                       ") is too large for the CPU reference: running " + describe_problem(small) +
                       " instead (problem flags choose another)"};
  }
  if (fits_cpu(requested)) return {requested, "running the requested problem"};
  RunOptions reduced = requested;
  reduced.b = std::min<int64_t>(requested.b, 4);
  reduced.s_k = std::min(requested.s_k, 300);
  if (fits_cpu(reduced)) {
    return {reduced, over_limits(requested) + ": running " + describe_problem(reduced) +
                         " instead (b and s_k reduced, other flags as given)"};
  }
  const RunOptions small = small_cpu_problem(requested);
  return {small, over_limits(requested) + ": running " + describe_problem(small) + " instead"};
}

}  // namespace mlakit::app
