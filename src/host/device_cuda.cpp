#include <cuda_runtime_api.h>

#include <mutex>
#include <string>
#include <vector>

#include "host/check.h"
#include "host/device.h"

namespace mlakit::detail {

Status current_device_info(DeviceInfo* info) {
  static std::mutex mutex;
  static std::vector<DeviceInfo> cache;
  int device = -1;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error so later calls are not confused
    return Status(StatusCode::kNoDevice,
                  std::string("no usable CUDA device: ") + cudaGetErrorString(err));
  }
  std::lock_guard<std::mutex> lock(mutex);
  if (device < static_cast<int>(cache.size()) && cache[device].ordinal == device) {
    *info = cache[device];
    return Status::ok();
  }
  DeviceInfo d;
  d.ordinal = device;
  if (cudaDeviceGetAttribute(&d.sm_count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&d.cc_major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&d.cc_minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&d.max_smem_per_block_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin,
                             device) != cudaSuccess) {
    err = cudaGetLastError();
    return Status(StatusCode::kCudaError,
                  std::string("querying device properties failed: ") + cudaGetErrorString(err));
  }
  if (static_cast<int>(cache.size()) <= device) cache.resize(device + 1);
  cache[device] = d;
  *info = d;
  return Status::ok();
}

Status check_device_pointer(const char* op, const char* name, const void* ptr, int device) {
  cudaPointerAttributes attr{};
  cudaError_t err = cudaPointerGetAttributes(&attr, ptr);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return Status::ok();  // unknown to the runtime: cannot prove it wrong
  }
  switch (attr.type) {
    case cudaMemoryTypeHost:
      return invalid(op, std::string(name) +
                             ": expected device memory, got a pinned host pointer");
    case cudaMemoryTypeUnregistered:
      return invalid(op, std::string(name) + ": expected device memory, got a host pointer");
    case cudaMemoryTypeDevice:
      if (attr.device != device) {
        return invalid(op, std::string(name) + ": expected memory of device " +
                               std::to_string(device) + " (the current device), got device " +
                               std::to_string(attr.device));
      }
      return Status::ok();
    case cudaMemoryTypeManaged:
      return Status::ok();
  }
  return Status::ok();
}

}  // namespace mlakit::detail
