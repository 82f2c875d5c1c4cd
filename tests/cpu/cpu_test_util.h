// Helpers shared by several CPU test files.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "mlakit/status.h"

namespace mlakit::testing {

// Passes when `status` has `code` and its message contains every string of `parts`
// (typically the argument's name, the expected and the actual value).
inline ::testing::AssertionResult StatusIs(const Status& status, StatusCode code,
                                           const std::vector<std::string>& parts) {
  if (status.code() != code) {
    return ::testing::AssertionFailure()
           << "expected code " << status_code_name(code) << ", got " << status.to_string();
  }
  for (const std::string& part : parts) {
    if (status.message().find(part) == std::string::npos) {
      return ::testing::AssertionFailure()
             << "message \"" << status.message() << "\" lacks \"" << part << "\"";
    }
  }
  return ::testing::AssertionSuccess();
}

inline ::testing::AssertionResult IsInvalid(const Status& status,
                                            const std::vector<std::string>& parts) {
  return StatusIs(status, StatusCode::kInvalidArgument, parts);
}

}  // namespace mlakit::testing
