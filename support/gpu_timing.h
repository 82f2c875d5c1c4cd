// Event timing on a CUDA stream (benchmark and main job), as docs/benchmarking.md asks: warm-up first, a preparation step
// (the L2 flush) before every round outside the timed region, the median of the rounds.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <functional>
#include <vector>

#include "support/device_array.h"

namespace mlakit::support {

// Evicts the caches by writing a buffer several times the size of the L2 (50 MB on H100,
// 60 MB on H200) before a timed round.
class L2Flusher {
 public:
  static constexpr std::size_t kBytes = std::size_t{256} << 20;  // docs/benchmarking.md: >= 256 MB

  L2Flusher() : buffer_(kBytes) {}
  void flush(cudaStream_t stream);

 private:
  DeviceArray buffer_;
  int round_ = 0;
};

// Enqueues `warmup` untimed rounds, then `runs` timed rounds of `op` on `stream`, each
// preceded by `prepare`; returns each timed round's duration in microseconds.
// All rounds are enqueued before the host waits once, so no host synchronisation sits
// between a round's events; the GPU stays busy with the flush while the host enqueues.
std::vector<double> time_rounds(cudaStream_t stream, int warmup, int runs,
                                const std::function<void()>& prepare,
                                const std::function<void()>& op);

// Median of a non-empty sample (mean of the two middle values for an even count).
double median(std::vector<double> samples);

}  // namespace mlakit::support
