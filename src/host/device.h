// What the host layer needs to know about the GPU: SM count and architecture of the current
// device, and where a pointer lives. Implemented over the CUDA runtime (device_cuda.cpp) or,
// in a build without CUDA, as "no device" (device_none.cpp).
#pragma once

#include "mlakit/status.h"

namespace mlakit::detail {

struct DeviceInfo {
  int ordinal = -1;
  int sm_count = 0;
  int cc_major = 0;
  int cc_minor = 0;
  int max_smem_per_block_optin = 0;  // bytes
};

// The current device's properties (cached per ordinal after the first query). Its errors
// (NoDevice, CudaError) name no operation: entry points use the form below.
Status current_device_info(DeviceInfo* info);
// The same, for the entry point `op`: an error's message starts with "<op>: ", like every
// other error the entry point returns.
Status current_device_info(const char* op, DeviceInfo* info);

// The NoDevice error of `op` in a build without CUDA (MLAKIT_ENABLE_CUDA=OFF), where an entry
// point has validated its arguments and has no kernel to launch.
Status built_without_cuda(const char* op);

// The current device, when it can run mlakit's kernels: every kernel needs sm80+ (bf16
// mma.sync), so older GPUs get an UnsupportedArchitecture error naming `op`, never wrong code.
Status current_supported_device(const char* op, DeviceInfo* info);

// Ok when `ptr` is memory the current device can read as device memory (device or managed
// allocations); an InvalidArgument naming `name` when it is host memory or belongs to
// another device. Pointers the runtime does not know (e.g. from another allocator that
// registered nothing) pass: the check rejects only what it can prove wrong.
Status check_device_pointer(const char* op, const char* name, const void* ptr, int device);

}  // namespace mlakit::detail
