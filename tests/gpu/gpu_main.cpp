// main() of the GPU suite: runs the tests, and without a GPU exits with kSkipCode so that
// ctest reports the suite as skipped (SKIP_RETURN_CODE) instead of silently passed.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "gpu_test_util.h"

namespace {
constexpr int kSkipCode = 77;
}

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const int rc = RUN_ALL_TESTS();
  std::string why;
  if (!mlakit::testing::gpu_available(&why)) {
    std::printf("GPU test suite skipped: %s\n", why.c_str());
    return rc == 0 ? kSkipCode : rc;
  }
  return rc;
}
