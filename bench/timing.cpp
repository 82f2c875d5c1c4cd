#include "bench/timing.h"

#include <algorithm>

#include "bench/check.h"

namespace mlakit::bench {

std::vector<double> time_rounds(cudaStream_t stream, int warmup, int runs,
                                const std::function<void()>& prepare,
                                const std::function<void()>& op) {
  for (int i = 0; i < warmup; ++i) {
    prepare();
    op();
  }
  std::vector<cudaEvent_t> start(runs), stop(runs);
  for (int i = 0; i < runs; ++i) {
    BENCH_CUDA(cudaEventCreate(&start[i]));
    BENCH_CUDA(cudaEventCreate(&stop[i]));
  }
  for (int i = 0; i < runs; ++i) {
    prepare();
    BENCH_CUDA(cudaEventRecord(start[i], stream));
    op();
    BENCH_CUDA(cudaEventRecord(stop[i], stream));
  }
  BENCH_CUDA(cudaStreamSynchronize(stream));
  BENCH_CUDA(cudaGetLastError());  // a kernel fault surfaces here, not in the launches
  std::vector<double> us(runs);
  for (int i = 0; i < runs; ++i) {
    float ms = 0.f;
    BENCH_CUDA(cudaEventElapsedTime(&ms, start[i], stop[i]));
    us[i] = 1000.0 * ms;
    BENCH_CUDA(cudaEventDestroy(start[i]));
    BENCH_CUDA(cudaEventDestroy(stop[i]));
  }
  return us;
}

double median(std::vector<double> samples) {
  if (samples.empty()) fail("median of an empty sample");
  const std::size_t mid = samples.size() / 2;
  std::nth_element(samples.begin(), samples.begin() + mid, samples.end());
  const double upper = samples[mid];
  if (samples.size() % 2 == 1) return upper;
  const double lower = *std::max_element(samples.begin(), samples.begin() + mid);
  return 0.5 * (lower + upper);
}

}  // namespace mlakit::bench
