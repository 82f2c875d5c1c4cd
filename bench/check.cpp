#include "bench/check.h"

#include <cstdio>
#include <cstdlib>

namespace mlakit::bench {

void fail(const std::string& message) {
  std::fflush(stdout);  // keep the table rows printed so far ahead of the error
  std::fprintf(stderr, "mlakit-bench: error: %s\n", message.c_str());
  std::exit(1);
}

void check_cuda(cudaError_t err, const char* call, const char* file, int line) {
  if (err == cudaSuccess) return;
  fail(std::string(call) + " failed at " + file + ":" + std::to_string(line) + ": " +
       cudaGetErrorName(err) + ": " + cudaGetErrorString(err));
}

void check_status(const Status& status, const char* call, const char* file, int line) {
  if (status.is_ok()) return;
  fail(std::string(call) + " failed at " + file + ":" + std::to_string(line) + ": " +
       status.to_string());
}

}  // namespace mlakit::bench
