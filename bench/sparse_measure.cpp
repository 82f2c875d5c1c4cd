#include "bench/sparse_measure.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "bench/cases.h"
#include "bench/check.h"
#include "bench/device_data.h"
#include "mlakit/fp8_cache.h"
#include "mlakit/mla_sparse_decode.h"
#include "support/gpu_timing.h"

namespace mlakit::bench {
namespace {

constexpr uint64_t kIndexSeed = 31;
constexpr int64_t kQuantizeChunk = 1 << 20;  // tokens per bf16 staging chunk (1.2 GB)

SparseBenchCase make(int64_t b, int s_q, int h_q, int topk, int32_t s_k, std::optional<double> flashmla_us) {
  SparseBenchCase c{"", b, s_q, h_q, topk, s_k, 64, flashmla_us};
  c.name = "sparse_b" + std::to_string(b) + "_hq" + std::to_string(h_q) + "_sq" + std::to_string(s_q) + "_topk" +
           std::to_string(topk) + "_sk" + std::to_string(s_k) + "_p64";
  return c;
}

}  // namespace

std::vector<SparseBenchCase> sparse_bench_cases(bool quick, const std::string& filter) {
  std::vector<SparseBenchCase> all = {make(128, 2, 128, 2048, 32768, 373), make(64, 2, 128, 2048, 32768, 192)};
  if (!quick) {
    for (int topk : {512, 1024, 2048, 16384}) all.push_back(make(128, 2, 64, topk, 32768, std::nullopt));
  }
  std::vector<SparseBenchCase> kept;
  for (const auto& c : all) {
    if (matches_filter(c.name, filter)) kept.push_back(c);
  }
  return kept;
}

DeviceSparseCase make_device_sparse_case(const SparseBenchCase& c, MlaKernel kernel, cudaStream_t stream) {
  const int64_t tokens = c.b * static_cast<int64_t>(c.s_k);
  const int64_t num_blocks = tokens / c.page;
  DeviceBuffer cache(tokens * kMlaFp8TokenBytes);
  {
    const int64_t chunk = std::min(tokens, kQuantizeChunk);
    DeviceBuffer staging(chunk * 576 * 2);
    for (int64_t first = 0; first < tokens; first += chunk) {
      const int64_t n = std::min(chunk, tokens - first);
      fill_uniform(staging.get(), DType::kBF16, n * 576, 1000 + first, stream);
      BENCH_STATUS(quantize_mla_cache_fp8(
          make_tensor(staging.get(), DType::kBF16, {n, 576}),
          make_tensor(static_cast<uint8_t*>(cache.get()) + first * kMlaFp8TokenBytes, DType::kUInt8, {n, 656}),
          stream));
    }
  }
  std::vector<int32_t> host_indices(c.b * c.s_q * c.topk);
  std::mt19937_64 rng(kIndexSeed);
  std::uniform_int_distribution<int32_t> pos(0, c.s_k - 1);
  for (int64_t i = 0; i < c.b; ++i) {
    for (int64_t k = 0; k < int64_t{c.s_q} * c.topk; ++k) {
      host_indices[i * c.s_q * c.topk + k] = static_cast<int32_t>(i * c.s_k + pos(rng));
    }
  }
  DeviceSparseCase d{std::move(cache), DeviceBuffer(host_indices), DeviceBuffer(c.b * c.s_q * c.h_q * 576 * 2),
                     DeviceBuffer(c.b * c.s_q * c.h_q * 512 * 2), DeviceBuffer(c.b * c.h_q * c.s_q * 4), {}, {}};
  fill_uniform(d.q.get(), DType::kBF16, c.b * c.s_q * c.h_q * 576, 7, stream);
  d.args.q = make_tensor(d.q.get(), DType::kBF16, {c.b, c.s_q, c.h_q, 576});
  d.args.kv_cache = make_tensor(d.cache.get(), DType::kUInt8, {num_blocks, c.page, 1, 656});
  d.args.indices = make_tensor(d.indices.get(), DType::kInt32, {c.b, c.s_q, c.topk});
  d.args.out = make_tensor(d.out.get(), DType::kBF16, {c.b, c.s_q, c.h_q, 512});
  d.args.lse = make_tensor(d.lse.get(), DType::kFP32, {c.b, c.h_q, c.s_q});
  d.problem = MlaSparseDecodeProblem{.b = c.b, .s_q = c.s_q, .h_q = c.h_q, .topk = c.topk, .kernel = kernel};
  return d;
}

SparseResult run_sparse_case(const SparseBenchCase& c, const RunSettings& s) {
  DeviceSparseCase d = make_device_sparse_case(c, s.kernel, s.stream);
  const MlaSparseDecodeArgs& args = d.args;
  const MlaSparseDecodeProblem& problem = d.problem;
  std::size_t bytes = 0;
  BENCH_STATUS(mla_sparse_decode_workspace_size(problem, &bytes));
  DeviceBuffer workspace(bytes);
  MlaDecodePlan plan;
  const FlushedTiming plan_timing = time_flushed(s, [&] {
    BENCH_STATUS(mla_sparse_decode_plan(problem, TensorRef{}, workspace.get(), bytes, s.stream, &plan));
  });
  const FlushedTiming decode = time_flushed(s, [&] { BENCH_STATUS(mla_sparse_decode_fp8(args, plan, s.stream)); });
  const std::vector<float> host_lse = d.lse.download<float>();
  const auto bad = std::count_if(host_lse.begin(), host_lse.end(), [](float x) { return !std::isfinite(x); });
  if (bad > 0) fail(c.name + ": " + std::to_string(bad) + " lse values are not finite");

  SparseResult r;
  r.time_us = decode.median_us;
  r.plan_us = plan_timing.median_us;
  r.kernel = kernel_name(plan.kernel);
  r.sm_mhz = decode.sm_mhz;
  // docs/benchmarking.md, counting: FLOPs over the attended keys (topk); bytes of q, the chosen FP8 tokens, out.
  r.flops = static_cast<double>(c.b) * c.s_q * c.h_q * (2.0 * 576 + 2.0 * 512) * c.topk;
  r.bytes = static_cast<double>(c.b) * c.s_q * (c.h_q * 576 * 2.0 + c.topk * 656.0 + c.h_q * 512 * 2.0);
  r.tflops = r.flops / (r.time_us * 1e-6) / 1e12;
  r.gbps = r.bytes / (r.time_us * 1e-6) / 1e9;
  return r;
}

}  // namespace mlakit::bench
