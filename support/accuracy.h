// The accuracy rules of docs/contract.md, as checks that return a verdict and a message naming
// the first offending element.
#pragma once

// The cosine difference is checked where the reference has a direction: some element beyond
// the absolute tolerance. A reference that is rounding noise around zero throughout (a
// cancellation) is held to the elementwise rule alone.

#include <cstdint>
#include <string>
#include <vector>

#include "mlakit/tensor.h"

namespace mlakit::support {

struct AccuracyReport {
  bool ok = true;
  int64_t failures = 0;
  double max_abs_error = 0;
  double cosine_diff = 0;  // 1 - 2<a,b> / (|a|^2 + |b|^2) over the finite elements
  std::string message;     // first failure, empty when ok
};

// 16-bit outputs (bf16/fp16 patterns): each element within abs 1e-3 or rel 2/128, cosine
// difference <= 5e-6, +-inf and NaN at exactly the reference's positions.
// `ref` is the unrounded reference (float32 of the float64 computation).
AccuracyReport check_half_outputs(const std::vector<uint16_t>& got, const std::vector<float>& ref,
                                  DType dtype, const std::string& name);

// Gradients of the backward (dq, dk, dv; bf16/fp16 patterns): each element within abs 1e-3 or
// rel 8/128, cosine difference <= 7e-6, +-inf and NaN at exactly the reference's positions.
// `ref` is the unrounded reference (float32 of the float64 computation).
AccuracyReport check_half_gradients(const std::vector<uint16_t>& got, const std::vector<float>& ref,
                                    DType dtype, const std::string& name);

// float statistics (LSE, max-logits): abs 1e-6 or rel 8/65536, same inf/NaN positions.
AccuracyReport check_float_stats(const std::vector<float>& got, const std::vector<float>& ref,
                                 const std::string& name);

}  // namespace mlakit::support
