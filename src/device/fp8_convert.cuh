// FP8 e4m3 -> bf16 dequantization on the device with the hardware conversions, bit-identical
// to the reference's fp8_dequantize (common/fp8_cache_row.h): e4m3 -> f16 and f16 -> f32 are
// exact, the product with the scale is one f32 rounding, f32 -> bf16 rounds to nearest even.
// (A stored NaN byte gives a NaN of another payload; the quantizer never stores one.)
// Per value: half an e4m3x2 unpack, an f16 -> f32 conversion, a multiply and half a pack
// (bench/dequant_rates.cu measures their rates).
#pragma once

#include <cuda_fp8.h>

#include <cstdint>

namespace mlakit::device {

// The two e4m3 values of the low (kHigh false) or high 16 bits of `word` times `scale`, as a
// bf16x2 word (the lower-addressed value low). The unpack reads the half in place (no shift).
template <bool kHigh>
__device__ __forceinline__ uint32_t dequantize_e4m3x2_bf16(uint32_t word, float scale) {
  uint32_t halves;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  if constexpr (kHigh) {
    asm("{ .reg .b16 lo, hi; mov.b32 {lo, hi}, %1; cvt.rn.f16x2.e4m3x2 %0, hi; }" : "=r"(halves) : "r"(word));
  } else {
    asm("{ .reg .b16 lo, hi; mov.b32 {lo, hi}, %1; cvt.rn.f16x2.e4m3x2 %0, lo; }" : "=r"(halves) : "r"(word));
  }
#else  // no e4m3 conversion instruction before sm_89: the library's software path, same values
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(
      static_cast<__nv_fp8x2_storage_t>(kHigh ? word >> 16 : word & 0xffffu), __NV_E4M3);
  halves = static_cast<uint32_t>(h.x) | (static_cast<uint32_t>(h.y) << 16);
#endif
  float first, second;
  asm("{ .reg .b16 lo, hi; mov.b32 {lo, hi}, %2; cvt.f32.f16 %0, lo; cvt.f32.f16 %1, hi; }"
      : "=f"(first), "=f"(second)
      : "r"(halves));
  uint32_t packed;
  // cvt.rn.bf16x2.f32 d, a, b puts a in the upper half.
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(packed) : "f"(second * scale), "f"(first * scale));
  return packed;
}

// Eight e4m3 values (two little-endian words) times `scale`: one 16-byte chunk of bf16.
__device__ __forceinline__ uint4 dequantize_e4m3x8_bf16(uint2 raw, float scale) {
  return make_uint4(dequantize_e4m3x2_bf16<false>(raw.x, scale), dequantize_e4m3x2_bf16<true>(raw.x, scale),
                    dequantize_e4m3x2_bf16<false>(raw.y, scale), dequantize_e4m3x2_bf16<true>(raw.y, scale));
}

}  // namespace mlakit::device
