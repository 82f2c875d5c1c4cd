#include <cmath>

#include "mlakit/reference.h"

namespace mlakit::reference {

void merge_states(const double* o_a, double lse_a, const double* o_b, double lse_b, int64_t d,
                  double* o, double* lse) {
  const bool empty_a = std::isinf(lse_a);
  const bool empty_b = std::isinf(lse_b);
  if (empty_a && empty_b) {
    for (int64_t i = 0; i < d; ++i) o[i] = 0.0;
    *lse = INFINITY;
    return;
  }
  if (empty_a || empty_b) {
    const double* src = empty_a ? o_b : o_a;
    const double l = empty_a ? lse_b : lse_a;
    for (int64_t i = 0; i < d; ++i) o[i] = src[i];
    *lse = l;
    return;
  }
  // Subtract the larger LSE first so the exponentials cannot overflow.
  const double m = std::fmax(lse_a, lse_b);
  const double wa = std::exp(lse_a - m), wb = std::exp(lse_b - m);
  const double total = wa + wb;
  for (int64_t i = 0; i < d; ++i) o[i] = (o_a[i] * wa + o_b[i] * wb) / total;
  *lse = m + std::log(total);
}

}  // namespace mlakit::reference
