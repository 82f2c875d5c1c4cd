// The GPU FP8 MLA cache tools against the CPU versions, bit for bit: quantize (with a padded
// row stride), dequantize, and the paged append into a poisoned cache.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "gpu_test_util.h"
#include "mlakit/fp8_cache.h"
#include "reference/host_numeric.h"

namespace mlakit::testing {
namespace {

// Rows of several magnitudes (subnormal e4m3 range included), some with an all-zero tile.
std::vector<uint16_t> rows_of_bf16(int64_t rows, int64_t pitch, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<uint16_t> v(rows * pitch, 0x7fc0);  // NaN in the padding: never read
  for (int64_t r = 0; r < rows; ++r) {
    const float magnitude = std::pow(10.f, static_cast<float>(r % 9) - 5.f);
    for (int i = 0; i < 576; ++i) v[r * pitch + i] = host::float_to_bf16(normal(rng) * magnitude);
    if (r % 4 == 3) {
      for (int i = 256; i < 384; ++i) v[r * pitch + i] = 0;
    }
  }
  return v;
}

TEST(Fp8CacheGpu, QuantizeAndDequantizeMatchTheCpuBitForBit) {
  MLAKIT_SKIP_WITHOUT_GPU();
  constexpr int64_t kRows = 1000, kPitch = 640;
  const std::vector<uint16_t> src = rows_of_bf16(kRows, kPitch, 3);
  const TensorRef host_src = make_tensor(const_cast<uint16_t*>(src.data()), DType::kBF16, {kRows, 576}, {kPitch, 1});
  std::vector<uint8_t> cpu_q(kRows * 656);
  ASSERT_TRUE(reference::quantize_mla_cache_fp8(host_src, make_tensor(cpu_q.data(), DType::kUInt8, {kRows, 656})));
  std::vector<uint16_t> cpu_back(kRows * 576);
  ASSERT_TRUE(reference::dequantize_mla_cache_fp8(make_tensor(cpu_q.data(), DType::kUInt8, {kRows, 656}),
                                                  make_tensor(cpu_back.data(), DType::kBF16, {kRows, 576})));

  DeviceBuffer d_src(src), d_q(kRows * 656), d_back(kRows * 576 * 2);
  d_q.fill_bytes(0xEE);
  d_back.fill_bytes(0xFF);
  Status s = quantize_mla_cache_fp8(make_tensor(d_src.get(), DType::kBF16, {kRows, 576}, {kPitch, 1}),
                                    make_tensor(d_q.get(), DType::kUInt8, {kRows, 656}), nullptr);
  ASSERT_TRUE(s) << s.to_string();
  s = dequantize_mla_cache_fp8(make_tensor(d_q.get(), DType::kUInt8, {kRows, 656}),
                               make_tensor(d_back.get(), DType::kBF16, {kRows, 576}), nullptr);
  ASSERT_TRUE(s) << s.to_string();
  MLAKIT_ASSERT_CUDA(cudaDeviceSynchronize());
  EXPECT_EQ(d_q.download<uint8_t>(), cpu_q);
  EXPECT_EQ(d_back.download<uint16_t>(), cpu_back);
}

TEST(Fp8CacheGpu, AppendMatchesTheCpuAndLeavesOtherSlots) {
  MLAKIT_SKIP_WITHOUT_GPU();
  constexpr int64_t kBlocks = 9, kPage = 53, kTokens = 300;
  const std::vector<uint16_t> tokens = rows_of_bf16(kTokens, 576, 4);
  std::vector<int32_t> slots(kTokens);
  std::mt19937_64 rng(5);
  std::vector<int32_t> all(kBlocks * kPage);
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int32_t>(i);
  std::shuffle(all.begin(), all.end(), rng);
  for (int64_t i = 0; i < kTokens; ++i) slots[i] = i % 10 == 0 ? -1 : (i % 13 == 0 ? 1 << 28 : all[i]);
  std::vector<uint8_t> cache(kBlocks * kPage * 656, 0x5A);
  DeviceBuffer d_tokens(tokens), d_slots(slots), d_cache(cache);
  ASSERT_TRUE(reference::append_mla_cache_fp8(make_tensor(const_cast<uint16_t*>(tokens.data()), DType::kBF16, {kTokens, 576}),
                                              make_tensor(slots.data(), DType::kInt32, {kTokens}),
                                              make_tensor(cache.data(), DType::kUInt8, {kBlocks, kPage, 1, 656})));
  Status s = append_mla_cache_fp8(make_tensor(d_tokens.get(), DType::kBF16, {kTokens, 576}),
                                  make_tensor(d_slots.get(), DType::kInt32, {kTokens}),
                                  make_tensor(d_cache.get(), DType::kUInt8, {kBlocks, kPage, 1, 656}), nullptr);
  ASSERT_TRUE(s) << s.to_string();
  MLAKIT_ASSERT_CUDA(cudaDeviceSynchronize());
  EXPECT_EQ(d_cache.download<uint8_t>(), cache);
}

TEST(Fp8CacheGpu, HostPointersAreRejected) {
  MLAKIT_SKIP_WITHOUT_GPU();
  std::vector<uint16_t> src(576);
  DeviceBuffer d_q(656);
  Status s = quantize_mla_cache_fp8(make_tensor(src.data(), DType::kBF16, {576}),
                                    make_tensor(d_q.get(), DType::kUInt8, {656}), nullptr);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  EXPECT_NE(s.message().find("src: expected device memory"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace mlakit::testing
