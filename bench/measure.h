// The two measurements of a benchmark run: the device-to-device copy ceiling and one dense
// MLA decode case.
#pragma once

#include <cuda_runtime_api.h>

#include <functional>
#include <string>
#include <vector>

#include "bench/cases.h"
#include "bench/device_data.h"
#include "bench/sm_clock_probe.h"
#include "support/decode_case.h"
#include "support/gpu_timing.h"
#include "mlakit/mla_decode.h"
#include "mlakit/tensor.h"

namespace mlakit::bench {

struct RunSettings {
  cudaStream_t stream = nullptr;
  support::L2Flusher* flusher = nullptr;
  int warmup = 5;  // untimed rounds before the timed ones
  int runs = 20;   // timed rounds; results are their median
  DType dtype = DType::kBF16;
  MlaKernel kernel = MlaKernel::kAuto;  // --kernel
  SmClockProbe* clock = nullptr;      // probed after each round's flush
};

// The timing of `op` (docs/benchmarking.md, protocol): warm-up rounds, then timed rounds, each preceded (outside its
// events) by the L2 flush and a clock probe.
struct FlushedTiming {
  double median_us = 0;  // of the timed rounds
  double sm_mhz = 0;     // median of the probes
};
FlushedTiming time_flushed(const RunSettings& settings, const std::function<void()>& op);

struct CopyResult {
  double bytes = 0;    // read + written per copy
  double time_us = 0;  // median
  double gbps = 0;     // bytes / time, decimal GB/s
};

// cudaMemcpyAsync of kCopyBytes between two device buffers, L2 flushed before each round.
inline constexpr std::size_t kCopyBytes = std::size_t{1} << 30;
CopyResult measure_copy_bandwidth(const RunSettings& settings);

// "portable" / "sm90": the kernel family a request resolves to on the current device (kAuto
// through the library's own selection rule), for the results' "kernel" field.
std::string kernel_name(MlaKernel requested);

struct DecodeResult {
  double mean_s_k = 0;  // mean of the actual lengths
  double time_us = 0;   // median of mla_decode (attention + combine)
  double plan_us = 0;   // median of mla_decode_plan, timed on its own
  double combine_us = 0;  // median of the combine kernel alone (included in time_us)
  // The same without the L2 flush: the partials stay in L2 as they are when the combine runs
  // right after the attention inside a step, so this is its in-step cost.
  double combine_hot_us = 0;
  double flops = 0;     // docs/benchmarking.md counting (support::decode_flops)
  double bytes = 0;     // docs/benchmarking.md counting (support::decode_bytes)
  double tflops = 0;
  double gbps = 0;
  double sm_mhz = 0;   // median SM clock probed between the decode's rounds
  std::string kernel;  // the kernel family the plan chose
};

// The case's shape, lengths and shuffled block table, without q and cache data (those are
// generated on the device). support::decode_flops/decode_bytes and HostDecodeCase::args
// read only these fields.
support::HostDecodeCase describe_case(const BenchCase& bench_case, DType dtype);

// A case's tensors on the device: random q and cache, the block table and lengths of
// describe_case, and arguments over them (out and lse unwritten).
struct DeviceDecodeCase {
  support::HostDecodeCase host;
  DeviceBuffer q, kv, table, seqlens, out, lse;
  MlaDecodeArgs args;
};
DeviceDecodeCase make_device_case(const BenchCase& bench_case, DType dtype, cudaStream_t stream);

// Builds the case on the device (random q and cache, shuffled block table), times the plan
// and the decode, checks that every lse is finite, and frees it all again. Exits with an
// error message on any failure.
DecodeResult run_decode_case(const BenchCase& bench_case, const RunSettings& settings);

}  // namespace mlakit::bench
