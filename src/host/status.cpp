#include "mlakit/status.h"

namespace mlakit {

const char* status_code_name(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "Ok";
    case StatusCode::kInvalidArgument: return "InvalidArgument";
    case StatusCode::kUnsupported: return "Unsupported";
    case StatusCode::kUnsupportedArchitecture: return "UnsupportedArchitecture";
    case StatusCode::kWorkspaceTooSmall: return "WorkspaceTooSmall";
    case StatusCode::kCudaError: return "CudaError";
    case StatusCode::kNoDevice: return "NoDevice";
    case StatusCode::kResourceExhausted: return "ResourceExhausted";
  }
  return "Unknown";
}

std::string Status::to_string() const {
  if (is_ok()) return "Ok";
  return std::string(status_code_name(code_)) + ": " + message_;
}

}  // namespace mlakit
