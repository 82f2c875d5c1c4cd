// Inputs of the DeepSeek V4 FP8 cache tools' tests, CPU and GPU: bf16 tokens whose tiles are of
// every kind the scale rule tells apart, and FlashMLA's padded block stride.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "reference/host_numeric.h"

namespace mlakit::support {

inline constexpr int64_t kV4TestTokenBytes = 584, kV4TestRecordBytes = 576, kV4TestDqk = 512;

// FlashMLA's block stride: page_size * 584 bytes rounded up to a multiple of 576 (page 64: 37440).
inline int64_t v4_padded_block_stride(int64_t page_size) {
  return (page_size * kV4TestTokenBytes + kV4TestRecordBytes - 1) / kV4TestRecordBytes * kV4TestRecordBytes;
}

// n tokens of 512 bf16 values, `pitch` elements apart (the gap NaN: never to be read). Each
// 64-value NoPE tile is drawn from: normal values of magnitude 10^-30 .. 10^30, all zeros, one
// +-inf among normal values, NaNs among normal values (with `specials`), or a largest value at
// 448 * 2^k or the bf16 just above it. RoPE values are random bf16 bit patterns (NaN payloads
// included: copied, never converted).
inline std::vector<uint16_t> v4_random_tokens(int64_t n, int64_t pitch, uint64_t seed, bool specials = true) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::uniform_real_distribution<float> unit(-1.f, 1.f);
  std::uniform_int_distribution<int> kind(0, specials ? 5 : 2), exponent(-30, 30), k(-20, 20), bits(0, 0xffff);
  std::vector<uint16_t> v(n * pitch, 0x7fc0);
  for (int64_t t = 0; t < n; ++t) {
    uint16_t* x = &v[t * pitch];
    for (int tile = 0; tile < 7; ++tile) {
      uint16_t* y = x + 64 * tile;
      const int what = kind(rng);
      const float magnitude = std::pow(10.f, static_cast<float>(exponent(rng)));
      for (int i = 0; i < 64; ++i) y[i] = host::float_to_bf16(what == 1 ? 0.f : normal(rng) * magnitude);
      if (what == 2) {  // the largest value at a power-of-two boundary of the scale, or the bf16 above it
        const uint16_t above = static_cast<uint16_t>(rng() % 2);
        const uint16_t negative = rng() % 2 ? 0x8000 : 0;
        const uint16_t edge = host::float_to_bf16(std::ldexp(448.f, k(rng)));
        for (int i = 0; i < 64; ++i) y[i] = host::float_to_bf16(host::bf16_to_float(edge) * unit(rng));
        y[rng() % 64] = static_cast<uint16_t>((edge + above) | negative);
      } else if (what == 3) {
        y[rng() % 64] = rng() % 2 ? 0x7f80 : 0xff80;  // +-inf
      } else if (what == 4) {
        for (int i = 0; i < 3; ++i) y[rng() % 64] = 0x7fc0 | (rng() % 2 ? 0x8000 : 0);
      }
    }
    for (int i = 448; i < 512; ++i) x[i] = static_cast<uint16_t>(bits(rng));
  }
  return v;
}

}  // namespace mlakit::support
