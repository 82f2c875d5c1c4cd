// CPU tests of the FP8 MLA cache format (docs/contract.md): e4m3 conversion bit patterns,
// quantize / dequantize round trips, the 656-byte layout, the paged append, validation.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "common/fp8_cache_row.h"
#include "common/fp8_e4m3.h"
#include "cpu_test_util.h"
#include "mlakit/fp8_cache.h"
#include "reference/host_numeric.h"

namespace mlakit {
namespace {

using detail::e4m3_to_float;
using detail::float_to_e4m3;

TEST(E4m3, KnownBitPatterns) {
  EXPECT_EQ(float_to_e4m3(0.f), 0x00);
  EXPECT_EQ(float_to_e4m3(-0.f), 0x80);
  EXPECT_EQ(float_to_e4m3(1.f), 0x38);
  EXPECT_EQ(float_to_e4m3(-2.f), 0xC0);
  EXPECT_EQ(float_to_e4m3(448.f), 0x7E);
  EXPECT_EQ(float_to_e4m3(-448.f), 0xFE);
  EXPECT_EQ(float_to_e4m3(0.015625f), 0x08);       // 2^-6, smallest normal
  EXPECT_EQ(float_to_e4m3(0.001953125f), 0x01);    // 2^-9, smallest subnormal
  EXPECT_EQ(float_to_e4m3(0.013671875f), 0x07);    // 7 x 2^-9, largest subnormal
  EXPECT_EQ(float_to_e4m3(1.0625f), 0x38);         // tie between 1.0 (even) and 1.125
  EXPECT_EQ(float_to_e4m3(1.1875f), 0x3A);         // tie between 1.125 and 1.25 (even)
  EXPECT_EQ(float_to_e4m3(0.0009765625f), 0x00);   // 2^-10: tie between 0 (even) and 2^-9
  EXPECT_EQ(float_to_e4m3(0.0029296875f), 0x02);   // 1.5 x 2^-9: tie to 2 x 2^-9
  EXPECT_EQ(float_to_e4m3(1e-30f), 0x00);
}

TEST(E4m3, SaturatesAndKeepsNan) {
  for (float big : {449.f, 464.f, 500.f, 1e30f, INFINITY}) {
    EXPECT_EQ(float_to_e4m3(big), 0x7E) << big;
    EXPECT_EQ(float_to_e4m3(-big), 0xFE) << big;
  }
  EXPECT_EQ(float_to_e4m3(NAN), 0x7F);
  EXPECT_TRUE(std::isnan(e4m3_to_float(0x7F)));
  EXPECT_TRUE(std::isnan(e4m3_to_float(0xFF)));
}

TEST(E4m3, EveryFiniteCodeRoundTripsAndMidpointsRoundToEven) {
  std::vector<float> positives;
  for (int c = 0; c < 0x7F; ++c) {
    const float v = e4m3_to_float(static_cast<uint8_t>(c));
    ASSERT_EQ(float_to_e4m3(v), c) << "code " << c;
    ASSERT_EQ(float_to_e4m3(-v), c | 0x80) << "code " << c;
    positives.push_back(v);
  }
  for (int c = 0; c + 1 < 0x7F; ++c) {
    ASSERT_LT(positives[c], positives[c + 1]);
    const float mid = 0.5f * (positives[c] + positives[c + 1]);
    const int even = (c % 2 == 0) ? c : c + 1;
    EXPECT_EQ(float_to_e4m3(mid), even) << "between codes " << c << " and " << c + 1;
    EXPECT_EQ(float_to_e4m3(std::nextafter(mid, 0.f)), c);
    EXPECT_EQ(float_to_e4m3(std::nextafter(mid, 1e9f)), c + 1);
  }
}

// Random bf16 rows: normal values of several magnitudes, an all-zero tile, a tiny tile.
std::vector<uint16_t> random_rows(int64_t rows, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<uint16_t> v(rows * 576);
  for (int64_t r = 0; r < rows; ++r) {
    const float magnitude = std::pow(10.f, static_cast<float>(r % 7) - 3.f);
    for (int i = 0; i < 576; ++i) v[r * 576 + i] = host::float_to_bf16(normal(rng) * magnitude);
    if (r % 5 == 1) {
      for (int i = 128; i < 256; ++i) v[r * 576 + i] = 0;  // all-zero tile 1
    }
    if (r % 5 == 2) {
      for (int i = 384; i < 512; ++i) v[r * 576 + i] = host::float_to_bf16(normal(rng) * 1e-30f);
    }
  }
  return v;
}

float scale_of(const uint8_t* row, int tile) {
  float s;
  std::memcpy(&s, row + 512 + 4 * tile, 4);
  return s;
}

TEST(Fp8Cache, QuantizeLayoutScalesAndRoundTrip) {
  constexpr int64_t kRows = 40;
  const std::vector<uint16_t> src = random_rows(kRows, 11);
  std::vector<uint8_t> q(kRows * 656, 0xAB);
  std::vector<uint16_t> back(kRows * 576, 0xFFFF);
  ASSERT_TRUE(reference::quantize_mla_cache_fp8(make_tensor(const_cast<uint16_t*>(src.data()), DType::kBF16, {kRows, 576}),
                                                make_tensor(q.data(), DType::kUInt8, {kRows, 656})));
  ASSERT_TRUE(reference::dequantize_mla_cache_fp8(make_tensor(q.data(), DType::kUInt8, {kRows, 656}),
                                                  make_tensor(back.data(), DType::kBF16, {kRows, 576})));
  for (int64_t r = 0; r < kRows; ++r) {
    const uint16_t* x = &src[r * 576];
    const uint8_t* row = &q[r * 656];
    for (int tile = 0; tile < 4; ++tile) {
      float amax = 0.f;
      for (int i = 0; i < 128; ++i) amax = std::max(amax, std::fabs(host::bf16_to_float(x[tile * 128 + i])));
      const float scale = scale_of(row, tile);
      ASSERT_EQ(scale, amax / 448.0f) << "row " << r << " tile " << tile;
      for (int i = 0; i < 128; ++i) {
        const int e = tile * 128 + i;
        const float xv = host::bf16_to_float(x[e]), dv = host::bf16_to_float(back[r * 576 + e]);
        ASSERT_FALSE(std::isnan(dv)) << "row " << r << " element " << e;
        if (amax == 0.f) {
          ASSERT_EQ(row[e], 0);
          ASSERT_EQ(dv, 0.f);
          continue;
        }
        // e4m3: half an ulp is 2^-4 relative (normals) or 2^-10 x scale (subnormals);
        // the bf16 result adds 2^-9 relative.
        const float bound = std::fabs(xv) * (0.0625f + 0.00390625f) + scale * 0.0009765625f * 1.01f;
        ASSERT_LE(std::fabs(dv - xv), bound) << "row " << r << " element " << e << ": " << xv << " -> " << dv;
      }
    }
    ASSERT_EQ(0, std::memcmp(row + 528, x + 512, 128)) << "RoPE part of row " << r;
    ASSERT_EQ(0, std::memcmp(&back[r * 576 + 512], x + 512, 128)) << "RoPE part of row " << r;
  }
}

TEST(Fp8Cache, LargestValueOfATileMapsTo448) {
  std::vector<uint16_t> src(576, 0);
  src[5] = host::float_to_bf16(-3.5f);
  src[7] = host::float_to_bf16(1.25f);
  std::vector<uint8_t> q(656);
  ASSERT_TRUE(reference::quantize_mla_cache_fp8(make_tensor(src.data(), DType::kBF16, {576}),
                                                make_tensor(q.data(), DType::kUInt8, {656})));
  EXPECT_EQ(q[5], 0xFE);                    // -448
  EXPECT_EQ(scale_of(q.data(), 0), 3.5f / 448.0f);
  EXPECT_EQ(scale_of(q.data(), 1), 0.f);    // all-zero tiles
  EXPECT_EQ(q[7], float_to_e4m3(1.25f / (3.5f / 448.0f)));
}

TEST(Fp8Cache, AppendWritesOnlyValidSlots) {
  constexpr int64_t kBlocks = 3, kPage = 5, kTokens = 6;
  const std::vector<uint16_t> tokens = random_rows(kTokens, 12);
  const std::vector<int32_t> slots = {7, -1, 14, 0, 15, 3};  // 15 is past the cache: skipped
  std::vector<uint8_t> cache(kBlocks * kPage * 656, 0x5A);
  const std::vector<uint8_t> poisoned = cache;
  ASSERT_TRUE(reference::append_mla_cache_fp8(make_tensor(const_cast<uint16_t*>(tokens.data()), DType::kBF16, {kTokens, 576}),
                                              make_tensor(const_cast<int32_t*>(slots.data()), DType::kInt32, {kTokens}),
                                              make_tensor(cache.data(), DType::kUInt8, {kBlocks, kPage, 1, 656})));
  std::vector<bool> written(kBlocks * kPage, false);
  for (int64_t i = 0; i < kTokens; ++i) {
    if (slots[i] < 0 || slots[i] >= kBlocks * kPage) continue;
    written[slots[i]] = true;
    std::vector<uint8_t> expected(656);
    ASSERT_TRUE(reference::quantize_mla_cache_fp8(make_tensor(const_cast<uint16_t*>(&tokens[i * 576]), DType::kBF16, {576}),
                                                  make_tensor(expected.data(), DType::kUInt8, {656})));
    ASSERT_EQ(0, std::memcmp(&cache[slots[i] * 656], expected.data(), 656)) << "token " << i;
  }
  for (int64_t s = 0; s < kBlocks * kPage; ++s) {
    if (!written[s]) ASSERT_EQ(0, std::memcmp(&cache[s * 656], &poisoned[s * 656], 656)) << "slot " << s;
  }
}

TEST(Fp8Cache, ValidationErrors) {
  std::vector<uint16_t> bf(4 * 640);
  std::vector<uint8_t> u8(4 * 656);
  std::vector<int32_t> slots(4);
  using testing::IsInvalid;
  EXPECT_TRUE(IsInvalid(reference::quantize_mla_cache_fp8(make_tensor(bf.data(), DType::kBF16, {4, 512}),
                                                          make_tensor(u8.data(), DType::kUInt8, {4, 656})),
                        {"src.shape[1]", "expected 576", "got 512"}));
  EXPECT_TRUE(IsInvalid(reference::quantize_mla_cache_fp8(make_tensor(bf.data(), DType::kFP16, {4, 576}),
                                                          make_tensor(u8.data(), DType::kUInt8, {4, 656})),
                        {"src.dtype", "bf16", "fp16"}));
  EXPECT_TRUE(IsInvalid(reference::quantize_mla_cache_fp8(make_tensor(bf.data(), DType::kBF16, {4, 576}),
                                                          make_tensor(u8.data(), DType::kUInt8, {3, 656})),
                        {"dst.shape[0]", "expected 4", "got 3"}));
  EXPECT_TRUE(IsInvalid(
      reference::quantize_mla_cache_fp8(make_tensor(bf.data(), DType::kBF16, {2, 2, 576}, {2000, 640, 1}),
                                        make_tensor(u8.data(), DType::kUInt8, {2, 2, 656})),
      {"src.stride[0]", "collapsible", "expected 1280", "got 2000"}));
  EXPECT_TRUE(IsInvalid(reference::quantize_mla_cache_fp8(make_tensor(bf.data(), DType::kBF16, {2, 576}, {580, 1}),
                                                          make_tensor(u8.data(), DType::kUInt8, {2, 656})),
                        {"src.stride[0]", "multiple of 8"}));
  EXPECT_TRUE(IsInvalid(reference::dequantize_mla_cache_fp8(make_tensor(u8.data(), DType::kUInt8, {4, 655}),
                                                            make_tensor(bf.data(), DType::kBF16, {4, 576})),
                        {"src.shape[1]", "expected 656", "got 655"}));
  const TensorRef tokens = make_tensor(bf.data(), DType::kBF16, {4, 576});
  EXPECT_TRUE(IsInvalid(reference::append_mla_cache_fp8(tokens, make_tensor(slots.data(), DType::kInt32, {3}),
                                                        make_tensor(u8.data(), DType::kUInt8, {2, 2, 1, 656})),
                        {"slots.shape[0]", "expected 4", "got 3"}));
  EXPECT_TRUE(IsInvalid(reference::append_mla_cache_fp8(tokens, make_tensor(slots.data(), DType::kInt32, {4}),
                                                        make_tensor(u8.data(), DType::kUInt8, {1, 2, 2, 656})),
                        {"cache.shape[2] (h_kv)", "expected 1", "got 2"}));
  EXPECT_TRUE(IsInvalid(reference::append_mla_cache_fp8(tokens, make_tensor(slots.data(), DType::kInt32, {4}),
                                                        make_tensor(u8.data(), DType::kUInt8, {2, 2, 1, 576})),
                        {"cache.shape[3]", "expected 656", "got 576"}));
  EXPECT_TRUE(IsInvalid(reference::append_mla_cache_fp8(tokens, make_tensor(slots.data(), DType::kFP32, {4}),
                                                        make_tensor(u8.data(), DType::kUInt8, {2, 2, 1, 656})),
                        {"slots.dtype", "int32", "float32"}));
}

}  // namespace
}  // namespace mlakit
