// Shared pieces of the micro-benchmarks that measure hardware rates (mlakit-gather-rates,
// mlakit-cluster-fill-rates, mlakit-dequant-rates).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

namespace mlakit::bench_rates {

// Throws on a CUDA error, naming the call.
inline void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(err));
}

// A 32-bit integer hash (for random rows without a table in memory).
__device__ __forceinline__ uint32_t mix(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  return x ^ (x >> 16);
}

}  // namespace mlakit::bench_rates
