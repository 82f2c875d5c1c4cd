#include "bench/measure.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "bench/check.h"
#include "support/gpu_timing.h"
#include "dispatch/mla_decode_dispatch.h"
#include "host/decode_layout.h"
#include "host/device.h"
#include "mlakit/mla_decode.h"
#include "support/decode_case.h"

namespace mlakit::bench {
namespace {

// Fixed seeds: every run of the benchmark measures the same lengths, tables and data.
constexpr uint64_t kLengthSeed = 20261122;
constexpr uint64_t kTableSeed = 7;
constexpr uint64_t kQuerySeed = 11;
constexpr uint64_t kCacheSeed = 13;

template <typename T>
void copy_to_device(const DeviceBuffer& dst, const std::vector<T>& src, cudaStream_t stream) {
  BENCH_CUDA(cudaMemcpyAsync(dst.get(), src.data(), src.size() * sizeof(T), cudaMemcpyHostToDevice,
                             stream));
}

}  // namespace

support::HostDecodeCase describe_case(const BenchCase& bc, DType dtype) {
  support::HostDecodeCase c;
  c.spec.seqlens = bc.varlen ? support::varlen_lengths(bc.b, bc.s_k, bc.s_q, kLengthSeed)
                             : support::fixed_lengths(bc.b, bc.s_k);
  c.spec.s_q = bc.s_q;
  c.spec.h_q = bc.h_q;
  c.spec.h_kv = bc.h_kv;
  c.spec.page_size = bc.page;
  c.spec.causal = bc.causal;
  c.spec.dtype = dtype;
  c.spec.spare_blocks = 0;
  c.b = bc.b;
  c.seqlens = c.spec.seqlens;

  std::vector<int64_t> blocks_of(c.b);
  for (int64_t i = 0; i < c.b; ++i) {
    blocks_of[i] = (c.seqlens[i] + bc.page - 1) / bc.page;
    c.num_blocks += blocks_of[i];
    c.max_blocks_per_seq = std::max(c.max_blocks_per_seq, blocks_of[i]);
  }
  // Physical blocks in shuffled order, as a serving system's allocator leaves them after a
  // while; a sequential table would flatter the cache reads. Entries past a sequence's last
  // block are 0, the padding a serving stack typically leaves there.
  std::vector<int32_t> physical(c.num_blocks);
  std::iota(physical.begin(), physical.end(), 0);
  std::shuffle(physical.begin(), physical.end(), std::mt19937_64(kTableSeed));
  c.block_table.assign(c.b * c.max_blocks_per_seq, 0);
  int64_t next = 0;
  for (int64_t i = 0; i < c.b; ++i) {
    for (int64_t j = 0; j < blocks_of[i]; ++j)
      c.block_table[i * c.max_blocks_per_seq + j] = physical[next++];
  }
  return c;
}

std::string kernel_name(MlaKernel requested) {
  detail::DeviceInfo device;
  detail::DecodeKernelTraits traits{};
  if (!detail::current_device_info(&device).is_ok() ||
      !detail::select_decode_kernel("bench", device, requested, &traits).is_ok()) {
    return "unknown";
  }
  return traits.kernel == MlaKernel::kSm90 ? "sm90" : "portable";
}

CopyResult measure_copy_bandwidth(const RunSettings& s) {
  DeviceBuffer src(kCopyBytes), dst(kCopyBytes);
  // Copying uninitialised memory would be as fast; filling it keeps the data non-zero
  // like everywhere else in the benchmark.
  fill_uniform(src.get(), DType::kBF16, kCopyBytes / 2, 1, s.stream);
  const auto us = support::time_rounds(
      s.stream, s.warmup, s.runs, [&] { s.flusher->flush(s.stream); },
      [&] {
        BENCH_CUDA(
            cudaMemcpyAsync(dst.get(), src.get(), kCopyBytes, cudaMemcpyDeviceToDevice, s.stream));
      });
  CopyResult r;
  r.bytes = 2.0 * kCopyBytes;
  r.time_us = support::median(us);
  r.gbps = r.bytes / (r.time_us * 1e-6) / 1e9;
  return r;
}

FlushedTiming time_flushed(const RunSettings& s, const std::function<void()>& op) {
  s.clock->take_median_mhz(s.stream);  // forget earlier probes
  const std::vector<double> us = support::time_rounds(
      s.stream, s.warmup, s.runs,
      [&] {
        s.flusher->flush(s.stream);
        s.clock->record(s.stream);
      },
      op);
  return FlushedTiming{.median_us = support::median(us), .sm_mhz = s.clock->take_median_mhz(s.stream)};
}

DeviceDecodeCase make_device_case(const BenchCase& bc, DType dtype, cudaStream_t stream) {
  DeviceDecodeCase d;
  d.host = describe_case(bc, dtype);
  const support::HostDecodeCase& c = d.host;
  const std::size_t elem = dtype_size(dtype);
  const int64_t q_elems = c.b * bc.s_q * bc.h_q * c.problem().d_qk;
  const int64_t kv_elems = c.num_blocks * bc.page * bc.h_kv * c.problem().d_qk;
  d.q = DeviceBuffer(q_elems * elem);
  d.kv = DeviceBuffer(kv_elems * elem);
  d.table = DeviceBuffer(c.block_table.size() * sizeof(int32_t));
  d.seqlens = DeviceBuffer(c.seqlens.size() * sizeof(int32_t));
  d.out = DeviceBuffer(c.out_elems() * elem);
  d.lse = DeviceBuffer(c.lse_elems() * sizeof(float));
  fill_uniform(d.q.get(), dtype, q_elems, kQuerySeed, stream);
  fill_uniform(d.kv.get(), dtype, kv_elems, kCacheSeed, stream);
  copy_to_device(d.table, c.block_table, stream);
  copy_to_device(d.seqlens, c.seqlens, stream);
  d.args = c.args(d.q.get(), d.kv.get(), d.table.get(), d.seqlens.get(), d.out.get(), d.lse.get());
  return d;
}

DecodeResult run_decode_case(const BenchCase& bc, const RunSettings& s) {
  const DeviceDecodeCase d = make_device_case(bc, s.dtype, s.stream);
  const support::HostDecodeCase& c = d.host;
  const MlaDecodeProblem problem = c.problem();
  const MlaDecodeArgs& args = d.args;

  std::size_t workspace_bytes = 0;
  const MlaDecodeOptions options{.kernel = s.kernel};
  BENCH_STATUS(mla_decode_workspace_size(problem, &workspace_bytes, options));
  DeviceBuffer workspace(workspace_bytes);

  // The plan is made once per step and shared by every layer, so it is timed on its own
  // and excluded from the decode time (docs/benchmarking.md, protocol).
  MlaDecodePlan plan;
  const FlushedTiming plan_timing = time_flushed(s, [&] {
    BENCH_STATUS(mla_decode_plan(problem, args.cache_seqlens, workspace.get(), workspace_bytes,
                                 s.stream, &plan, options));
  });
  const FlushedTiming decode = time_flushed(s, [&] { BENCH_STATUS(mla_decode(args, plan, s.stream)); });
  // The combine kernel alone (part of decode_us), for the plan + combine share of a step.
  const FlushedTiming combine = time_flushed(s, [&] {
    BENCH_STATUS(detail::dispatch_mla_decode_combine(args, plan, s.stream));
  });
  const auto combine_hot_us = support::time_rounds(s.stream, s.warmup, s.runs, [] {}, [&] {
    BENCH_STATUS(detail::dispatch_mla_decode_combine(args, plan, s.stream));
  });
  // The combine rewrote the outputs from the last decode's partials: still a valid result.

  // Cheap sanity check (accuracy is tested elsewhere): every length is >= s_q >= 1, so every
  // row attends at least one key and its lse is finite.
  std::vector<float> host_lse(c.lse_elems());
  BENCH_CUDA(cudaMemcpy(host_lse.data(), d.lse.get(), host_lse.size() * sizeof(float),
                        cudaMemcpyDeviceToHost));
  const auto bad =
      std::find_if(host_lse.begin(), host_lse.end(), [](float x) { return !std::isfinite(x); });
  if (bad != host_lse.end()) {
    const auto count =
        std::count_if(host_lse.begin(), host_lse.end(), [](float x) { return !std::isfinite(x); });
    fail(bc.name + ": " + std::to_string(count) + " of " + std::to_string(host_lse.size()) +
         " lse values are not finite (first at flat index " +
         std::to_string(bad - host_lse.begin()) + ", value " + std::to_string(*bad) + ")");
  }

  DecodeResult r;
  r.mean_s_k = std::accumulate(c.seqlens.begin(), c.seqlens.end(), 0.0) / static_cast<double>(c.b);
  r.time_us = decode.median_us;
  r.sm_mhz = decode.sm_mhz;
  r.plan_us = plan_timing.median_us;
  r.combine_us = combine.median_us;
  r.combine_hot_us = support::median(combine_hot_us);
  r.flops = support::decode_flops(c);
  r.bytes = support::decode_bytes(c);
  r.tflops = r.flops / (r.time_us * 1e-6) / 1e12;
  r.gbps = r.bytes / (r.time_us * 1e-6) / 1e9;
  r.kernel = kernel_name(plan.kernel);
  return r;
}

}  // namespace mlakit::bench
