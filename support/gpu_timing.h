// Timing per PERF.md: CUDA events around the operation, L2 flushed before every run by
// writing a 256 MB buffer outside the timed region, warm-up first, median of the runs.
#pragma once

#include <functional>

#include "support/device_array.h"

namespace mlakit::support {

class GpuTimer {
 public:
  static constexpr std::size_t kFlushBytes = std::size_t{256} << 20;
  GpuTimer();
  ~GpuTimer();
  GpuTimer(const GpuTimer&) = delete;
  GpuTimer& operator=(const GpuTimer&) = delete;

  // Median over `runs` timed calls of `op` (enqueued on the default stream), in microseconds.
  double median_us(const std::function<void()>& op, int runs, int warmup = 3);

 private:
  DeviceArray flush_;
  void* start_ = nullptr;  // cudaEvent_t
  void* stop_ = nullptr;
};

}  // namespace mlakit::support
