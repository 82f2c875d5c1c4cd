// The rotary embedding of the GQA decode (docs/contract.md, GQA decode) as one sequence of
// IEEE operations that the host (g++) and the device (nvcc) evaluate alike, so a key rotated
// by the CPU cache tools and by the GPU append has the same bits. Compiled for both.
//
// Pairs: column e < rotary_dim belongs to pair c and is rotated with its partner column:
//   NeoX  (style 1): pair c = (c, c + rotary_dim / 2)
//   GPT-J (style 2): pair c = (2c, 2c + 1)
// Angle of pair c at position pos: pos * theta^(-2c / rotary_dim), computed in float64 as
//   inv_freq = rotary_exp(-((2c / rotary_dim) * log_theta)),  angle = pos * inv_freq
// (log_theta = ln(theta), rope_log_theta, computed once on the host), then cos / sin of the
// angle by rotary_sincos, each rounded once to float. Rotation of (a, b) by (cos, sin):
//   a' = a cos - b sin,  b' = a sin + b cos      (rope_rotate: one rounded product, one fmaf)
//
// Why not libm: std::exp / std::sin (glibc) and CUDA's exp / sin are each accurate to about an
// ulp but not correctly rounded, and differ in the last bit for some inputs, which after the
// rounding to float (and to bf16 / int8 / fp8) changes a stored byte now and then. Here every
// step is an IEEE operation with one defined result: a product, a quotient or an fma (std::fma
// on the host, the fma instruction on the device: both correctly rounded), written so that no
// compiler may fuse a product into a following addition (on the device the plain products and
// quotients use the explicitly rounded __dmul_rn / __ddiv_rn / __fmul_rn, which nvcc never
// contracts; on the host every addition of a product is already an explicit fma, so there is
// nothing for -ffp-contract to fuse).
//
// Method (accuracy measured in tests/cpu/rotary_test.cpp against long double):
//   rotary_exp(t), |t| <= 708: t = k ln2 + r, k = nearest integer to t log2(e) (by the
//     1.5 * 2^52 rounding constant), r by a two-part Cody-Waite ln2 (the high part's trailing
//     zeros make k * ln2_hi exact, and the fma rounds the difference once), |r| <= ln2 / 2;
//     e^r by its Taylor polynomial to degree 13 (truncation < 4e-18) in Horner form with
//     fma; times 2^k built in the exponent bits. Relative error ~1e-16 (below 2 ulp).
//   rotary_sincos(x), |x| < 2^50: x = k pi/2 + r, k nearest to x * 2/pi, r by a three-part
//     pi/2 (P1 = pi/2 rounded to double, P2, P3 the next two roundings of the remainder):
//     x - k P1 is exact (both are multiples of 2^-52 when |x| >= 1, or of ulp(x) >= 2^-53 when
//     k != 0, and the difference is below 2), the P2 and P3 terms each round once, and the
//     neglected rest is below k * 2^-163; |r| <= pi/4 (+ an ulp). sin r and cos r by their
//     Taylor polynomials to r^21 and r^20 (truncation < 1e-22) in Horner form with fma, then
//     the quadrant k mod 4. Error ~1 ulp of the result, relative even for results near 0
//     (r keeps its relative accuracy through the reduction). |x| >= 2^50, infinities and NaN
//     give NaN (positions times inv_freq <= 1 stay below 2^31).
//   So for positions up to 2^21 and beyond, the float cos / sin are the correctly rounded
//   values of the float64 angle except where that value lies within ~1e-16 of a float
//   midpoint; the float64 angle itself differs from the exact pos * theta^(-2c / r) by a few
//   ulp of the angle (the rounding of 2c / r, of the product with log_theta, of the exp and of
//   the product with pos).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "common/host_device.h"

namespace mlakit::detail {

// The IEEE operations the rotary code is built from, rounded to nearest even, never fused.
MLAKIT_HD double rotary_fma(double a, double b, double c) {
#if defined(__CUDA_ARCH__)
  return __fma_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}
MLAKIT_HD double rotary_mul(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}
MLAKIT_HD double rotary_div(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __ddiv_rn(a, b);
#else
  return a / b;
#endif
}

// Horner's rule with fma from the highest coefficient down: (((c0 z + c1) z + c2) ...).
MLAKIT_HD double rotary_horner(double, double c) { return c; }
template <typename... Rest>
MLAKIT_HD double rotary_horner(double z, double c0, double c1, Rest... rest) {
  return rotary_horner(z, rotary_fma(c0, z, c1), rest...);
}

// e^t (see the header comment). t > 708: +inf; t < -708: 0 (no subnormal results); NaN: NaN.
MLAKIT_HD double rotary_exp(double t) {
  if (!(t <= 708.0)) return t != t ? t : HUGE_VAL;
  if (t < -708.0) return 0.0;
  constexpr double kLog2e = 0x1.71547652b82fep+0;
  constexpr double kLn2Hi = 0x1.62e42fee00000p-1;   // 32 significant bits: k * kLn2Hi is exact
  constexpr double kLn2Lo = 0x1.a39ef35793c76p-33;  // ln2 - kLn2Hi, rounded
  constexpr double kRound = 0x1.8p+52;              // x + 1.5 * 2^52 rounds x (|x| < 2^51) to an integer
  const double k = rotary_fma(t, kLog2e, kRound) - kRound;
  const double r = rotary_fma(-k, kLn2Lo, rotary_fma(-k, kLn2Hi, t));
  // e^r = sum_{n=0..13} r^n / n!, the coefficients 1 / n! rounded to double.
  const double e_r =
      rotary_horner(r, 0x1.6124613a86d09p-33, 0x1.1eed8eff8d898p-29, 0x1.ae64567f544e4p-26, 0x1.27e4fb7789f5cp-22,
                    0x1.71de3a556c734p-19, 0x1.a01a01a01a01ap-16, 0x1.a01a01a01a01ap-13, 0x1.6c16c16c16c17p-10,
                    0x1.1111111111111p-7, 0x1.5555555555555p-5, 0x1.5555555555555p-3, 0x1p-1, 1.0, 1.0);
  // 2^k, k in [-1022, 1022] here, as exponent bits.
  const uint64_t bits = static_cast<uint64_t>(static_cast<int64_t>(k) + 1023) << 52;
  double two_k;
  memcpy(&two_k, &bits, 8);
  return rotary_mul(e_r, two_k);
}

// sin x and cos x (see the header comment). |x| >= 2^50, infinities and NaN: both NaN.
MLAKIT_HD void rotary_sincos(double x, double* sin_out, double* cos_out) {
  if (!(x > -0x1p50 && x < 0x1p50)) {
    *sin_out = *cos_out = NAN;
    return;
  }
  constexpr double kTwoOverPi = 0x1.45f306dc9c883p-1;
  constexpr double kPio2P1 = 0x1.921fb54442d18p+0;  // pi/2 = P1 + P2 + P3 + O(2^-163)
  constexpr double kPio2P2 = 0x1.1a62633145c07p-54;
  constexpr double kPio2P3 = -0x1.f1976b7ed8fbcp-110;
  constexpr double kRound = 0x1.8p+52;
  const double k = rotary_fma(x, kTwoOverPi, kRound) - kRound;
  const double r = rotary_fma(-k, kPio2P3, rotary_fma(-k, kPio2P2, rotary_fma(-k, kPio2P1, x)));
  const double z = rotary_mul(r, r);
  // sin r = r + r z S(z), S(z) = sum_{n=1..10} (-1)^n z^(n-1) / (2n+1)!
  const double s =
      rotary_horner(z, 0x1.71b8ef6dcf572p-66, -0x1.2f49b46814157p-57, 0x1.952c77030ad4ap-49, -0x1.ae7f3e733b81fp-41,
                    0x1.6124613a86d09p-33, -0x1.ae64567f544e4p-26, 0x1.71de3a556c734p-19, -0x1.a01a01a01a01ap-13,
                    0x1.1111111111111p-7, -0x1.5555555555555p-3);
  const double sin_r = rotary_fma(rotary_mul(r, z), s, r);
  // cos r = 1 + z C(z), C(z) = sum_{n=1..10} (-1)^n z^(n-1) / (2n)!
  const double c = rotary_horner(z, 0x1.e542ba4020225p-62, -0x1.6827863b97d97p-53, 0x1.ae7f3e733b81fp-45,
                                 -0x1.93974a8c07c9dp-37, 0x1.1eed8eff8d898p-29, -0x1.27e4fb7789f5cp-22,
                                 0x1.a01a01a01a01ap-16, -0x1.6c16c16c16c17p-10, 0x1.5555555555555p-5, -0x1p-1);
  const double cos_r = rotary_fma(z, c, 1.0);
  switch (static_cast<int64_t>(k) & 3) {  // k mod 4 (two's complement: also for k < 0)
    case 0:
      *sin_out = sin_r, *cos_out = cos_r;
      break;
    case 1:
      *sin_out = cos_r, *cos_out = -sin_r;
      break;
    case 2:
      *sin_out = -sin_r, *cos_out = -cos_r;
      break;
    default:
      *sin_out = -cos_r, *cos_out = sin_r;
      break;
  }
}

// ln(theta) for GqaRope::log_theta: computed once on the host (one libm call, the same value
// for the CPU tools and every launch), never on the device.
inline double rope_log_theta(double theta) { return std::log(theta); }

// Where column e (< rotary_dim) of a head sits in its rotation pair.
struct RopePair {
  int c;        // the pair's index, 0 .. rotary_dim / 2 - 1 (the angle's frequency)
  int partner;  // the pair's other column
  bool first;   // e is the pair's first column (a' = a cos - b sin), else its second
};

// style 1 NeoX: pairs (c, c + rotary_dim / 2); style 2 GPT-J: pairs (2c, 2c + 1).
MLAKIT_HD RopePair rope_pair(int e, int style, int rotary_dim) {
  if (style == 2) return RopePair{e >> 1, e ^ 1, (e & 1) == 0};
  const int half = rotary_dim / 2;
  return e < half ? RopePair{e, e + half, true} : RopePair{e - half, e - half, false};
}

// cos and sin of pair c's angle at position pos, rounded to float (the header comment's
// definition; bit-identical on the host and the device).
MLAKIT_HD void rope_cos_sin(int64_t pos, int c, int rotary_dim, double log_theta, float* cos_out, float* sin_out) {
  const double exponent = rotary_div(static_cast<double>(2 * c), static_cast<double>(rotary_dim));
  const double inv_freq = rotary_exp(-rotary_mul(exponent, log_theta));
  double s, co;
  rotary_sincos(rotary_mul(static_cast<double>(pos), inv_freq), &s, &co);
  *cos_out = static_cast<float>(co);
  *sin_out = static_cast<float>(s);
}

// One rotated value: first: x cos - partner sin; else partner sin + x cos. The partner's
// product is rounded first, then one fmaf with x (so a pair's two outputs each round twice, in
// a fixed order, on both sides).
MLAKIT_HD float rope_rotate(float x, float partner, float cos, float sin, bool first) {
#if defined(__CUDA_ARCH__)
  const float p = __fmul_rn(partner, sin);
  return __fmaf_rn(x, cos, first ? -p : p);
#else
  const float p = partner * sin;
  return std::fma(x, cos, first ? -p : p);
#endif
}

}  // namespace mlakit::detail
