#include "bench/cases.h"

#include <cstdio>

namespace mlakit::bench {
namespace {

// FlashMLA's default page size, used by every case but the page sweep.
constexpr int kDefaultPage = 64;

BenchCase make_case(int64_t b, int s_q, int h_q, int32_t s_k, bool varlen, bool causal, int page,
                    std::optional<double> flashmla_h100_us) {
  BenchCase c;
  c.b = b;
  c.s_q = s_q;
  c.h_q = h_q;
  c.s_k = s_k;
  c.varlen = varlen;
  c.causal = causal;
  c.page = page;
  c.flashmla_h100_us = flashmla_h100_us;
  char name[96];
  std::snprintf(name, sizeof name, "b%lld_hq%d_sq%d_sk%d_%s%s_p%d", static_cast<long long>(b), h_q,
                s_q, s_k, varlen ? "varlen" : "fixed", causal ? "_causal" : "", page);
  c.name = name;
  return c;
}

}  // namespace

std::vector<BenchCase> bench_cases(bool quick) {
  constexpr bool kVarlen = true, kFixed = false;
  constexpr bool kCausal = true, kNonCausal = false;
  const BenchCase compute_4k = make_case(128, 1, 128, 4096, kVarlen, kNonCausal, kDefaultPage, 289);
  const BenchCase memory_8k = make_case(32, 1, 16, 8192, kFixed, kNonCausal, kDefaultPage, 126);
  if (quick) return {compute_4k, memory_8k};
  return {
      // Compute-bound, s_q = 1.
      compute_4k,
      make_case(128, 1, 128, 8192, kVarlen, kNonCausal, kDefaultPage, 534),
      make_case(128, 1, 128, 16384, kVarlen, kNonCausal, kDefaultPage, 1021),
      make_case(128, 1, 128, 32768, kVarlen, kNonCausal, kDefaultPage, 2012),
      // Compute-bound, s_q = 2 (speculative decoding).
      make_case(128, 2, 128, 4096, kVarlen, kNonCausal, kDefaultPage, 473),
      make_case(128, 2, 128, 32768, kVarlen, kNonCausal, kDefaultPage, 3613),
      make_case(128, 2, 128, 32768, kVarlen, kCausal, kDefaultPage, 3565),
      // Memory-bound.
      memory_8k,
      make_case(128, 1, 16, 32768, kFixed, kNonCausal, kDefaultPage, 1644),
      // Page sweep of the first case (its page-64 point is compute_4k above); FlashMLA's
      // figure is for page 64, so these have none.
      make_case(128, 1, 128, 4096, kVarlen, kNonCausal, 16, std::nullopt),
      make_case(128, 1, 128, 4096, kVarlen, kNonCausal, 32, std::nullopt),
  };
}

bool matches_filter(const std::string& name, const std::string& filter) {
  std::size_t begin = 0;
  while (true) {
    const std::size_t end = filter.find(',', begin);
    if (name.find(filter.substr(begin, end - begin)) != std::string::npos) return true;
    if (end == std::string::npos) return false;
    begin = end + 1;
  }
}

std::vector<BenchCase> filter_cases(const std::vector<BenchCase>& cases,
                                    const std::string& substring) {
  std::vector<BenchCase> kept;
  for (const BenchCase& c : cases) {
    if (matches_filter(c.name, substring)) kept.push_back(c);
  }
  return kept;
}

}  // namespace mlakit::bench
