// Failure handling of the benchmark: it stops at the first error, because a time measured
// after a failed CUDA call or a rejected mlakit request means nothing.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "mlakit/status.h"

namespace mlakit::bench {

// Prints "mlakit-bench: error: <message>" to stderr and exits with status 1.
[[noreturn]] void fail(const std::string& message);

void check_cuda(cudaError_t err, const char* call, const char* file, int line);
void check_status(const Status& status, const char* call, const char* file, int line);

}  // namespace mlakit::bench

#define BENCH_CUDA(call) ::mlakit::bench::check_cuda((call), #call, __FILE__, __LINE__)
#define BENCH_STATUS(call) ::mlakit::bench::check_status((call), #call, __FILE__, __LINE__)
