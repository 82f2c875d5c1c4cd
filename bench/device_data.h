// Device-side data for the benchmark: owned device buffers, random fills generated on the
// GPU (the largest cache, b=128 s_k=32768, is 4.8 GB: minutes to fill on the host).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "mlakit/tensor.h"
#include "support/device_array.h"

namespace mlakit::bench {

using DeviceBuffer = support::DeviceArray;  // cudaMalloc aligns to 256 bytes, as the workspace needs

// Fills `count` bf16 or fp16 elements with uniform(-1, 1) values that are never zero.
// Counter-based hashing: the values depend on (seed, index) only, not on the launch shape.
void fill_uniform(void* dst, DType dtype, int64_t count, uint64_t seed, cudaStream_t stream);

}  // namespace mlakit::bench
