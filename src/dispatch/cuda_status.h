// A CUDA runtime error as a Status naming the operation (dispatch layer only: needs CUDA).
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "mlakit/status.h"

namespace mlakit::detail {

inline Status cuda_status(const char* op, cudaError_t err) {
  if (err == cudaSuccess) return Status::ok();
  return Status(StatusCode::kCudaError,
                std::string(op) + ": " + cudaGetErrorName(err) + ": " + cudaGetErrorString(err));
}

}  // namespace mlakit::detail
