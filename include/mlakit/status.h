// Status: the error value every mlakit entry point returns.
//
// The library never aborts, exits or prints on its own: a failed check becomes a Status
// whose message names the argument, the expected and the actual value, e.g.
//   "mla_decode: q.shape[3] (d_qk): expected 576, got 512".
#pragma once

#include <string>
#include <utility>

namespace mlakit {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,          // dtype, rank, shape, stride, alignment, value range
  kUnsupported,              // a valid request this build or kernel does not implement
  kUnsupportedArchitecture,  // the GPU cannot run any kernel for the request
  kWorkspaceTooSmall,        // caller's workspace below the size the query returned
  kCudaError,                // a CUDA runtime call or kernel launch failed
  kNoDevice,                 // no CUDA device, or a build without CUDA
  kResourceExhausted,        // host memory a CPU reference needed could not be allocated
};

const char* status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok() { return Status(); }

  bool is_ok() const { return code_ == StatusCode::kOk; }
  explicit operator bool() const { return is_ok(); }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "InvalidArgument: <message>", or "Ok".
  std::string to_string() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

}  // namespace mlakit

// Returns early from the enclosing function when `expr` yields a failed Status.
#define MLAKIT_RETURN_IF_ERROR(expr)               \
  do {                                             \
    ::mlakit::Status mlakit_status_ = (expr);      \
    if (!mlakit_status_.is_ok()) return mlakit_status_; \
  } while (0)
