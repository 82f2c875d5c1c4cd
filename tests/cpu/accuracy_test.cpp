// The accuracy checks (docs/contract.md) of support/accuracy.h: they accept the rounded reference and
// in-tolerance data, and flag one bad element, a cosine drift, and any inf/NaN mismatch.
#include "support/accuracy.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "reference/host_numeric.h"

namespace mlakit::support {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNan = std::numeric_limits<float>::quiet_NaN();

uint16_t to_half(float x, DType dt) {
  return dt == DType::kBF16 ? host::float_to_bf16(x) : host::float_to_fp16(x);
}

std::vector<float> random_floats(size_t n, uint64_t seed, float mean = 0.f, float sd = 1.f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(mean, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = normal(rng);
  return v;
}

// The 16-bit rounding of an (unrounded) float reference: what a correct kernel returns.
std::vector<uint16_t> rounded(const std::vector<float>& ref, DType dt) {
  std::vector<uint16_t> v(ref.size());
  for (size_t i = 0; i < ref.size(); ++i) v[i] = to_half(ref[i], dt);
  return v;
}

class HalfOutputs : public ::testing::TestWithParam<DType> {};

TEST_P(HalfOutputs, AcceptsTheRoundedReference) {
  const auto ref = random_floats(4096, 1);
  const AccuracyReport r = check_half_outputs(rounded(ref, GetParam()), ref, GetParam(), "out");
  EXPECT_TRUE(r.ok) << r.message;
  EXPECT_EQ(r.failures, 0);
  EXPECT_LE(r.max_abs_error, 4.0 / 256);  // half an ulp of |x| < 4 in bf16
  EXPECT_LT(r.cosine_diff, 1e-5);
  EXPECT_TRUE(r.message.empty());
}

TEST_P(HalfOutputs, AcceptsExactlyRepresentableEqualInputs) {
  const DType dt = GetParam();
  auto ref = random_floats(1024, 2);
  for (auto& x : ref) x = dt == DType::kBF16 ? host::bf16_to_float(to_half(x, dt)) : host::fp16_to_float(to_half(x, dt));
  const AccuracyReport r = check_half_outputs(rounded(ref, dt), ref, dt, "out");
  EXPECT_TRUE(r.ok) << r.message;
  EXPECT_EQ(r.max_abs_error, 0.0);
  EXPECT_NEAR(r.cosine_diff, 0.0, 1e-15);
}

TEST_P(HalfOutputs, FlagsASingleBadElement) {
  const DType dt = GetParam();
  const auto ref = random_floats(4096, 3);
  auto got = rounded(ref, dt);
  got[1234] = to_half(ref[1234] + 0.05f + 0.05f * std::fabs(ref[1234]), dt);  // > abs 1e-3, rel 2/128
  const AccuracyReport r = check_half_outputs(got, ref, dt, "out");
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.failures, 1);
  EXPECT_NE(r.message.find("out[1234]"), std::string::npos) << r.message;
  EXPECT_GT(r.max_abs_error, 0.04);
}

TEST_P(HalfOutputs, ToleranceIsAbsOrRelWhicheverIsLooser) {
  const DType dt = GetParam();
  // Small values: abs 1e-3 governs. |ref| = 0.01, error 8e-4 < 1e-3 though rel 8% > 2/128.
  // (Many other elements keep the cosine rule out of the way.)
  std::vector<float> ref(64, 1.0f);
  ref[0] = 0.01f;
  auto ok_got = rounded(ref, dt), bad_got = rounded(ref, dt);
  ok_got[0] = to_half(0.01f + 8e-4f, dt);
  bad_got[0] = to_half(0.01f + 3e-3f, dt);
  EXPECT_TRUE(check_half_outputs(ok_got, ref, dt, "o").ok);
  EXPECT_FALSE(check_half_outputs(bad_got, ref, dt, "o").ok);
  // Large values: rel 2/128 governs. 100 vs 101.5 (1.5%) passes; 100 vs 104 fails.
  ref.assign(64, 100.f);
  ok_got = rounded(ref, dt);
  bad_got = rounded(ref, dt);
  ok_got[1] = to_half(101.5f, dt);
  bad_got[1] = to_half(104.f, dt);
  EXPECT_TRUE(check_half_outputs(ok_got, ref, dt, "o").ok);
  EXPECT_FALSE(check_half_outputs(bad_got, ref, dt, "o").ok);
}

TEST_P(HalfOutputs, CosineRuleCatchesADriftEveryElementPasses) {
  const DType dt = GetParam();
  const std::vector<float> ref(1024, 1.0f);
  const std::vector<uint16_t> got(1024, to_half(1.0f + 1.0f / 128, dt));  // rel 1/128 < 2/128 each
  const AccuracyReport r = check_half_outputs(got, ref, dt, "out");
  EXPECT_FALSE(r.ok);
  EXPECT_GT(r.cosine_diff, 5e-6);
  EXPECT_NE(r.message.find("cosine"), std::string::npos) << r.message;
}

// A reference of rounding noise (every element within the absolute tolerance of zero) has no
// direction: an unrelated noise passes on the elementwise rule, but one element beyond the
// absolute tolerance gives the tensor a direction and the cosine rule applies again.
TEST_P(HalfOutputs, CosineRuleNeedsAReferenceBeyondTheAbsoluteTolerance) {
  const DType dt = GetParam();
  std::vector<float> ref(256);
  std::vector<uint16_t> got(256);
  for (int i = 0; i < 256; ++i) {
    ref[i] = (i % 2 ? 1e-5f : -1e-5f) * static_cast<float>(1 + i % 7);
    got[i] = to_half((i % 3 ? 2e-5f : -3e-5f) * static_cast<float>(1 + i % 5), dt);  // uncorrelated, within 1e-3
  }
  const AccuracyReport noise = check_half_gradients(got, ref, dt, "dq");
  EXPECT_TRUE(noise.ok) << noise.message;
  EXPECT_GT(noise.cosine_diff, 7e-6);
  ref[0] = 0.5f;  // now the reference has a direction the result misses
  got[0] = to_half(0.48f, dt);  // within rel 8/128 itself
  for (int i = 1; i < 256; ++i) ref[i] *= 5, got[i] = to_half(-ref[i], dt);  // each within abs 1e-3
  const AccuracyReport r = check_half_gradients(got, ref, dt, "dq");
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.message.find("cosine"), std::string::npos) << r.message;
}

TEST_P(HalfOutputs, InfAndNanMustSitAtTheReferencePositions) {
  const DType dt = GetParam();
  auto ref = random_floats(256, 4);
  ref[10] = kInf;
  ref[20] = -kInf;
  ref[30] = kNan;
  const auto good = rounded(ref, dt);
  EXPECT_TRUE(check_half_outputs(good, ref, dt, "out").ok);  // same positions: fine

  const uint16_t pos_inf = to_half(kInf, dt), neg_inf = to_half(-kInf, dt), nan = to_half(kNan, dt);
  struct Case { size_t index; uint16_t value; };
  const Case mismatches[] = {
      {10, to_half(1.f, dt)},  // finite where the reference has +inf
      {20, pos_inf},           // +inf where the reference has -inf
      {30, to_half(0.f, dt)},  // finite (zero) where the reference has NaN
      {30, pos_inf},           // inf where the reference has NaN
      {40, nan},               // NaN where the reference is finite
      {50, neg_inf},           // -inf where the reference is finite
  };
  for (const Case& c : mismatches) {
    auto got = good;
    got[c.index] = c.value;
    const AccuracyReport r = check_half_outputs(got, ref, dt, "out");
    EXPECT_FALSE(r.ok) << "index " << c.index << " value " << c.value;
    EXPECT_EQ(r.failures, 1);
    EXPECT_NE(r.message.find("out[" + std::to_string(c.index) + "]"), std::string::npos) << r.message;
  }
}

TEST_P(HalfOutputs, SizeMismatchFails) {
  const auto ref = random_floats(16, 5);
  auto got = rounded(ref, GetParam());
  got.pop_back();
  EXPECT_FALSE(check_half_outputs(got, ref, GetParam(), "out").ok);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, HalfOutputs, ::testing::Values(DType::kBF16, DType::kFP16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(FloatStats, AcceptsEqualAndInToleranceInputs) {
  const auto ref = random_floats(1000, 6, 5.f, 3.f);
  EXPECT_TRUE(check_float_stats(ref, ref, "lse").ok);
  auto got = ref;
  for (auto& x : got) x = std::nextafter(x, 1e9f);  // one float ulp: rel 1.2e-7 << 8/65536
  got[3] = ref[3] + 0.9f * (8.f / 65536) * std::fabs(ref[3]);
  const AccuracyReport r = check_float_stats(got, ref, "lse");
  EXPECT_TRUE(r.ok) << r.message;
}

TEST(FloatStats, FlagsASingleBadElement) {
  const auto ref = random_floats(1000, 7, 5.f, 3.f);
  auto got = ref;
  got[777] = ref[777] + (1e-4f + 16.f / 65536 * std::fabs(ref[777]));  // > abs 1e-6, rel 8/65536
  const AccuracyReport r = check_float_stats(got, ref, "lse");
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.failures, 1);
  EXPECT_NE(r.message.find("lse[777]"), std::string::npos) << r.message;
}

TEST(FloatStats, AbsoluteToleranceNearZero) {
  const std::vector<float> ref = {0.f, 1e-7f, -3e-7f};
  EXPECT_TRUE(check_float_stats({9e-7f, -8e-7f, 5e-7f}, ref, "lse").ok);
  EXPECT_FALSE(check_float_stats({2e-6f, 1e-7f, -3e-7f}, ref, "lse").ok);
}

TEST(FloatStats, InfAndNanPositionsMustMatch) {
  const std::vector<float> ref = {1.f, kInf, -kInf, kNan, 2.f};
  EXPECT_TRUE(check_float_stats(ref, ref, "lse").ok);
  const std::vector<std::vector<float>> bad = {
      {kInf, kInf, -kInf, kNan, 2.f},   // inf where finite
      {1.f, 3.f, -kInf, kNan, 2.f},     // finite where +inf (an empty row must report +inf)
      {1.f, -kInf, -kInf, kNan, 2.f},   // -inf where +inf
      {1.f, kInf, kInf, kNan, 2.f},     // +inf where -inf
      {1.f, kInf, -kInf, 0.f, 2.f},     // finite where NaN
      {1.f, kInf, -kInf, kNan, kNan},   // NaN where finite
  };
  for (size_t k = 0; k < bad.size(); ++k) {
    const AccuracyReport r = check_float_stats(bad[k], ref, "lse");
    EXPECT_FALSE(r.ok) << "case " << k;
    EXPECT_EQ(r.failures, 1) << "case " << k;
  }
  EXPECT_FALSE(check_float_stats({1.f}, ref, "lse").ok);  // size mismatch
}

}  // namespace
}  // namespace mlakit::support
