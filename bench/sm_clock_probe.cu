#include "bench/sm_clock_probe.h"

#include <vector>

#include "bench/check.h"
#include "support/gpu_timing.h"

namespace mlakit::bench {
namespace {

// Long enough that the timer's granularity (~1 us steps on Hopper) is under 2% of it.
constexpr uint64_t kSpinNs = 50000;

__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void clock_probe_kernel(uint64_t* out) {
  const uint64_t t0 = global_ns();
  const uint64_t c0 = clock64();
  uint64_t t1 = t0;
  while (t1 - t0 < kSpinNs) t1 = global_ns();
  out[0] = clock64() - c0;
  out[1] = t1 - t0;
}

}  // namespace

SmClockProbe::SmClockProbe(int capacity) : samples_(static_cast<std::size_t>(capacity) * 2 * sizeof(uint64_t)), capacity_(capacity) {}

void SmClockProbe::record(cudaStream_t stream) {
  if (count_ >= capacity_) return;
  clock_probe_kernel<<<1, 1, 0, stream>>>(static_cast<uint64_t*>(samples_.get()) + 2 * count_);
  BENCH_CUDA(cudaGetLastError());
  ++count_;
}

double SmClockProbe::take_median_mhz(cudaStream_t stream) {
  if (count_ == 0) return 0.0;
  BENCH_CUDA(cudaStreamSynchronize(stream));
  std::vector<uint64_t> host(2 * static_cast<std::size_t>(count_));
  samples_.download_to(host.data(), host.size() * sizeof(uint64_t));
  std::vector<double> mhz(count_);
  for (int i = 0; i < count_; ++i) mhz[i] = 1e3 * static_cast<double>(host[2 * i]) / static_cast<double>(host[2 * i + 1]);
  count_ = 0;
  return support::median(mhz);
}

}  // namespace mlakit::bench
