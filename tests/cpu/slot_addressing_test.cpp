// How the sparse kernels turn a listed slot into a cache row: FastDivisor
// (common/fast_divisor.h), whose multiply-shift quotient must equal n / d over the whole
// documented range (the same code the device runs: MLAKIT_HD, __umulhi's host twin), and
// sparse_slot_limit (kernels/mla_params.h), the bound of the valid slots.
#include "common/fast_divisor.h"
#include "kernels/mla_params.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

namespace mlakit::detail {
namespace {

constexpr uint32_t kMaxNumerator = 0x7fffffffu;  // 2^31 - 1

// Numerators where an off-by-one shows: around 0, every multiple of d near the ends of the
// range, and the range's end.
std::vector<uint32_t> edge_numerators(uint32_t d) {
  std::vector<uint32_t> n = {0, 1, d - 1, d, d + 1, kMaxNumerator, kMaxNumerator - 1};
  const uint32_t last_multiple = kMaxNumerator / d * d;
  for (uint32_t m : {last_multiple, last_multiple - d}) {
    for (int64_t delta = -1; delta <= 1; ++delta) {
      const int64_t x = static_cast<int64_t>(m) + delta;
      if (x >= 0 && x <= kMaxNumerator) n.push_back(static_cast<uint32_t>(x));
    }
  }
  return n;
}

void expect_exact(uint32_t d, const std::vector<uint32_t>& numerators) {
  const FastDivisor fd(d);
  ASSERT_EQ(fd.divisor, d);
  for (uint32_t n : numerators) {
    ASSERT_EQ(fd.quotient(n), n / d) << "n = " << n << ", d = " << d;
  }
}

TEST(FastDivisor, PowersOfTwoAreShifts) {
  for (uint32_t shift = 0; shift < 31; ++shift) {
    const FastDivisor fd(uint32_t{1} << shift);
    EXPECT_EQ(fd.magic, 1u);
    EXPECT_EQ(fd.shift, shift);
    expect_exact(uint32_t{1} << shift, edge_numerators(uint32_t{1} << shift));
  }
}

TEST(FastDivisor, SmallDivisorsAtEdgesAndRandomNumerators) {
  std::mt19937 rng(20261124);
  std::uniform_int_distribution<uint32_t> any(0, kMaxNumerator);
  for (uint32_t d = 1; d <= 4096; ++d) {
    std::vector<uint32_t> n = edge_numerators(d);
    for (int i = 0; i < 64; ++i) n.push_back(any(rng));
    expect_exact(d, n);
  }
}

TEST(FastDivisor, LargeDivisors) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> any(0, kMaxNumerator);
  std::vector<uint32_t> divisors = {kMaxNumerator, kMaxNumerator - 1, (1u << 30) + 1, (1u << 30) - 1, 65537, 1000003};
  for (int i = 0; i < 200; ++i) divisors.push_back(any(rng) | 1u);
  for (uint32_t d : divisors) {
    std::vector<uint32_t> n = edge_numerators(d);
    for (int i = 0; i < 256; ++i) n.push_back(any(rng));
    expect_exact(d, n);
  }
}

TEST(FastDivisor, EveryNumeratorForTheDecodePageSizes) {
  // The page sizes the tests and benchmarks use, over a dense numerator sweep.
  for (uint32_t d : {1u, 53u, 64u, 256u, 3u, 1000u}) {
    const FastDivisor fd(d);
    for (uint32_t n = 0; n < (1u << 22); ++n) ASSERT_EQ(fd.quotient(n), n / d) << "n = " << n << ", d = " << d;
  }
}

TEST(FastDivisor, DefaultIsDivisionByOne) {
  const FastDivisor fd;
  for (uint32_t n : {0u, 1u, 12345u, kMaxNumerator}) EXPECT_EQ(fd.quotient(n), n);
}

// Every int32 slot in [0, num_blocks * page_size) is below the limit, and no other int32
// (negatives read as unsigned are >= 2^31).
TEST(SparseSlotLimit, IsTheSlotCountCappedAtTwoToThe31) {
  EXPECT_EQ(sparse_slot_limit(0, 64), 0u);
  EXPECT_EQ(sparse_slot_limit(1, 1), 1u);
  EXPECT_EQ(sparse_slot_limit(1000, 53), 53000u);
  EXPECT_EQ(sparse_slot_limit(int64_t{1} << 25, 64), 1u << 31);  // exactly 2^31 slots
  EXPECT_EQ(sparse_slot_limit(int64_t{1} << 30, 256), 1u << 31);  // more than an int32 can name
  EXPECT_EQ(sparse_slot_limit(kMaxNumerator, 1), kMaxNumerator);
  EXPECT_GE(static_cast<uint32_t>(int32_t{-1}), sparse_slot_limit(int64_t{1} << 40, 1));
}

}  // namespace
}  // namespace mlakit::detail
