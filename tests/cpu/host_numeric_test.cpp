// bf16 / fp16 conversions of reference/host_numeric.h: round-to-nearest-even on known bit
// patterns, exact round trips, and agreement with an independent rounding over random floats.
#include "reference/host_numeric.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>

namespace mlakit::host {
namespace {

float f(uint32_t bits) { return bits_to_float(bits); }

bool is_bf16_nan(uint16_t h) { return (h & 0x7fff) > 0x7f80; }
bool is_fp16_nan(uint16_t h) { return (h & 0x7fff) > 0x7c00; }

// Value of an fp16 pattern from its definition, independent of fp16_to_float.
double fp16_value(uint16_t h) {
  const int sign = h >> 15, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  double v = exp == 0 ? std::ldexp(man, -24) : std::ldexp(1024 + man, exp - 25);
  return sign ? -v : v;
}

// Round-to-nearest-even of a finite non-negative double to a 16-bit format whose positive
// patterns [0, inf_pattern) increase monotonically with `value_of`: binary search for the
// neighbours, pick the nearer, ties to the even pattern; inf_pattern when past the midpoint
// between the largest finite value and the next power of two (IEEE overflow rule).
template <typename ValueOf>
uint16_t round_nearest_even(double x, uint16_t inf_pattern, double inf_threshold,
                            ValueOf value_of) {
  if (x >= inf_threshold) return inf_pattern;
  uint16_t lo = 0, hi = static_cast<uint16_t>(inf_pattern - 1);
  if (x >= value_of(hi)) return hi;
  while (hi - lo > 1) {  // invariant: value_of(lo) <= x < value_of(hi)
    uint16_t mid = static_cast<uint16_t>((lo + hi) / 2);
    if (value_of(mid) <= x) lo = mid; else hi = mid;
  }
  const double dl = x - value_of(lo), dh = value_of(hi) - x;
  if (dl < dh) return lo;
  if (dh < dl) return hi;
  return (lo & 1) ? hi : lo;
}

TEST(HostNumericBf16, RoundsToNearestEvenOnKnownPatterns) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(float_to_bf16(-2.0f), 0xc000);
  EXPECT_EQ(float_to_bf16(f(0x3f807fff)), 0x3f80);  // just below the midpoint
  EXPECT_EQ(float_to_bf16(f(0x3f808000)), 0x3f80);  // tie, even stays
  EXPECT_EQ(float_to_bf16(f(0x3f808001)), 0x3f81);  // just above the midpoint
  EXPECT_EQ(float_to_bf16(f(0x3f818000)), 0x3f82);  // tie, odd rounds up to even
  EXPECT_EQ(float_to_bf16(f(0xbf818000)), 0xbf82);  // negative tie
  EXPECT_EQ(float_to_bf16(f(0x3fff8000)), 0x4000);  // tie carries into the exponent
}

TEST(HostNumericBf16, SubnormalsZerosInfinitiesAndOverflow) {
  EXPECT_EQ(float_to_bf16(0.0f), 0x0000);
  EXPECT_EQ(float_to_bf16(-0.0f), 0x8000);
  EXPECT_EQ(float_to_bf16(f(0x00010000)), 0x0001);  // smallest bf16 subnormal
  EXPECT_EQ(float_to_bf16(f(0x00008000)), 0x0000);  // tie between 0 and 1: even
  EXPECT_EQ(float_to_bf16(f(0x00008001)), 0x0001);
  EXPECT_EQ(float_to_bf16(f(0x00018000)), 0x0002);  // tie between 1 and 2: even
  EXPECT_EQ(float_to_bf16(f(0x007f8000)), 0x0080);  // largest subnormal rounds to min normal
  EXPECT_EQ(float_to_bf16(INFINITY), 0x7f80);
  EXPECT_EQ(float_to_bf16(-INFINITY), 0xff80);
  EXPECT_EQ(float_to_bf16(f(0x7f7f7fff)), 0x7f7f);  // stays the largest finite
  EXPECT_EQ(float_to_bf16(f(0x7f7f8000)), 0x7f80);  // tie at the top rounds to inf
  EXPECT_EQ(float_to_bf16(f(0x7f7fffff)), 0x7f80);  // FLT_MAX rounds to inf
}

TEST(HostNumericBf16, NanStaysNan) {
  // Payloads in the low 16 bits would round to infinity if treated as numbers.
  for (uint32_t bits : {0x7f800001u, 0x7fc00000u, 0x7fffffffu, 0xff800001u, 0xffc00000u,
                        0x7f807fffu, 0x7f808000u}) {
    uint16_t h = float_to_bf16(f(bits));
    EXPECT_TRUE(is_bf16_nan(h)) << std::hex << bits << " -> " << h;
    EXPECT_TRUE(std::isnan(bf16_to_float(h)));
    EXPECT_EQ(h >> 15, bits >> 31) << "sign of " << std::hex << bits;
  }
}

TEST(HostNumericFp16, RoundsToNearestEvenOnKnownPatterns) {
  EXPECT_EQ(float_to_fp16(1.0f), 0x3c00);
  EXPECT_EQ(float_to_fp16(-1.5f), 0xbe00);
  EXPECT_EQ(float_to_fp16(f(0x3f801000)), 0x3c00);  // 1 + 2^-11: tie, even stays
  EXPECT_EQ(float_to_fp16(f(0x3f801001)), 0x3c01);
  EXPECT_EQ(float_to_fp16(f(0x3f800fff)), 0x3c00);
  EXPECT_EQ(float_to_fp16(f(0x3f803000)), 0x3c02);  // 1 + 3 * 2^-11: tie, odd rounds up
  EXPECT_EQ(float_to_fp16(2.0f - std::ldexp(1.0f, -11)), 0x4000);  // carries into exponent
  EXPECT_EQ(float_to_fp16(65504.0f), 0x7bff);       // largest finite half
  EXPECT_EQ(float_to_fp16(std::ldexp(1.0f, -14)), 0x0400);  // smallest normal
}

TEST(HostNumericFp16, SubnormalsAndZeros) {
  EXPECT_EQ(float_to_fp16(0.0f), 0x0000);
  EXPECT_EQ(float_to_fp16(-0.0f), 0x8000);
  EXPECT_EQ(float_to_fp16(std::ldexp(1.0f, -24)), 0x0001);   // smallest subnormal
  EXPECT_EQ(float_to_fp16(std::ldexp(1.0f, -25)), 0x0000);   // tie between 0 and 1: even
  EXPECT_EQ(float_to_fp16(std::ldexp(1.0f, -25) * 1.0001f), 0x0001);
  EXPECT_EQ(float_to_fp16(std::ldexp(3.0f, -25)), 0x0002);   // tie between 1 and 2: even
  EXPECT_EQ(float_to_fp16(-std::ldexp(3.0f, -25)), 0x8002);
  EXPECT_EQ(float_to_fp16(std::ldexp(1023.0f, -24)), 0x03ff);  // largest subnormal
  EXPECT_EQ(float_to_fp16(std::ldexp(1023.5f, -24)), 0x0400);  // tie up into the normals
  EXPECT_EQ(float_to_fp16(std::ldexp(1.0f, -30)), 0x0000);     // underflows to zero
  EXPECT_EQ(float_to_fp16(f(0x00000001)), 0x0000);              // float subnormal
}

TEST(HostNumericFp16, OverflowsToInfinityFrom65520) {
  EXPECT_EQ(float_to_fp16(65519.0f), 0x7bff);
  EXPECT_EQ(float_to_fp16(std::nextafter(65520.0f, 0.0f)), 0x7bff);
  EXPECT_EQ(float_to_fp16(65520.0f), 0x7c00);
  EXPECT_EQ(float_to_fp16(-65520.0f), 0xfc00);
  EXPECT_EQ(float_to_fp16(1e6f), 0x7c00);
  EXPECT_EQ(float_to_fp16(f(0x7f7fffff)), 0x7c00);
  EXPECT_EQ(float_to_fp16(INFINITY), 0x7c00);
  EXPECT_EQ(float_to_fp16(-INFINITY), 0xfc00);
}

TEST(HostNumericFp16, NanStaysNan) {
  for (uint32_t bits : {0x7f800001u, 0x7fc00000u, 0x7fffffffu, 0xff800001u, 0xffc00000u}) {
    uint16_t h = float_to_fp16(f(bits));
    EXPECT_TRUE(is_fp16_nan(h)) << std::hex << bits << " -> " << h;
    EXPECT_TRUE(std::isnan(fp16_to_float(h)));
    EXPECT_EQ(h >> 15, bits >> 31) << "sign of " << std::hex << bits;
  }
}

TEST(HostNumeric, EveryNonNanPatternRoundTripsExactly) {
  for (uint32_t i = 0; i <= 0xffff; ++i) {
    const auto h = static_cast<uint16_t>(i);
    if (!is_bf16_nan(h)) {
      ASSERT_EQ(float_to_bf16(bf16_to_float(h)), h) << "bf16 pattern " << std::hex << i;
    } else {
      ASSERT_TRUE(std::isnan(bf16_to_float(h))) << "bf16 pattern " << std::hex << i;
      ASSERT_TRUE(is_bf16_nan(float_to_bf16(bf16_to_float(h))));
    }
    if (!is_fp16_nan(h)) {
      ASSERT_EQ(float_to_fp16(fp16_to_float(h)), h) << "fp16 pattern " << std::hex << i;
    } else {
      ASSERT_TRUE(std::isnan(fp16_to_float(h))) << "fp16 pattern " << std::hex << i;
      ASSERT_TRUE(is_fp16_nan(float_to_fp16(fp16_to_float(h))));
    }
  }
}

TEST(HostNumeric, DecodingMatchesTheFormatDefinitions) {
  for (uint32_t i = 0; i <= 0xffff; ++i) {
    const auto h = static_cast<uint16_t>(i);
    if (!is_fp16_nan(h) && (h & 0x7fff) != 0x7c00) {
      ASSERT_EQ(static_cast<double>(fp16_to_float(h)), fp16_value(h)) << std::hex << i;
    }
    // bf16 is the upper half of a float by definition.
    if (!is_bf16_nan(h)) ASSERT_EQ(float_to_bits(bf16_to_float(h)), i << 16) << std::hex << i;
  }
  EXPECT_EQ(fp16_to_float(0x7c00), INFINITY);
  EXPECT_EQ(fp16_to_float(0xfc00), -INFINITY);
}

TEST(HostNumeric, RandomFloatsRoundLikeAnIndependentNearestEven) {
  std::mt19937 rng(20240611);
  // Exponents spanning both formats' subnormal, normal and overflow ranges.
  std::uniform_int_distribution<uint32_t> exp_dist(90, 150), man_dist(0, 0x7fffff);
  const double bf16_inf_threshold = std::ldexp(2.0 - std::ldexp(1.0, -8), 127);
  for (int n = 0; n < 200000; ++n) {
    const uint32_t bits = (exp_dist(rng) << 23) | man_dist(rng);
    const float x = f(bits);
    const uint16_t want_fp16 = round_nearest_even(x, 0x7c00, 65520.0, fp16_value);
    ASSERT_EQ(float_to_fp16(x), want_fp16) << "x = " << x << " bits " << std::hex << bits;
    ASSERT_EQ(float_to_fp16(-x), want_fp16 | 0x8000) << "x = " << -x;
    const uint16_t want_bf16 = round_nearest_even(x, 0x7f80, bf16_inf_threshold,
                                                  [](uint16_t h) { return double(bf16_to_float(h)); });
    ASSERT_EQ(float_to_bf16(x), want_bf16) << "x = " << x << " bits " << std::hex << bits;
    ASSERT_EQ(float_to_bf16(-x), want_bf16 | 0x8000) << "x = " << -x;
  }
  // Tiny exponents: float subnormals and the bf16 subnormal range.
  std::uniform_int_distribution<uint32_t> low_exp(0, 3);
  for (int n = 0; n < 20000; ++n) {
    const uint32_t bits = (low_exp(rng) << 23) | man_dist(rng);
    const float x = f(bits);
    ASSERT_EQ(float_to_bf16(x), round_nearest_even(x, 0x7f80, bf16_inf_threshold, [](uint16_t h) {
                return double(bf16_to_float(h));
              })) << std::hex << bits;
    ASSERT_EQ(float_to_fp16(x), 0) << std::hex << bits;
  }
}

TEST(HostNumeric, LoadAndStoreHalfDispatchOnDtype) {
  uint16_t buf[2] = {0, 0};
  store_half(buf, 1, DType::kBF16, 1.5f);
  EXPECT_EQ(buf[1], 0x3fc0);
  EXPECT_EQ(load_half(buf, 1, DType::kBF16), 1.5f);
  store_half(buf, 0, DType::kFP16, 1.5f);
  EXPECT_EQ(buf[0], 0x3e00);
  EXPECT_EQ(load_half(buf, 0, DType::kFP16), 1.5f);
  EXPECT_EQ(buf[1], 0x3fc0);  // the neighbour is untouched
}

}  // namespace
}  // namespace mlakit::host
