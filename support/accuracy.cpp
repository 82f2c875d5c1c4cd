#include "support/accuracy.h"

#include <cmath>
#include <sstream>

#include "reference/host_numeric.h"

namespace mlakit::support {
namespace {

constexpr double kHalfAbsTol = 1e-3;
constexpr double kHalfRelTol = 2.0 / 128;
constexpr double kCosineTol = 5e-6;
constexpr double kGradAbsTol = 1e-3;
constexpr double kGradRelTol = 8.0 / 128;
constexpr double kGradCosineTol = 7e-6;
constexpr double kStatAbsTol = 1e-6;
constexpr double kStatRelTol = 8.0 / 65536;

// Compares element i; returns false (and describes it once) when it breaks the rule.
template <typename Get>
AccuracyReport compare(int64_t n, Get get, double abs_tol, double rel_tol, double cosine_tol,
                       const std::string& name) {
  AccuracyReport r;
  double dot = 0, norm = 0, ref_max = 0;
  for (int64_t i = 0; i < n; ++i) {
    auto [a, b] = get(i);
    bool bad = false;
    if (std::isnan(a) || std::isnan(b) || std::isinf(a) || std::isinf(b)) {
      bad = !((std::isnan(a) && std::isnan(b)) || (std::isinf(a) && std::isinf(b) && (a > 0) == (b > 0)));
    } else {
      double err = std::fabs(a - b);
      r.max_abs_error = std::max(r.max_abs_error, err);
      bad = err > abs_tol && err > rel_tol * std::fabs(b);
      ref_max = std::max(ref_max, std::fabs(b));
      dot += a * b;
      norm += a * a + b * b;
    }
    if (bad) {
      if (r.failures == 0) {
        std::ostringstream s;
        s.precision(9);
        s << name << "[" << i << "]: got " << a << ", expected " << b;
        r.message = s.str();
      }
      ++r.failures;
    }
  }
  r.cosine_diff = norm > 0 ? 1.0 - 2.0 * dot / norm : 0.0;
  // A reference that lies entirely within the absolute tolerance of zero has no direction to
  // compare: its values are the rounding noise of a cancellation (e.g. dq of queries that see
  // one key: dS = P (dP - D) with dP = D up to the rounding of out). The elementwise rule
  // governs such a tensor alone.
  const bool has_direction = ref_max > abs_tol;
  if (cosine_tol >= 0 && has_direction && r.cosine_diff > cosine_tol && r.failures == 0) {
    std::ostringstream s;
    s << name << ": cosine difference " << r.cosine_diff << " > " << cosine_tol;
    r.message = s.str();
    r.failures = 1;
  }
  r.ok = r.failures == 0;
  if (!r.ok && r.failures > 1) r.message += " (" + std::to_string(r.failures) + " elements fail)";
  return r;
}

// 16-bit results against an unrounded float reference under one rule.
AccuracyReport compare_half(const std::vector<uint16_t>& got, const std::vector<float>& ref, DType dtype,
                            double abs_tol, double rel_tol, double cosine_tol, const std::string& name) {
  if (got.size() != ref.size()) {
    return AccuracyReport{false, 1, 0, 0, name + ": size mismatch"};
  }
  auto to_f = [dtype](uint16_t h) {
    return static_cast<double>(dtype == DType::kBF16 ? host::bf16_to_float(h) : host::fp16_to_float(h));
  };
  return compare(static_cast<int64_t>(got.size()),
                 [&](int64_t i) { return std::pair<double, double>(to_f(got[i]), ref[i]); }, abs_tol, rel_tol,
                 cosine_tol, name);
}

}  // namespace

AccuracyReport check_half_outputs(const std::vector<uint16_t>& got, const std::vector<float>& ref,
                                  DType dtype, const std::string& name) {
  return compare_half(got, ref, dtype, kHalfAbsTol, kHalfRelTol, kCosineTol, name);
}

AccuracyReport check_half_gradients(const std::vector<uint16_t>& got, const std::vector<float>& ref,
                                    DType dtype, const std::string& name) {
  return compare_half(got, ref, dtype, kGradAbsTol, kGradRelTol, kGradCosineTol, name);
}

AccuracyReport check_float_stats(const std::vector<float>& got, const std::vector<float>& ref,
                                 const std::string& name) {
  if (got.size() != ref.size()) {
    return AccuracyReport{false, 1, 0, 0, name + ": size mismatch"};
  }
  return compare(static_cast<int64_t>(got.size()),
                 [&](int64_t i) { return std::pair<double, double>(got[i], ref[i]); }, kStatAbsTol,
                 kStatRelTol, -1.0, name);
}

}  // namespace mlakit::support
