// The command line of mlakit-run (the main job), parsed strictly: every value must be a whole
// integer within its flag's range, and h_q a multiple of h_kv; anything else is an error that
// names the flag. Also which problem the CPU reference runs when there is no GPU: the
// requested one when it is small enough, otherwise a named, smaller one (never silently).
#pragma once

#include <cstdint>
#include <string>

#include "mlakit/status.h"
#include "mlakit/tensor.h"

namespace mlakit::app {

struct RunOptions {
  int64_t b = 64;
  int s_q = 1;
  int h_q = 128;
  int h_kv = 1;
  int s_k = 4096;  // every sequence's length (--fixed) or the mean of normal(s_k, s_k / 2) lengths
  int page = 64;
  bool causal = false;
  bool varlen = true;
  bool force_cpu = false;
  bool help = false;
  DType dtype = DType::kBF16;
  bool problem_given = false;  // one of --b --s_q --h_q --h_kv --s_k --page was passed
};

std::string run_usage();

// argv[1..argc) into *options (defaults for what is not given). InvalidArgument names the
// flag, the expected and the actual value; *options is then unspecified.
Status parse_run_options(int argc, const char* const* argv, RunOptions* options);

// "b=4 s_q=2 h_q=16 h_kv=1 s_k~300 page=64 causal bf16" ("s_k=" with --fixed).
std::string describe_problem(const RunOptions& o);

// FLOPs (docs/benchmarking.md) of the problem (lengths at their mean) and the host bytes of its tensors as
// mlakit-run builds them (q, paged cache, outputs and the reference's float32 copy).
double problem_flops(const RunOptions& o);
double problem_host_bytes(const RunOptions& o);

// InvalidArgument when the problem's host tensors need more than `available_bytes`.
Status check_host_memory(const RunOptions& o, double available_bytes);

// The problem the CPU reference runs, and a note saying which and why when it is not the
// requested one: without problem flags the GPU default is too large and a small problem runs;
// with problem flags the requested problem runs if it is within the CPU limits, else the same
// problem with b and s_k reduced, else the small problem.
struct CpuProblem {
  RunOptions options;
  std::string note;
};
CpuProblem choose_cpu_problem(const RunOptions& requested);

inline constexpr double kCpuFlopLimit = 2e10;                 // seconds of the float64 reference
inline constexpr double kCpuHostBytesLimit = double(1 << 30);  // 1 GiB of host tensors

}  // namespace mlakit::app
