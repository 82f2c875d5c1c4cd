// Which kernel family runs an MLA operation (dense and sparse decode, sparse prefill), chosen
// from the device architecture or requested.
#pragma once

#include <cstdint>

namespace mlakit {

enum class MlaKernel : int32_t {
  kAuto = -1,     // request only: the fastest kernel for the device
  kPortable = 0,  // any CUDA GPU of sm80 or newer
  kSm90 = 1,      // Hopper (sm90a): TMA + wgmma, warp-specialised
};

// The name before the sparse prefill shared the choice (2026-11), kept so that code written
// against it still compiles.
using MlaDecodeKernel = MlaKernel;

}  // namespace mlakit
