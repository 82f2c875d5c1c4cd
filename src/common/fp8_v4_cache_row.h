// One token of DeepSeek V4's FP8 MLA cache (docs/contract.md, "DeepSeek V4 cache"): the
// per-value arithmetic and the byte addresses shared by the CPU reference, the cache tools and
// the decode kernels, so that all of them are bit-identical.
//
// A page block of page_size tokens holds, from its start:
//   page_size records of 576 bytes: 448 e4m3 NoPE values (7 tiles of 64), 64 bf16 RoPE values;
//   page_size records of 8 bytes:   7 UE8M0 tile scales (2^(byte - 127)), 1 unused byte.
// The block's stride (padded by the caller, FlashMLA pads to a multiple of 576) is free; a
// tensor view of the cache is [num_blocks, page_size, 1, 584] bytes whose dim-1 stride (584)
// is not an address step (v4_token_bytes below is).
#pragma once

#include <cstdint>

#include "common/fp8_cache_row.h"
#include "common/fp8_e4m3.h"
#include "common/host_device.h"

namespace mlakit::detail {

inline constexpr int kV4NopeDim = 448;
inline constexpr int kV4RopeDim = 64;
inline constexpr int kV4Dqk = kV4NopeDim + kV4RopeDim;                // 512 = d_v: V is the whole row
inline constexpr int kV4Tile = 64;
inline constexpr int kV4Tiles = kV4NopeDim / kV4Tile;                 // 7
inline constexpr int kV4RecordBytes = kV4NopeDim + 2 * kV4RopeDim;    // 576: NoPE bytes, then RoPE bf16
inline constexpr int kV4RopeOffset = kV4NopeDim;                      // within a record
inline constexpr int kV4ScaleRecordBytes = kV4Tiles + 1;              // 8: 7 scales, 1 unused byte
inline constexpr int kV4TokenBytes = kV4RecordBytes + kV4ScaleRecordBytes;  // 584
static_assert(kV4TokenBytes == 584 && kV4RecordBytes % 16 == 0, "the V4 cache layout of docs/contract.md");

// Smallest and largest scale exponents stored: the scale is at least 1e-4 before rounding
// (2^ceil(log2 1e-4) = 2^-13) and at most 2^127 (an infinite tile saturates there instead of
// storing the NaN byte 0xFF).
inline constexpr int kV4MinScaleExponent = -13;
inline constexpr int kV4MaxScaleExponent = 127;

// ceil(log2(x)) for a normal float x > 0, exactly (from the float's bits: no libm rounding,
// which can round log2 of a value just above a power of two down to the integer).
MLAKIT_HD int ceil_log2(float x) {
  const uint32_t u = float_bits(x);
  return static_cast<int>(u >> 23) - 127 + ((u & 0x7fffffu) != 0 ? 1 : 0);
}

// The UE8M0 byte of a tile's scale from its largest magnitude (NaN values ignored, as fmax
// does): 2^ceil(log2(max(amax / 448, 1e-4))), exponent clamped to [-13, 127].
MLAKIT_HD uint8_t v4_scale_byte(float amax) {
  const float ratio = amax / 448.0f;
  int e;
  if (!(ratio < 3.4e38f)) {
    e = kV4MaxScaleExponent;  // an infinite amax
  } else {
    e = ceil_log2(ratio > 1e-4f ? ratio : 1e-4f);
    e = e < kV4MinScaleExponent ? kV4MinScaleExponent : (e > kV4MaxScaleExponent ? kV4MaxScaleExponent : e);
  }
  return static_cast<uint8_t>(e + 127);
}

// The scale a UE8M0 byte stands for: 2^(byte - 127); 0xFF is NaN (float8_e8m0fnu).
MLAKIT_HD float ue8m0_to_float(uint8_t byte) {
  if (byte == 0xff) return bits_float(0x7fc00000u);
  if (byte == 0) return bits_float(0x00400000u);  // 2^-127, a float subnormal
  return bits_float(static_cast<uint32_t>(byte) << 23);
}

// One stored value: e4m3(x / scale) (division by a power of two: exact before the rounding).
MLAKIT_HD uint8_t v4_quantize(float x, float scale) { return float_to_e4m3(x / scale); }

// One dequantized value as bf16 bits: float(stored) * scale, exact in bf16 for every stored
// scale (3 mantissa bits times a power of two), so no rounding choice is involved. A NaN code
// or scale gives the one NaN pattern 0x7fc0 on the CPU and the GPU alike (a float NaN product
// keeps an operand's sign and payload on the CPU, is 0x7fffffff on the GPU).
MLAKIT_HD uint16_t v4_dequantize(uint8_t v, float scale) {
  const uint16_t h = float_to_bf16_bits(e4m3_to_float(v) * scale);
  return (h & 0x7fffu) > 0x7f80u ? uint16_t{0x7fc0} : h;
}

// Byte offsets, from the start of the block, of token `offset`'s record and scale record in a
// block of page_size tokens.
MLAKIT_HD int64_t v4_record_offset(int64_t offset) { return offset * kV4RecordBytes; }
MLAKIT_HD int64_t v4_scale_offset(int64_t page_size, int64_t offset) {
  return page_size * kV4RecordBytes + offset * kV4ScaleRecordBytes;
}

}  // namespace mlakit::detail
