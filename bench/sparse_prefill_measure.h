// The sparse MLA prefill cases of docs/benchmarking.md (issue 5) and their measurement.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "bench/measure.h"
#include "bench/results_json.h"

namespace mlakit::bench {

struct PrefillBenchCase {
  std::string name;  // e.g. "prefill_sq4096_hq128_topk2048_skv131072_near_end"; --filter matches on it
  int64_t s_q = 4096;
  int h_q = 128;
  int d_qk = 576;
  int topk = 2048;
  int64_t s_kv = 8192;
  // 0: indices uniform over s_kv; > 0: 90% of them in the last `window` rows (the brief's
  // "indices near the end": the recent context a causal prefill mostly selects).
  int64_t window = 0;
  std::optional<double> flashmla_h100_us;
};

std::vector<PrefillBenchCase> prefill_bench_cases(bool quick, const std::string& filter);

struct PrefillResult {
  double time_us = 0, flops = 0, bytes = 0, tflops = 0, gbps = 0;
  double sm_mhz = 0;   // median SM clock probed between the timed rounds
  std::string kernel;  // the kernel family that ran
};

// Random q and kv generated on the device, random valid indices; times mla_sparse_prefill
// (docs/benchmarking.md protocol: warm-up, L2 flushed before each run, median) and checks that every lse
// is finite.
PrefillResult run_prefill_case(const PrefillBenchCase& c, const RunSettings& settings);

// The case's JSON fields, beyond those every line of a run repeats.
JsonLine prefill_json(const PrefillBenchCase& c, const PrefillResult& r, double copy_gbps);

}  // namespace mlakit::bench
