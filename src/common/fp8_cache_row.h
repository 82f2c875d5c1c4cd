// One token of the FP8-with-scale MLA cache format, quantized or dequantized: the per-row
// arithmetic shared by the CPU reference and the GPU kernels (so both are bit-identical).
#pragma once

#include <cstdint>

#include "common/fp8_e4m3.h"
#include "common/host_device.h"

namespace mlakit::detail {

inline constexpr int kFp8NopeDim = 512;
inline constexpr int kFp8RopeDim = 64;
inline constexpr int kFp8Tile = 128;
inline constexpr int kFp8Tiles = kFp8NopeDim / kFp8Tile;
inline constexpr int kFp8ScaleOffset = kFp8NopeDim;                      // 4 float32
inline constexpr int kFp8RopeOffset = kFp8ScaleOffset + 4 * kFp8Tiles;   // 64 bf16
inline constexpr int kFp8TokenBytes = kFp8RopeOffset + 2 * kFp8RopeDim;  // 656
static_assert(kFp8TokenBytes == 656, "the FP8 token format of docs/contract.md");

MLAKIT_HD float bf16_bits_to_float(uint16_t h) { return bits_float(static_cast<uint32_t>(h) << 16); }
MLAKIT_HD uint16_t float_to_bf16_bits(float f) {
  uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// Scale of a tile from its largest magnitude: max|x| / 448 (0 for an all-zero tile).
MLAKIT_HD float fp8_tile_scale(float amax) { return amax / 448.0f; }

// One quantized value: e4m3(x / scale), 0 when the tile is all zero.
MLAKIT_HD uint8_t fp8_quantize(float x, float scale) { return scale == 0.0f ? 0 : float_to_e4m3(x / scale); }

// One dequantized value, as bf16 bits: float(stored) * scale rounded to bf16.
MLAKIT_HD uint16_t fp8_dequantize(uint8_t v, float scale) { return float_to_bf16_bits(e4m3_to_float(v) * scale); }

}  // namespace mlakit::detail
