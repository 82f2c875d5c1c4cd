// The SM clock the GPU actually ran at during a case's timed rounds.
//
// Why: the power manager lowers the SM clock for a while after sustained tensor-core work
// (nvidia-smi reports "SW power cap"), so a case measured right after a heavy one can run
// 10-15% slower than the same case measured alone, at the same nominal clock. Each probe is a
// one-thread kernel enqueued between rounds (outside the timed events) that counts SM cycles
// against the global nanosecond timer; a case reports the median of its probes next to its
// time.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "bench/device_data.h"

namespace mlakit::bench {

class SmClockProbe {
 public:
  explicit SmClockProbe(int capacity = 1024);

  // Enqueues one probe on `stream` (~50 us of one thread); ignored once `capacity` are pending.
  void record(cudaStream_t stream);
  // Median clock in MHz of the probes recorded since the last call (0 when none); waits for
  // `stream` and forgets them.
  double take_median_mhz(cudaStream_t stream);

 private:
  DeviceBuffer samples_;  // per probe: SM cycles, nanoseconds
  int capacity_;
  int count_ = 0;
};

}  // namespace mlakit::bench
