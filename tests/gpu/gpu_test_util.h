// Helpers of the GPU test suite: skipping without a GPU, device buffers, and running one
// decode case end to end (poisoned outputs, plan, decode) on the device.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "mlakit/mla_decode.h"
#include "support/decode_case.h"
#include "support/device_array.h"

namespace mlakit::testing {

// True when a CUDA device is usable; otherwise `why` says what is missing.
bool gpu_available(std::string* why);

#define MLAKIT_SKIP_WITHOUT_GPU()                                        \
  do {                                                                   \
    std::string mlakit_why_;                                             \
    if (!::mlakit::testing::gpu_available(&mlakit_why_)) {               \
      GTEST_SKIP() << "GPU test skipped: " << mlakit_why_;               \
    }                                                                    \
  } while (0)

#define MLAKIT_ASSERT_CUDA(expr)                                                      \
  do {                                                                                \
    cudaError_t mlakit_err_ = (expr);                                                 \
    ASSERT_EQ(mlakit_err_, cudaSuccess) << #expr << ": " << cudaGetErrorString(mlakit_err_); \
  } while (0)

using DeviceBuffer = support::DeviceArray;

// The device copy of a HostDecodeCase plus poisoned outputs.
struct DeviceDecodeCase {
  DeviceBuffer q, kv, block_table, seqlens, out, lse;
  MlaDecodeArgs args;
  explicit DeviceDecodeCase(const support::HostDecodeCase& c);
  void poison_outputs();
};

// A workspace sized for `problem` on the current device (fails the test if the query fails).
DeviceBuffer make_workspace(const MlaDecodeProblem& problem, const MlaDecodeOptions& options = {});

// Uploads, plans and decodes `c`, returning the outputs; `plan_out` receives the plan.
struct GpuDecodeResult {
  Status status;
  std::vector<uint16_t> out;
  std::vector<float> lse;
};
GpuDecodeResult run_gpu_decode(const support::HostDecodeCase& c, DeviceBuffer* workspace = nullptr,
                               MlaDecodePlan* plan_out = nullptr, const MlaDecodeOptions& options = {});

// True when the current device is a Hopper (compute capability 9.0) GPU.
bool is_hopper();

}  // namespace mlakit::testing
