#include "bench/sparse_prefill_measure.h"

#include <algorithm>
#include <cmath>

#include "bench/cases.h"
#include "bench/check.h"
#include "bench/device_data.h"
#include "mlakit/mla_sparse_prefill.h"
#include "support/gpu_timing.h"
#include "support/sparse_prefill_case.h"

namespace mlakit::bench {
namespace {

constexpr uint64_t kIndexSeed = 41;
constexpr int64_t kNearEndWindow = 20000;
constexpr int kDv = 512;

PrefillBenchCase make(int h_q, int64_t s_kv, bool near_end, std::optional<double> flashmla_us) {
  PrefillBenchCase c;
  c.h_q = h_q;
  c.s_kv = s_kv;
  c.window = near_end ? kNearEndWindow : 0;
  c.flashmla_h100_us = flashmla_us;
  c.name = "prefill_sq" + std::to_string(c.s_q) + "_hq" + std::to_string(h_q) + "_topk" + std::to_string(c.topk) +
           "_skv" + std::to_string(s_kv) + (near_end ? "_near_end" : "_uniform");
  return c;
}

}  // namespace

std::vector<PrefillBenchCase> prefill_bench_cases(bool quick, const std::string& filter) {
  // FlashMLA's H100 times (docs/benchmarking.md, protocol): s_kv 8192 uniform, 131072 uniform and near the end.
  std::vector<PrefillBenchCase> all = {make(128, 8192, false, 3764)};
  if (!quick) {
    all.push_back(make(128, 131072, false, 4560));
    all.push_back(make(128, 131072, true, 4120));
    for (const auto& [s_kv, near_end] : {std::pair<int64_t, bool>{8192, false}, {131072, false}, {131072, true}}) {
      all.push_back(make(64, s_kv, near_end, std::nullopt));
    }
  }
  std::vector<PrefillBenchCase> kept;
  for (const auto& c : all) {
    if (matches_filter(c.name, filter)) kept.push_back(c);
  }
  return kept;
}

PrefillResult run_prefill_case(const PrefillBenchCase& c, const RunSettings& s) {
  const std::vector<int32_t> host_indices = support::make_prefill_indices(
      support::SparsePrefillSpec{.s_q = c.s_q, .s_kv = c.s_kv, .h_q = c.h_q, .d_qk = c.d_qk, .topk = c.topk,
                                 .invalid_fraction = 0, .duplicate_fraction = 0, .window = c.window,
                                 .empty_token = -1, .seed = kIndexSeed},
      c.topk);
  DeviceBuffer indices(host_indices);
  DeviceBuffer q(c.s_q * c.h_q * c.d_qk * 2), kv(c.s_kv * c.d_qk * 2), out(c.s_q * c.h_q * kDv * 2);
  DeviceBuffer max_logits(c.s_q * c.h_q * 4), lse(c.s_q * c.h_q * 4);
  fill_uniform(q.get(), DType::kBF16, c.s_q * c.h_q * c.d_qk, 11, s.stream);
  fill_uniform(kv.get(), DType::kBF16, c.s_kv * c.d_qk, 12, s.stream);

  MlaSparsePrefillArgs args;
  args.q = make_tensor(q.get(), DType::kBF16, {c.s_q, c.h_q, c.d_qk});
  args.kv = make_tensor(kv.get(), DType::kBF16, {c.s_kv, 1, c.d_qk});
  args.indices = make_tensor(indices.get(), DType::kInt32, {c.s_q, 1, c.topk});
  args.out = make_tensor(out.get(), DType::kBF16, {c.s_q, c.h_q, kDv});
  args.max_logits = make_tensor(max_logits.get(), DType::kFP32, {c.s_q, c.h_q});
  args.lse = make_tensor(lse.get(), DType::kFP32, {c.s_q, c.h_q});
  args.kernel = s.kernel;
  const FlushedTiming timing = time_flushed(s, [&] { BENCH_STATUS(mla_sparse_prefill(args, s.stream)); });
  const std::vector<float> host_lse = lse.download<float>();
  const auto bad = std::count_if(host_lse.begin(), host_lse.end(), [](float x) { return !std::isfinite(x); });
  if (bad > 0) fail(c.name + ": " + std::to_string(bad) + " lse values are not finite");

  PrefillResult r;
  r.time_us = timing.median_us;
  r.kernel = kernel_name(s.kernel);
  r.sm_mhz = timing.sm_mhz;
  // docs/benchmarking.md, counting: 2 * s_q * h_q * topk * (d_qk + d_v). Bytes: q, the gathered kv rows (each token
  // reads its own topk rows once), out, max_logits and lse.
  r.flops = 2.0 * c.s_q * c.h_q * c.topk * (c.d_qk + kDv);
  r.bytes = static_cast<double>(c.s_q) * (c.h_q * c.d_qk * 2.0 + c.topk * c.d_qk * 2.0 + c.h_q * kDv * 2.0 + c.h_q * 8.0);
  r.tflops = r.flops / (r.time_us * 1e-6) / 1e12;
  r.gbps = r.bytes / (r.time_us * 1e-6) / 1e9;
  return r;
}

JsonLine prefill_json(const PrefillBenchCase& c, const PrefillResult& r, double copy_gbps) {
  const std::optional<double> speedup =
      c.flashmla_h100_us ? std::optional<double>(*c.flashmla_h100_us / r.time_us) : std::nullopt;
  const std::optional<double> baseline_tflops =
      c.flashmla_h100_us ? std::optional<double>(r.flops / (*c.flashmla_h100_us * 1e-6) / 1e12) : std::nullopt;
  JsonLine line;
  line.text("op", "mla_sparse_prefill")
      .text("case", c.name)
      .text("dtype", "bf16")
      .integer("s_q", c.s_q)
      .integer("h_q", c.h_q)
      .integer("h_kv", 1)
      .integer("d_qk", c.d_qk)
      .integer("topk", c.topk)
      .integer("s_kv", c.s_kv)
      .text("indices", c.window > 0 ? "near_end" : "uniform")
      .integer("window", c.window)
      .number("time_us", r.time_us)
      .number("sm_mhz_measured", r.sm_mhz)
      .number("flops", r.flops)
      .number("bytes", r.bytes)
      .number("tflops", r.tflops)
      .number("gbps", r.gbps)
      .text("kernel", r.kernel)
      .number("copy_gbps", copy_gbps)
      .number("baseline_us", c.flashmla_h100_us)
      .number("baseline_tflops", baseline_tflops)
      .text("baseline", "FlashMLA H100 (fixed figures, docs/benchmarking.md)")
      .number("speedup", speedup);
  return line;
}

}  // namespace mlakit::bench
