#include "support/gpu_timing.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

namespace mlakit::support {
namespace {

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(err));
}

}  // namespace

GpuTimer::GpuTimer() : flush_(kFlushBytes) {
  check(cudaEventCreate(reinterpret_cast<cudaEvent_t*>(&start_)), "cudaEventCreate");
  check(cudaEventCreate(reinterpret_cast<cudaEvent_t*>(&stop_)), "cudaEventCreate");
}

GpuTimer::~GpuTimer() {
  cudaEventDestroy(static_cast<cudaEvent_t>(start_));
  cudaEventDestroy(static_cast<cudaEvent_t>(stop_));
}

double GpuTimer::median_us(const std::function<void()>& op, int runs, int warmup) {
  for (int i = 0; i < warmup; ++i) op();
  check(cudaDeviceSynchronize(), "warm-up");
  std::vector<double> times;
  for (int i = 0; i < runs; ++i) {
    check(cudaMemsetAsync(flush_.get(), i & 0xff, flush_.bytes()), "L2 flush");
    check(cudaEventRecord(static_cast<cudaEvent_t>(start_)), "cudaEventRecord");
    op();
    check(cudaEventRecord(static_cast<cudaEvent_t>(stop_)), "cudaEventRecord");
    check(cudaEventSynchronize(static_cast<cudaEvent_t>(stop_)), "timed run");
    float ms = 0.f;
    check(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start_), static_cast<cudaEvent_t>(stop_)),
          "cudaEventElapsedTime");
    times.push_back(ms * 1000.0);
  }
  std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
  return times[times.size() / 2];
}

}  // namespace mlakit::support
