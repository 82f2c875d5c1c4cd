// Device-side data for the benchmark: owned device buffers, random fills generated on the
// GPU (the largest cache, b=128 s_k=32768, is 4.8 GB: minutes to fill on the host), and the
// L2 flush that runs before every timed round.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "mlakit/tensor.h"

namespace mlakit::bench {

// cudaMalloc'd memory freed on destruction (cudaMalloc aligns to 256 bytes, which the
// decode workspace requires).
class DeviceBuffer {
 public:
  explicit DeviceBuffer(std::size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return ptr_; }
  std::size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
};

// Fills `count` bf16 or fp16 elements with uniform(-1, 1) values that are never zero.
// Counter-based hashing: the values depend on (seed, index) only, not on the launch shape.
void fill_uniform(void* dst, DType dtype, int64_t count, uint64_t seed, cudaStream_t stream);

// Evicts the caches by writing a buffer several times the size of the L2 (50 MB on H100).
class L2Flusher {
 public:
  static constexpr std::size_t kBytes = std::size_t{256} << 20;  // PERF.md: >= 256 MB

  L2Flusher() : buffer_(kBytes) {}
  void flush(cudaStream_t stream);

 private:
  DeviceBuffer buffer_;
  int round_ = 0;
};

}  // namespace mlakit::bench
