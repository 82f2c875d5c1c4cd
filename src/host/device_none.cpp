// Device queries of a build without CUDA (MLAKIT_ENABLE_CUDA=OFF): there is no device.
#include "host/device.h"

namespace mlakit::detail {

Status current_device_info(DeviceInfo*) {
  return Status(StatusCode::kNoDevice, "mlakit was built without CUDA (MLAKIT_ENABLE_CUDA=OFF)");
}

Status check_device_pointer(const char*, const char*, const void*, int) { return Status::ok(); }

}  // namespace mlakit::detail
