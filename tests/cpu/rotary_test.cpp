// The shared rotary embedding (src/common/rotary.h) against long double libm: its exp and
// sin / cos, the float cos / sin of pair angles over many positions, frequencies, rotary dims
// and thetas, the pair maps of both styles and the rotation's rounding order. (That the device
// computes the same bits: tests/gpu/rotary_test.cu.)
#include "common/rotary.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace mlakit {
namespace {

using detail::rope_cos_sin;
using detail::rope_pair;
using detail::rope_rotate;
using detail::RopePair;
using detail::rotary_exp;
using detail::rotary_sincos;

constexpr double kUlp1 = 0x1p-52;  // ulp of 1.0 (2^-53 is half of it)

// One ulp of float at |x| (the spacing of floats around it; the smallest normal's below it).
double float_ulp(long double x) {
  const float f = static_cast<float>(std::fabs(static_cast<double>(x)));
  return std::nextafter(std::fmax(f, 0x1p-126f), INFINITY) - std::fmax(f, 0x1p-126f);
}

TEST(RotaryExp, WithinTwoUlpOfLongDouble) {
  std::mt19937_64 rng(1);
  std::uniform_real_distribution<double> t_of(-40.0, 40.0);
  std::vector<double> ts = {0.0,   -0.0,   1.0,   -1.0,   0.5 * M_LN2, -0.5 * M_LN2, M_LN2,
                            700.0, -700.0, 708.0, -708.0, 1e-300,      -1e-20};
  for (int i = 0; i < 200000; ++i) ts.push_back(t_of(rng));
  for (double t : ts) {
    const long double want = std::exp(static_cast<long double>(t));
    const double got = rotary_exp(t);
    ASSERT_LE(std::fabs(static_cast<long double>(got) - want), 2 * kUlp1 * want) << "t = " << t;
  }
  EXPECT_EQ(rotary_exp(0.0), 1.0);
  EXPECT_EQ(rotary_exp(709.0), INFINITY);
  EXPECT_EQ(rotary_exp(INFINITY), INFINITY);
  EXPECT_EQ(rotary_exp(-709.0), 0.0);
  EXPECT_EQ(rotary_exp(-INFINITY), 0.0);
  EXPECT_TRUE(std::isnan(rotary_exp(NAN)));
}

// Relative error below 2 ulp of the result, also for results near 0 (angles near multiples
// of pi / 2, where the reduction must keep r's relative accuracy).
TEST(RotarySincos, WithinTwoUlpOfLongDouble) {
  std::mt19937_64 rng(2);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::vector<double> xs = {0.0, -0.0, 1e-300, 1e-8, 0.5, M_PI_4, M_PI_2, M_PI, 1e6, 0x1p21, 0x1p40, -0x1p49};
  for (int i = 0; i < 200000; ++i) {
    const double x = std::ldexp(unit(rng), static_cast<int>(rng() % 24) - 2);  // up to 2^21
    xs.push_back(i % 2 ? -x : x);
  }
  for (int64_t k = 1; k < (int64_t{1} << 21); k = k * 3 + 1) {  // doubles nearest to k pi/2
    const double x = static_cast<double>(static_cast<long double>(k) * 1.57079632679489661923132169163975144L);
    for (double y : {std::nextafter(x, 0.0), x, std::nextafter(x, INFINITY)}) xs.push_back(y);
  }
  for (double x : xs) {
    double s, c;
    rotary_sincos(x, &s, &c);
    const long double ws = std::sin(static_cast<long double>(x)), wc = std::cos(static_cast<long double>(x));
    ASSERT_LE(std::fabs(s - ws), 2 * kUlp1 * std::fabs(ws) + 1e-300L) << "sin x, x = " << x;
    ASSERT_LE(std::fabs(c - wc), 2 * kUlp1 * std::fabs(wc) + 1e-300L) << "cos x, x = " << x;
  }
  for (double x : {0x1p50, -0x1p50, 1e300, double{INFINITY}, -double{INFINITY}, double{NAN}}) {
    double s, c;
    rotary_sincos(x, &s, &c);
    EXPECT_TRUE(std::isnan(s) && std::isnan(c)) << x;
  }
}

// The float cos / sin of pair c at position pos against the long double value of the same
// definition, pos * e^(-(2c / r) * log_theta): within one float ulp plus what the float64
// angle's own rounding can move it (a few ulp of the angle: the quotient 2c / r, its product
// with log_theta, the exp and the product with pos).
TEST(RopeCosSin, WithinAFloatUlpOfTheExactAngle) {
  std::mt19937_64 rng(3);
  const double thetas[] = {10000.0, 500.0, 1e6, 5e5 + 0.25, 1.5, 2.0};
  const int rotary_dims[] = {2, 8, 32, 64, 96, 128, 256};
  int checked = 0;
  for (double theta : thetas) {
    const double log_theta = detail::rope_log_theta(theta);
    for (int rd : rotary_dims) {
      for (int n = 0; n < 400; ++n) {
        const int c = n < rd / 2 ? n : static_cast<int>(rng() % (rd / 2));
        const int64_t pos = n % 5 == 0   ? static_cast<int64_t>(rng() % 64)
                            : n % 5 == 1 ? (int64_t{1} << 21) - static_cast<int64_t>(rng() % 8)
                            : n % 5 == 2 ? -static_cast<int64_t>(rng() % 100000)
                                         : static_cast<int64_t>(rng() % (int64_t{1} << 21));
        float cs, sn;
        rope_cos_sin(pos, c, rd, log_theta, &cs, &sn);
        const long double t = -(2.0L * c / rd) * static_cast<long double>(log_theta);
        const long double angle = static_cast<long double>(pos) * std::exp(t);
        const long double angle_error = std::fabs(angle) * (2 * std::fabs(t) + 4) * kUlp1 * 0.5L;
        const long double wc = std::cos(angle), ws = std::sin(angle);
        ASSERT_LE(std::fabs(cs - wc), float_ulp(wc) + angle_error)
            << "cos: pos " << pos << " c " << c << " r " << rd << " theta " << theta;
        ASSERT_LE(std::fabs(sn - ws), float_ulp(ws) + angle_error)
            << "sin: pos " << pos << " c " << c << " r " << rd << " theta " << theta;
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 6 * 7 * 400);
}

// c = 0 turns by pos itself (inv_freq e^0 = 1 exactly): the float values are the correctly
// rounded cos / sin of the integer pos (within an ulp where the double lies near a midpoint).
TEST(RopeCosSin, PairZeroTurnsByThePositionAndPositionZeroIsIdentity) {
  for (int64_t pos : {int64_t{0}, int64_t{1}, int64_t{2}, int64_t{3}, int64_t{1000}, int64_t{65535}, int64_t{1} << 20,
                      (int64_t{1} << 31) - 1}) {
    float cs, sn;
    rope_cos_sin(pos, 0, 128, detail::rope_log_theta(10000.0), &cs, &sn);
    EXPECT_LE(std::fabs(cs - std::cos(static_cast<long double>(pos))), float_ulp(std::cos((long double)pos))) << pos;
    EXPECT_LE(std::fabs(sn - std::sin(static_cast<long double>(pos))), float_ulp(std::sin((long double)pos))) << pos;
  }
  for (int c : {0, 1, 31, 63}) {
    float cs, sn;
    rope_cos_sin(0, c, 128, detail::rope_log_theta(10000.0), &cs, &sn);
    EXPECT_EQ(cs, 1.0f);
    EXPECT_EQ(sn, 0.0f);
  }
}

void expect_pair(const RopePair& p, int c, int partner, bool first) {
  EXPECT_EQ(p.c, c);
  EXPECT_EQ(p.partner, partner);
  EXPECT_EQ(p.first, first);
}

TEST(RopePair, MapsOfBothStyles) {
  // NeoX, r = 8: pairs (0, 4), (1, 5), (2, 6), (3, 7).
  expect_pair(rope_pair(0, 1, 8), 0, 4, true);
  expect_pair(rope_pair(3, 1, 8), 3, 7, true);
  expect_pair(rope_pair(4, 1, 8), 0, 0, false);
  expect_pair(rope_pair(7, 1, 8), 3, 3, false);
  // GPT-J, r = 8: pairs (0, 1), (2, 3), (4, 5), (6, 7).
  expect_pair(rope_pair(0, 2, 8), 0, 1, true);
  expect_pair(rope_pair(1, 2, 8), 0, 0, false);
  expect_pair(rope_pair(6, 2, 8), 3, 7, true);
  expect_pair(rope_pair(7, 2, 8), 3, 6, false);
  // Every even r up to 256: each pair index twice, once first, partners mutual.
  for (int style : {1, 2}) {
    for (int r = 2; r <= 256; r += 2) {
      std::vector<int> firsts(r / 2, 0), seconds(r / 2, 0);
      for (int e = 0; e < r; ++e) {
        const RopePair p = rope_pair(e, style, r);
        ASSERT_GE(p.c, 0);
        ASSERT_LT(p.c, r / 2);
        ASSERT_GE(p.partner, 0);
        ASSERT_LT(p.partner, r);
        const RopePair q = rope_pair(p.partner, style, r);
        ASSERT_EQ(q.partner, e) << "style " << style << " r " << r << " e " << e;
        ASSERT_EQ(q.c, p.c);
        ASSERT_NE(q.first, p.first);
        ++(p.first ? firsts : seconds)[p.c];
        if (style == 1) ASSERT_EQ(p.first ? p.partner - e : e - p.partner, r / 2);
        if (style == 2) ASSERT_EQ(p.first ? e : p.partner, 2 * p.c);
      }
      for (int c = 0; c < r / 2; ++c) ASSERT_TRUE(firsts[c] == 1 && seconds[c] == 1) << style << " " << r << " " << c;
    }
  }
}

// (a, b) -> (a cos - b sin, a sin + b cos): the partner's product rounded first, then one
// fused multiply-add with x.
TEST(RopeRotate, FormulaAndRoundingOrder) {
  EXPECT_EQ(rope_rotate(1.f, 0.f, 0.6f, 0.8f, true), 0.6f);   // a' of (1, 0)
  EXPECT_EQ(rope_rotate(0.f, 1.f, 0.6f, 0.8f, false), 0.8f);  // b' of (1, 0)
  EXPECT_EQ(rope_rotate(0.f, 1.f, 0.6f, 0.8f, true), -0.8f);  // a' of (0, 1)
  EXPECT_EQ(rope_rotate(1.f, 0.f, 0.6f, 0.8f, false), 0.6f);  // b' of (0, 1)
  std::mt19937_64 rng(4);
  std::uniform_real_distribution<float> value(-4.f, 4.f), angle(-3.2f, 3.2f);
  for (int i = 0; i < 100000; ++i) {
    const float x = value(rng), partner = value(rng), a = angle(rng);
    const float cs = std::cos(a), sn = std::sin(a);
    const bool first = i % 2 == 0;
    const float p = partner * sn;
    const float got = rope_rotate(x, partner, cs, sn, first);
    ASSERT_EQ(got, std::fma(x, cs, first ? -p : p)) << i;
    const double exact = static_cast<double>(x) * cs + (first ? -1.0 : 1.0) * static_cast<double>(partner) * sn;
    // Two roundings: the product (half an ulp of |p|) and the fma (half an ulp of the result).
    ASSERT_LE(std::fabs(got - exact), 0.5 * float_ulp(p) + 0.5 * float_ulp(got)) << i;
  }
}

}  // namespace
}  // namespace mlakit
