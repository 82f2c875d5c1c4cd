#include "support/gpu_timing.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace mlakit::support {
namespace {

void check_cuda(cudaError_t err, const char* call) {
  if (err != cudaSuccess) throw std::runtime_error(std::string(call) + ": " + cudaGetErrorString(err));
}
#define TIMING_CUDA(call) check_cuda((call), #call)

}  // namespace

void L2Flusher::flush(cudaStream_t stream) {
  // A different byte each round, so no layer of the memory system can skip the writes.
  TIMING_CUDA(cudaMemsetAsync(buffer_.get(), round_++ & 0xff, buffer_.bytes(), stream));
}

std::vector<double> time_rounds(cudaStream_t stream, int warmup, int runs,
                                const std::function<void()>& prepare,
                                const std::function<void()>& op) {
  for (int i = 0; i < warmup; ++i) {
    prepare();
    op();
  }
  std::vector<cudaEvent_t> start(runs), stop(runs);
  for (int i = 0; i < runs; ++i) {
    TIMING_CUDA(cudaEventCreate(&start[i]));
    TIMING_CUDA(cudaEventCreate(&stop[i]));
  }
  for (int i = 0; i < runs; ++i) {
    prepare();
    TIMING_CUDA(cudaEventRecord(start[i], stream));
    op();
    TIMING_CUDA(cudaEventRecord(stop[i], stream));
  }
  TIMING_CUDA(cudaStreamSynchronize(stream));
  TIMING_CUDA(cudaGetLastError());  // a kernel fault surfaces here, not in the launches
  std::vector<double> us(runs);
  for (int i = 0; i < runs; ++i) {
    float ms = 0.f;
    TIMING_CUDA(cudaEventElapsedTime(&ms, start[i], stop[i]));
    us[i] = 1000.0 * ms;
    TIMING_CUDA(cudaEventDestroy(start[i]));
    TIMING_CUDA(cudaEventDestroy(stop[i]));
  }
  return us;
}

double median(std::vector<double> samples) {
  if (samples.empty()) throw std::runtime_error("median of an empty sample");
  const std::size_t mid = samples.size() / 2;
  std::nth_element(samples.begin(), samples.begin() + mid, samples.end());
  const double upper = samples[mid];
  if (samples.size() % 2 == 1) return upper;
  const double lower = *std::max_element(samples.begin(), samples.begin() + mid);
  return 0.5 * (lower + upper);
}

}  // namespace mlakit::support
