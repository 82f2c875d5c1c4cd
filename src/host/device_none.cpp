// Device queries of a build without CUDA (MLAKIT_ENABLE_CUDA=OFF): there is no device.
#include <string>

#include "host/device.h"

namespace mlakit::detail {
namespace {

constexpr const char* kNoCuda = "mlakit was built without CUDA (MLAKIT_ENABLE_CUDA=OFF)";

}  // namespace

Status current_device_info(DeviceInfo*) { return Status(StatusCode::kNoDevice, kNoCuda); }

Status built_without_cuda(const char* op) { return Status(StatusCode::kNoDevice, std::string(op) + ": " + kNoCuda); }

Status check_device_pointer(const char*, const char*, const void*, int) { return Status::ok(); }

}  // namespace mlakit::detail
