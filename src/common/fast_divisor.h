// Division by a divisor fixed at launch, as a multiply and a shift (Granlund and Montgomery,
// "Division by invariant integers using multiplication", 1994): the host computes the
// magic number once, and a kernel that divides in a hot loop (the sparse FP8 decode's
// producer turns every listed slot into a page and an offset) pays a multiply-high, an add and
// a shift instead of the ~20 instructions of a 32-bit division (GPUs have no divide
// instruction).
//
// Valid for numerators in [0, 2^31) and divisors in [1, 2^31): then 2^l >= d > 2^(l-1) with
// l = ceil(log2 d), magic = floor(2^32 (2^l - d) / d) + 1 < 2^32, and
// n / d = (umulhi(n, magic) + n) >> l with no 32-bit overflow (umulhi(n, magic) < n < 2^31).
// Powers of two get magic 1 (umulhi 0): a plain shift.
#pragma once

#include <cstdint>

#include "common/host_device.h"

namespace mlakit::detail {

struct FastDivisor {
  uint32_t divisor = 1;
  uint32_t magic = 1;
  uint32_t shift = 0;

  FastDivisor() = default;
  // d in [1, 2^31).
  explicit FastDivisor(uint32_t d) : divisor(d) {
    while ((uint64_t{1} << shift) < d) ++shift;
    magic = static_cast<uint32_t>(((uint64_t{1} << 32) * ((uint64_t{1} << shift) - d)) / d + 1);
  }

  // n / divisor for n in [0, 2^31).
  MLAKIT_HD uint32_t quotient(uint32_t n) const { return (high_product(n, magic) + n) >> shift; }

 private:
  MLAKIT_HD static uint32_t high_product(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
    return __umulhi(a, b);
#else
    return static_cast<uint32_t>((static_cast<uint64_t>(a) * b) >> 32);
#endif
  }
};

}  // namespace mlakit::detail
