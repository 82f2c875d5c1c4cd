#include <cmath>
#include <string>

#include "host/check.h"
#include "mlakit/reference.h"

namespace mlakit::reference {
namespace {

constexpr const char* kOp = "reference::merge_states";

Status check_pointer(const char* name, const void* p) {
  if (p != nullptr) return Status::ok();
  return detail::invalid(kOp, std::string(name) + ": expected a non-null pointer, got null");
}

}  // namespace

Status merge_states(const double* o_a, double lse_a, const double* o_b, double lse_b, int64_t d, double* o,
                    double* lse) {
  if (d < 1) return detail::invalid(kOp, "d: expected >= 1, got " + std::to_string(d));
  MLAKIT_RETURN_IF_ERROR(check_pointer("o_a", o_a));
  MLAKIT_RETURN_IF_ERROR(check_pointer("o_b", o_b));
  MLAKIT_RETURN_IF_ERROR(check_pointer("o", o));
  MLAKIT_RETURN_IF_ERROR(check_pointer("lse", lse));

  const bool empty_a = std::isinf(lse_a);
  const bool empty_b = std::isinf(lse_b);
  if (empty_a && empty_b) {
    for (int64_t i = 0; i < d; ++i) o[i] = 0.0;
    *lse = INFINITY;
    return Status::ok();
  }
  if (empty_a || empty_b) {
    const double* src = empty_a ? o_b : o_a;
    const double l = empty_a ? lse_b : lse_a;
    for (int64_t i = 0; i < d; ++i) o[i] = src[i];
    *lse = l;
    return Status::ok();
  }
  // Subtract the larger LSE first so the exponentials cannot overflow.
  const double m = std::fmax(lse_a, lse_b);
  const double wa = std::exp(lse_a - m), wb = std::exp(lse_b - m);
  const double total = wa + wb;
  for (int64_t i = 0; i < d; ++i) o[i] = (o_a[i] * wa + o_b[i] * wb) / total;
  *lse = m + std::log(total);
  return Status::ok();
}

}  // namespace mlakit::reference
