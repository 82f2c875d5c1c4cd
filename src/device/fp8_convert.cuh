// FP8 e4m3 -> bf16 dequantization on the device with the hardware conversions, bit-identical
// to the reference's fp8_dequantize (common/fp8_cache_row.h): e4m3 -> f16 and f16 -> f32 are
// exact, the product with the scale is one f32 rounding, f32 -> bf16 rounds to nearest even.
// (A stored NaN byte gives a NaN of another payload; the quantizer never stores one.)
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>

namespace mlakit::device {

// Two e4m3 values (low byte = first) times `scale`, as a bf16x2 word (first value low).
__device__ __forceinline__ uint32_t dequantize_e4m3x2_bf16(uint16_t pair, float scale) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(pair), __NV_E4M3);
  const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
  const __nv_bfloat162 b = __floats2bfloat162_rn(f.x * scale, f.y * scale);
  return *reinterpret_cast<const uint32_t*>(&b);
}

// Eight e4m3 values (two little-endian words) times `scale`: one 16-byte chunk of bf16.
__device__ __forceinline__ uint4 dequantize_e4m3x8_bf16(uint2 raw, float scale) {
  return make_uint4(dequantize_e4m3x2_bf16(static_cast<uint16_t>(raw.x), scale),
                    dequantize_e4m3x2_bf16(static_cast<uint16_t>(raw.x >> 16), scale),
                    dequantize_e4m3x2_bf16(static_cast<uint16_t>(raw.y), scale),
                    dequantize_e4m3x2_bf16(static_cast<uint16_t>(raw.y >> 16), scale));
}

}  // namespace mlakit::device
