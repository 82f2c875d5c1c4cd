// The dense MLA decode cases of docs/benchmarking.md, and FlashMLA's fixed H100 times.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace mlakit::bench {

struct BenchCase {
  std::string name;  // e.g. "b128_hq128_sq1_sk4096_varlen_p64"; --filter matches on it
  int64_t b = 0;
  int s_q = 1;
  int h_q = 128;
  int h_kv = 1;
  int32_t s_k = 0;  // nominal length: every length (fixed) or the mean (varlen)
  int page = 64;
  bool causal = false;
  bool varlen = false;
  // FlashMLA on an H100 (docs/benchmarking.md), where the table has this case. A fixed figure, not
  // measured in the run: the ratio means something only when the run is on an H100.
  std::optional<double> flashmla_h100_us;

  // The memory-bound class (docs/benchmarking.md) (h_q <= 32, s_q = 1): judged against copy bandwidth.
  bool memory_bound() const { return h_q <= 32 && s_q == 1; }
};

// Every case, or with `quick` one compute-bound s_k=4096 case and one memory-bound case.
std::vector<BenchCase> bench_cases(bool quick);

// The cases whose name contains `substring` (all of them for an empty one).
// Whether a case name matches --filter: any of its comma-separated substrings (empty: all).
bool matches_filter(const std::string& name, const std::string& filter);

std::vector<BenchCase> filter_cases(const std::vector<BenchCase>& cases,
                                    const std::string& substring);

}  // namespace mlakit::bench
