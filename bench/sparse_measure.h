// The sparse FP8 MLA decode cases of docs/benchmarking.md / issue 4 and their measurement.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "bench/device_data.h"
#include "bench/measure.h"
#include "mlakit/mla_sparse_decode.h"

namespace mlakit::bench {

struct SparseBenchCase {
  std::string name;  // e.g. "sparse_b128_hq128_sq2_topk2048_sk32768_p64"
  int64_t b = 0;
  int s_q = 2;
  int h_q = 128;
  int topk = 2048;
  int32_t s_k = 32768;  // cache tokens per sequence the indices choose from
  int page = 64;
  std::optional<double> flashmla_h100_us;
};

std::vector<SparseBenchCase> sparse_bench_cases(bool quick, const std::string& filter);

struct SparseResult {
  double time_us = 0, plan_us = 0, flops = 0, bytes = 0, tflops = 0, gbps = 0;
  double sm_mhz = 0;   // median SM clock probed between the timed rounds
  std::string kernel;  // the kernel family the plan chose
};

// A case's device data: a random bf16 cache quantized on the device (sequence i owns cache
// tokens [i * s_k, (i + 1) * s_k)), random in-sequence indices, random q; args point at them.
struct DeviceSparseCase {
  DeviceBuffer cache, indices, q, out, lse;
  MlaSparseDecodeArgs args;
  MlaSparseDecodeProblem problem;
};
DeviceSparseCase make_device_sparse_case(const SparseBenchCase& c, MlaKernel kernel, cudaStream_t stream);

// Times the plan and the decode of a case (docs/benchmarking.md protocol) and checks every lse is finite.
SparseResult run_sparse_case(const SparseBenchCase& c, const RunSettings& settings);

}  // namespace mlakit::bench
