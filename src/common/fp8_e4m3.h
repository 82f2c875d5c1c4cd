// float <-> float8 e4m3 ("e4m3fn": 4 exponent bits, bias 7, 3 mantissa bits, no infinity,
// NaN = S.1111.111, largest finite 448) in plain integer arithmetic, compiled for host and
// device alike, so the CPU and GPU quantizers of the FP8 cache are bit-identical by
// construction. Rounding: to nearest, ties to even; saturating to +-448 (the SATFINITE mode
// of cvt.rn.satfinite.e4m3x2.f32); NaN -> 0x7F.
#pragma once

#include <cstdint>
#include <cstring>

#include "common/host_device.h"

namespace mlakit::detail {

MLAKIT_HD uint32_t float_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
MLAKIT_HD float bits_float(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

MLAKIT_HD uint8_t float_to_e4m3(float x) {
  const uint32_t u = float_bits(x);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return 0x7f;                   // NaN
  if (abs >= 0x43e00000u) return sign | 0x7e;           // >= 448 (incl. inf): saturate
  const int exp = static_cast<int>(abs >> 23) - 127;    // unbiased float exponent
  if (exp < -6) {
    // Subnormal e4m3 (or zero): multiples of 2^-9. q = round_even(|x| * 2^9); |x| < 2^-6 so
    // q <= 8, where 8 is the smallest normal (0x08) and the encoding stays correct.
    if (exp < -11) return sign;                         // below half of 2^-9 (and +-0)
    const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;  // 1.m x 2^exp, 24-bit significand
    const int shift = 23 - (exp + 9);                   // bits dropped to get units of 2^-9
    uint32_t q = mant >> shift;
    const uint32_t rest = mant & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rest > half || (rest == half && (q & 1u))) ++q;
    return sign | static_cast<uint8_t>(q);
  }
  // Normal: keep 3 mantissa bits, round to nearest even on the 20 dropped bits.
  uint32_t e = static_cast<uint32_t>(exp + 7);
  uint32_t m = (abs >> 20) & 0x7u;
  const uint32_t rest = abs & 0xfffffu;
  if (rest > 0x80000u || (rest == 0x80000u && (m & 1u))) {
    if (++m == 8) {
      m = 0;
      ++e;
    }
  }
  if (e > 15 || (e == 15 && m == 7)) return sign | 0x7e;  // rounded past 448: saturate
  return sign | static_cast<uint8_t>((e << 3) | m);
}

MLAKIT_HD float e4m3_to_float(uint8_t v) {
  const uint32_t sign = static_cast<uint32_t>(v & 0x80) << 24;
  const uint32_t e = (v >> 3) & 0xf, m = v & 0x7;
  if (e == 15 && m == 7) return bits_float(0x7fc00000u | sign);  // NaN
  if (e == 0) {
    // m x 2^-9, exact in float
    const float mag = static_cast<float>(m) * 0.001953125f;
    return sign ? -mag : mag;
  }
  return bits_float(sign | ((e - 7 + 127) << 23) | (m << 20));
}

}  // namespace mlakit::detail
