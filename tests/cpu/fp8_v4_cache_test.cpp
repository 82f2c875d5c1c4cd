// CPU tests of the DeepSeek V4 FP8 cache tools (docs/contract.md, "DeepSeek V4 FP8 cache"):
// the scale rule on hand-made tiles, the layout checked against the test's own byte arithmetic,
// round-trip error bounds, dequantization of hand-written bytes, the unused scale byte and the
// padding between blocks, the paged append, page sizes with padded strides, validation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "common/fp8_e4m3.h"
#include "cpu_test_util.h"
#include "mlakit/fp8_cache.h"
#include "reference/host_numeric.h"
#include "support/fp8_v4_cache_case.h"

namespace mlakit {
namespace {

using detail::e4m3_to_float;
using detail::float_to_e4m3;
using support::kV4TestDqk;
using support::kV4TestRecordBytes;
using support::kV4TestTokenBytes;
using support::v4_padded_block_stride;
using testing::IsInvalid;

constexpr uint8_t kSentinel = 0xA5;

// A V4 cache in host memory: blocks `stride` bytes apart, filled with kSentinel.
struct HostCache {
  int64_t blocks, page, stride;
  std::vector<uint8_t> bytes;
  HostCache(int64_t num_blocks, int64_t page_size, int64_t block_stride)
      : blocks(num_blocks), page(page_size), stride(block_stride), bytes(num_blocks * block_stride, kSentinel) {}
  HostCache(int64_t num_blocks, int64_t page_size)
      : HostCache(num_blocks, page_size, v4_padded_block_stride(page_size)) {}
  TensorRef ref() {
    return make_tensor(bytes.data(), DType::kUInt8, {blocks, page, 1, kV4TestTokenBytes},
                       {stride, kV4TestTokenBytes, kV4TestTokenBytes, 1});
  }
  // The test's own layout arithmetic (not the library's helpers).
  int64_t record(int64_t slot) const { return (slot / page) * stride + (slot % page) * kV4TestRecordBytes; }
  int64_t scales(int64_t slot) const { return (slot / page) * stride + page * kV4TestRecordBytes + (slot % page) * 8; }
};

TensorRef tokens_ref(std::vector<uint16_t>& v, int64_t blocks, int64_t page, int64_t pitch) {
  return make_tensor(v.data(), DType::kBF16, {blocks, page, 1, kV4TestDqk}, {page * pitch, pitch, pitch, 1});
}

// The scale exponent the contract gives a tile of largest magnitude `amax` (NaN already
// skipped): ceil(log2(max(amax / 448, 1e-4))), clamped to [-13, 127], from frexp in double.
int expected_exponent(double amax) {
  if (std::isinf(amax)) return 127;
  if (amax == 0.0) return -13;
  int p = 0;
  const double f = std::frexp(amax / 448.0, &p);  // amax / 448 = f * 2^p, f in [0.5, 1)
  return std::clamp(f == 0.5 ? p - 1 : p, -13, 127);
}

// Token `x`'s record and scale record as the contract defines them, byte for byte.
void expect_token(const uint16_t* x, const uint8_t* record, const uint8_t* scales, const std::string& where) {
  for (int tile = 0; tile < 7; ++tile) {
    double amax = 0.0;
    for (int i = 0; i < 64; ++i) {
      const double v = std::fabs(host::bf16_to_float(x[tile * 64 + i]));
      if (!std::isnan(v)) amax = std::max(amax, v);
    }
    const int e = expected_exponent(amax);
    ASSERT_EQ(scales[tile], e + 127) << where << " tile " << tile << " amax " << amax;
    for (int i = 0; i < 64; ++i) {
      const int j = tile * 64 + i;
      ASSERT_EQ(record[j], float_to_e4m3(std::ldexp(host::bf16_to_float(x[j]), -e))) << where << " value " << j;
    }
  }
  ASSERT_EQ(scales[7], 0) << where << ": the unused scale byte";
  ASSERT_EQ(0, std::memcmp(record + 448, x + 448, 128)) << where << ": RoPE bytes";
}

// bf16 bits of e4m3 code `v` times 2^(byte - 127) (exact in bf16 unless it overflows); a NaN
// code or scale (0xFF) gives the one NaN pattern 0x7fc0.
uint16_t expected_dequantized(uint8_t v, uint8_t byte) {
  if (byte == 0xFF || (v & 0x7F) == 0x7F) return 0x7fc0;
  return host::float_to_bf16(static_cast<float>(std::ldexp(static_cast<double>(e4m3_to_float(v)), byte - 127)));
}

// Quantizes one token whose tiles are set by `tile_values(tile, x)` and returns its bytes.
struct OneToken {
  std::vector<uint16_t> x = std::vector<uint16_t>(512, 0);
  HostCache cache{1, 1};
  const uint8_t* record() const { return cache.bytes.data(); }
  const uint8_t* scales() const { return cache.bytes.data() + 576; }
  void quantize() { ASSERT_TRUE(reference::quantize_mla_cache_fp8_v4(tokens_ref(x, 1, 1, 512), cache.ref())); }
};

TEST(Fp8V4Cache, ScaleIsThePowerOfTwoAtOrAboveAmaxOver448) {
  for (int k : {-12, -5, 0, 1, 3, 20, 119}) {
    OneToken t;
    const uint16_t edge = host::float_to_bf16(std::ldexp(448.f, k));
    ASSERT_EQ(host::bf16_to_float(edge), std::ldexp(448.f, k)) << "448 * 2^k is a bf16";
    t.x[3] = edge;                                        // tile 0: amax exactly 448 * 2^k
    t.x[64 + 9] = static_cast<uint16_t>(edge + 1);        // tile 1: the bf16 just above
    t.x[128 + 5] = static_cast<uint16_t>(edge | 0x8000);  // tile 2: -448 * 2^k
    t.x[128 + 6] = host::float_to_bf16(std::ldexp(1.f, k));
    t.quantize();
    EXPECT_EQ(t.scales()[0], 127 + k) << "k " << k;
    EXPECT_EQ(t.scales()[1], 127 + k + 1) << "k " << k;
    EXPECT_EQ(t.scales()[2], 127 + k) << "k " << k;
    EXPECT_EQ(t.record()[3], 0x7E) << "the largest value stores 448";
    EXPECT_EQ(t.record()[128 + 5], 0xFE) << "-448";
    EXPECT_EQ(t.record()[128 + 6], 0x38) << "2^k over the scale 2^k: 1";
    for (int tile = 3; tile < 7; ++tile) EXPECT_EQ(t.scales()[tile], 114) << "all-zero tile: 2^-13";
  }
}

TEST(Fp8V4Cache, TinyZeroInfiniteAndNanTiles) {
  OneToken t;
  t.x[0] = host::float_to_bf16(1e-10f);                           // tile 0: tiny amax -> 2^-13
  t.x[64] = host::float_to_bf16(std::ldexp(448.f, -13));          // tile 1: exactly 448 * 2^-13 -> 2^-13
  t.x[128] = host::float_to_bf16(std::ldexp(448.f, -14) * 1.5f);  // tile 2: ratio 1.5 * 2^-14 < 1e-4: clamped
  t.x[192] = 0x7f80;                                              // tile 3: +inf -> 2^127
  t.x[193] = host::float_to_bf16(1.f);
  t.x[256] = 0xff80;  // tile 4: -inf
  t.x[320] = 0x7fc0;  // tile 5: NaN ignored by the max
  t.x[321] = host::float_to_bf16(-3.5f);
  t.quantize();  // tile 6: all zero
  const uint8_t want[8] = {114, 114, 114, 254, 254, static_cast<uint8_t>(127 + expected_exponent(3.5)), 114, 0};
  EXPECT_EQ(0, std::memcmp(t.scales(), want, 8));
  EXPECT_EQ(t.record()[192], 0x7E) << "+inf saturates to 448";
  EXPECT_EQ(t.record()[193], 0x00) << "1 / 2^127 rounds to 0";
  EXPECT_EQ(t.record()[256], 0xFE);
  EXPECT_EQ(t.record()[320], 0x7F) << "NaN stays NaN";
  EXPECT_EQ(t.record()[321], 0xFE) << "-3.5 is the tile's largest magnitude";
  EXPECT_EQ(t.record()[0], float_to_e4m3(std::ldexp(1e-10f, 13)));
  for (int i = 384; i < 448; ++i) ASSERT_EQ(t.record()[i], 0);
}

TEST(Fp8V4Cache, RoundTripWithinHalfAnE4m3UlpOfTheTileScale) {
  constexpr int64_t kBlocks = 4, kPage = 16;
  std::vector<uint16_t> x = support::v4_random_tokens(kBlocks * kPage, 512, 7, /*specials=*/false);
  HostCache cache(kBlocks, kPage);
  std::vector<uint16_t> back(kBlocks * kPage * 512, 0xFFFF);
  ASSERT_TRUE(reference::quantize_mla_cache_fp8_v4(tokens_ref(x, kBlocks, kPage, 512), cache.ref()));
  ASSERT_TRUE(reference::dequantize_mla_cache_fp8_v4(cache.ref(), tokens_ref(back, kBlocks, kPage, 512)));
  for (int64_t t = 0; t < kBlocks * kPage; ++t) {
    for (int j = 0; j < 448; ++j) {
      const double xv = host::bf16_to_float(x[t * 512 + j]), dv = host::bf16_to_float(back[t * 512 + j]);
      const double scale = std::ldexp(1.0, cache.bytes[cache.scales(t) + j / 64] - 127);
      // e4m3 rounding of x / scale: 2^-4 relative among normals, 2^-10 absolute among subnormals
      // (x / scale <= 448: no saturation); the bf16 result of a code times 2^k is exact.
      const double bound = std::max(std::fabs(xv) * 0.0625, scale * 0.0009765625);
      ASSERT_LE(std::fabs(dv - xv), bound) << "token " << t << " value " << j << ": " << xv << " -> " << dv;
    }
    ASSERT_EQ(0, std::memcmp(&back[t * 512 + 448], &x[t * 512 + 448], 128)) << "RoPE of token " << t;
  }
}

TEST(Fp8V4Cache, DequantizesHandWrittenBytes) {
  HostCache cache(1, 2);
  const uint8_t scale_bytes[2][8] = {{114, 127, 0, 1, 140, 254, 0xFF, 0x33}, {200, 60, 126, 128, 127, 100, 150, 0}};
  for (int t = 0; t < 2; ++t) {
    for (int j = 0; j < 576; ++j) cache.bytes[cache.record(t) + j] = static_cast<uint8_t>(t == 0 ? j : j * 7 + 3);
    std::memcpy(&cache.bytes[cache.scales(t)], scale_bytes[t], 8);
  }
  std::vector<uint16_t> out(2 * 512, 0x1234);
  ASSERT_TRUE(reference::dequantize_mla_cache_fp8_v4(cache.ref(), tokens_ref(out, 1, 2, 512)));
  for (int t = 0; t < 2; ++t) {
    for (int j = 0; j < 448; ++j) {
      const uint16_t want = expected_dequantized(cache.bytes[cache.record(t) + j], scale_bytes[t][j / 64]);
      ASSERT_EQ(out[t * 512 + j], want) << "token " << t << " value " << j;
    }
    ASSERT_EQ(0, std::memcmp(&out[t * 512 + 448], &cache.bytes[cache.record(t) + 448], 128)) << "RoPE " << t;
  }
  EXPECT_EQ(out[0], 0) << "code 0";
  EXPECT_EQ(host::bf16_to_float(out[512 + 448 - 1]),
            std::ldexp(e4m3_to_float(static_cast<uint8_t>(447 * 7 + 3)), 150 - 127));
}

// Every page size: the layout byte for byte, the padding and the unused scale byte, the
// round trip, with a padded token pitch and both ranks of the bf16 side.
TEST(Fp8V4Cache, PageSizesWithPaddedBlocks) {
  for (int64_t page : {1, 2, 61, 64, 69, 576}) {
    const int64_t blocks = page == 576 ? 2 : 3, n = blocks * page, pitch = 512 + 8 * (page % 3);
    std::vector<uint16_t> x = support::v4_random_tokens(n, pitch, 100 + page);
    HostCache cache(blocks, page);
    const TensorRef src =
        page % 2 == 0 ? tokens_ref(x, blocks, page, pitch)
                      : make_tensor(x.data(), DType::kBF16, {blocks, page, kV4TestDqk}, {page * pitch, pitch, 1});
    ASSERT_TRUE(reference::quantize_mla_cache_fp8_v4(src, cache.ref())) << "page " << page;
    for (int64_t t = 0; t < n; ++t) {
      expect_token(&x[t * pitch], &cache.bytes[cache.record(t)], &cache.bytes[cache.scales(t)],
                   "page " + std::to_string(page) + " token " + std::to_string(t));
    }
    for (int64_t b = 0; b < blocks; ++b) {
      for (int64_t i = page * kV4TestTokenBytes; i < cache.stride; ++i) {
        ASSERT_EQ(cache.bytes[b * cache.stride + i], kSentinel) << "page " << page << ": padding of block " << b;
      }
    }
    std::vector<uint16_t> back(n * 512, 0xFFFF);
    ASSERT_TRUE(reference::dequantize_mla_cache_fp8_v4(cache.ref(), tokens_ref(back, blocks, page, 512)));
    for (int64_t t = 0; t < n; ++t) {
      const uint8_t* scales = &cache.bytes[cache.scales(t)];
      for (int j = 0; j < 448; ++j) {
        ASSERT_EQ(back[t * 512 + j], expected_dequantized(cache.bytes[cache.record(t) + j], scales[j / 64]))
            << "page " << page << " token " << t << " value " << j;
      }
      ASSERT_EQ(0, std::memcmp(&back[t * 512 + 448], &x[t * pitch + 448], 128)) << "page " << page << " RoPE " << t;
    }
  }
}

TEST(Fp8V4Cache, AppendWritesOnlyTheListedSlots) {
  constexpr int64_t kBlocks = 3, kPage = 5, kTokens = 8;
  std::vector<uint16_t> tokens = support::v4_random_tokens(kTokens, 512, 12);
  std::vector<int32_t> slots = {7, -1, 14, 0, 15, 3, INT32_MAX, -5};  // 15 = num_blocks * page_size: skipped
  HostCache cache(kBlocks, kPage);
  ASSERT_TRUE(reference::append_mla_cache_fp8_v4(make_tensor(tokens.data(), DType::kBF16, {kTokens, kV4TestDqk}),
                                                 make_tensor(slots.data(), DType::kInt32, {kTokens}), cache.ref()));
  std::vector<bool> written(cache.bytes.size(), false);
  for (int64_t i = 0; i < kTokens; ++i) {
    if (slots[i] < 0 || slots[i] >= kBlocks * kPage) continue;
    expect_token(&tokens[i * 512], &cache.bytes[cache.record(slots[i])], &cache.bytes[cache.scales(slots[i])],
                 "token " + std::to_string(i));
    std::fill_n(written.begin() + cache.record(slots[i]), 576, true);
    std::fill_n(written.begin() + cache.scales(slots[i]), 8, true);
  }
  for (size_t i = 0; i < cache.bytes.size(); ++i) {
    if (!written[i]) ASSERT_EQ(cache.bytes[i], kSentinel) << "byte " << i << " written";
  }
}

TEST(Fp8V4Cache, EmptyInputsAreTheValidEmptyResult) {
  std::vector<uint16_t> none(16);
  std::vector<int32_t> no_slots(4);
  HostCache cache(2, 4);
  const std::vector<uint8_t> before = cache.bytes;
  EXPECT_TRUE(reference::quantize_mla_cache_fp8_v4(make_tensor(none.data(), DType::kBF16, {0, 4, 1, 512}),
                                                   make_tensor(cache.bytes.data(), DType::kUInt8, {0, 4, 1, 584})));
  EXPECT_TRUE(reference::dequantize_mla_cache_fp8_v4(make_tensor(cache.bytes.data(), DType::kUInt8, {0, 4, 1, 584}),
                                                     make_tensor(none.data(), DType::kBF16, {0, 4, 512})));
  EXPECT_TRUE(reference::append_mla_cache_fp8_v4(make_tensor(none.data(), DType::kBF16, {0, 512}),
                                                 make_tensor(no_slots.data(), DType::kInt32, {0}), cache.ref()));
  EXPECT_EQ(cache.bytes, before);
}

TEST(Fp8V4Cache, ValidationErrorsNameTheArgument) {
  std::vector<uint16_t> bf(2 * 4 * 640 + 64);
  std::vector<int32_t> slots(8);
  HostCache c(2, 4);
  const TensorRef cache = c.ref();
  const TensorRef src = tokens_ref(bf, 2, 4, 512);
  auto quantize = [](const TensorRef& s, const TensorRef& d) { return reference::quantize_mla_cache_fp8_v4(s, d); };
  auto dequantize = [](const TensorRef& s, const TensorRef& d) { return reference::dequantize_mla_cache_fp8_v4(s, d); };
  auto cache_with = [&](std::initializer_list<int64_t> shape, std::initializer_list<int64_t> stride, int64_t offset = 0,
                        DType dtype = DType::kUInt8) {
    return make_tensor(c.bytes.data() + offset, dtype, shape, stride);
  };
  const int64_t s0 = c.stride;

  EXPECT_TRUE(
      IsInvalid(quantize(make_tensor(bf.data(), DType::kFP16, {2, 4, 1, 512}), cache), {"src.dtype", "bf16", "fp16"}));
  EXPECT_TRUE(IsInvalid(quantize(make_tensor(bf.data(), DType::kBF16, {8, 512}), cache),
                        {"src: expected rank 4", "got rank 2"}));
  EXPECT_TRUE(IsInvalid(quantize(make_tensor(bf.data(), DType::kBF16, {2, 4, 1, 576}), cache),
                        {"src.shape[3] (d_qk)", "expected 512", "got 576"}));
  EXPECT_TRUE(IsInvalid(quantize(make_tensor(bf.data(), DType::kBF16, {2, 4, 2, 512}), cache),
                        {"src.shape[2] (h_kv)", "expected 1"}));
  EXPECT_TRUE(IsInvalid(quantize(make_tensor(bf.data(), DType::kBF16, {2, 4, 512}, {2048, 516, 1}), cache),
                        {"src.stride[1]", "multiple of 8"}));
  EXPECT_TRUE(IsInvalid(quantize(make_tensor(bf.data() + 4, DType::kBF16, {2, 4, 512}), cache),
                        {"src: expected a 16-byte aligned pointer"}));
  EXPECT_TRUE(IsInvalid(quantize(make_tensor(bf.data(), DType::kBF16, {2, 4, 512}, {2048, 512, 2}), cache),
                        {"src.stride[2]", "expected 1"}));
  EXPECT_TRUE(
      IsInvalid(quantize(src, cache_with({2, 4, 1, 584}, {s0, 584, 584, 1}, 0, DType::kFP32)), {"dst.dtype", "uint8"}));
  EXPECT_TRUE(IsInvalid(quantize(src, cache_with({2, 4, 584}, {s0, 584, 1})), {"dst: expected rank 4", "got rank 3"}));
  EXPECT_TRUE(IsInvalid(quantize(src, cache_with({2, 4, 1, 656}, {s0, 656, 656, 1})),
                        {"dst.shape[3] (bytes per token)", "expected 584", "got 656"}));
  EXPECT_TRUE(IsInvalid(quantize(src, cache_with({2, 4, 1, 584}, {s0, 592, 592, 1})),
                        {"dst.stride[1]", "expected 584", "got 592"}));
  EXPECT_TRUE(IsInvalid(quantize(src, cache_with({2, 4, 1, 584}, {4 * 584 - 16, 584, 584, 1})),
                        {"dst.stride[0]", "expected >= page_size * 584 = 2336", "got 2320"}));
  EXPECT_TRUE(
      IsInvalid(quantize(src, cache_with({2, 4, 1, 584}, {s0 + 8, 584, 584, 1})), {"dst.stride[0]", "multiple of 16"}));
  EXPECT_TRUE(IsInvalid(quantize(src, cache_with({1, 4, 1, 584}, {s0, 584, 584, 1}, 8)),
                        {"dst: expected a 16-byte aligned pointer"}));
  EXPECT_TRUE(IsInvalid(quantize(src, cache_with({3, 4, 1, 584}, {s0, 584, 584, 1})),
                        {"dst.shape[0] (num_blocks)", "expected 2", "got 3"}));
  EXPECT_TRUE(IsInvalid(quantize(src, cache_with({2, 2, 1, 584}, {s0, 584, 584, 1})),
                        {"dst.shape[1] (page_size)", "expected 4", "got 2"}));
  // The output over the input's bytes.
  EXPECT_TRUE(IsInvalid(
      quantize(make_tensor(c.bytes.data(), DType::kBF16, {1, 1, 512}), cache_with({1, 1, 1, 584}, {584, 584, 584, 1})),
      {"dst: expected memory disjoint from src"}));

  EXPECT_TRUE(
      IsInvalid(dequantize(cache_with({2, 4, 1, 584}, {s0, 600, 600, 1}), src), {"src.stride[1]", "expected 584"}));
  EXPECT_TRUE(IsInvalid(dequantize(cache, make_tensor(bf.data(), DType::kFP32, {2, 4, 512})), {"dst.dtype", "bf16"}));
  EXPECT_TRUE(IsInvalid(dequantize(cache, make_tensor(bf.data(), DType::kBF16, {2, 5, 512})),
                        {"dst.shape[1] (page_size)", "expected 4", "got 5"}));
  EXPECT_TRUE(IsInvalid(dequantize(cache, make_tensor(bf.data(), DType::kBF16, {2, 4, 1, 1, 512})),
                        {"dst: expected rank 4", "got rank 5"}));

  const TensorRef tokens = make_tensor(bf.data(), DType::kBF16, {4, 512});
  auto append = [&](const TensorRef& t, const TensorRef& s, const TensorRef& k) {
    return reference::append_mla_cache_fp8_v4(t, s, k);
  };
  EXPECT_TRUE(IsInvalid(append(tokens, make_tensor(slots.data(), DType::kInt32, {3}), cache),
                        {"slots.shape[0] (n)", "expected 4", "got 3"}));
  EXPECT_TRUE(IsInvalid(append(tokens, make_tensor(slots.data(), DType::kFP32, {4}), cache),
                        {"slots.dtype", "int32", "float32"}));
  EXPECT_TRUE(IsInvalid(
      append(make_tensor(bf.data(), DType::kBF16, {4, 576}), make_tensor(slots.data(), DType::kInt32, {4}), cache),
      {"tokens.shape[1]", "expected 512", "got 576"}));
  EXPECT_TRUE(IsInvalid(
      append(make_tensor(bf.data(), DType::kBF16, {1, 4, 512}), make_tensor(slots.data(), DType::kInt32, {1}), cache),
      {"tokens: expected rank 2"}));
  EXPECT_TRUE(IsInvalid(append(tokens, make_tensor(slots.data(), DType::kInt32, {4}),
                               cache_with({2, 4, 1, 584}, {s0, 584, 584, 1}, 0, DType::kBF16)),
                        {"cache.dtype"}));
  EXPECT_TRUE(IsInvalid(
      append(tokens, make_tensor(slots.data(), DType::kInt32, {4}), cache_with({2, 0, 1, 584}, {s0, 584, 584, 1})),
      {"cache.shape[1] (page_block_size)", "got 0"}));
  EXPECT_TRUE(IsInvalid(append(make_tensor(c.bytes.data() + 1168, DType::kBF16, {1, 512}),
                               make_tensor(slots.data(), DType::kInt32, {1}), cache),
                        {"cache: expected memory disjoint from tokens"}));

  // The GPU entry points validate first, with the same messages under their own names.
  const Status gpu = quantize_mla_cache_fp8_v4(make_tensor(bf.data(), DType::kBF16, {2, 4, 1, 500}), cache, nullptr);
  EXPECT_TRUE(IsInvalid(gpu, {"quantize_mla_cache_fp8_v4: src.shape[3] (d_qk)", "expected 512"})) << gpu.to_string();
}

}  // namespace
}  // namespace mlakit
