// Stored int8 / fp8 e4m3 cache values to the 16-bit type of the mma, WITHOUT the scale: both
// formats are exact in bf16 and fp16 (|int8| <= 128 needs 8 significant bits; e4m3 has 4 and
// exponents 2^-9 .. 2^8), so the conversion loses nothing and the per-row scale is applied in
// float32 to the logit (keys) and to the softmax weight (values) instead.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

#include "device/numeric.cuh"

namespace mlakit::detail {

// Two e4m3 bytes (the low 16 bits of `pair`) as an f16x2 word, lower address in the low half.
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t pair) {
  uint32_t halves;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  asm("{ .reg .b16 lo, hi; mov.b32 {lo, hi}, %1; cvt.rn.f16x2.e4m3x2 %0, lo; }" : "=r"(halves) : "r"(pair));
#else  // no e4m3 conversion instruction before sm_89: the library's software path, same values
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(pair & 0xffffu), __NV_E4M3);
  halves = static_cast<uint32_t>(h.x) | (static_cast<uint32_t>(h.y) << 16);
#endif
  return halves;
}

// Two fp16 numbers 1024 + (x + 128) (int8 x, see below) minus 1152: x, exactly.
__device__ __forceinline__ uint32_t minus_1152(uint32_t halves) {
  const __half2 offset = __halves2half2(__ushort_as_half(0x6480), __ushort_as_half(0x6480));
  const __half2 x = __hsub2(*reinterpret_cast<const __half2*>(&halves), offset);
  return *reinterpret_cast<const uint32_t*>(&x);
}

// Four stored values (one little-endian word) as two f16x2 words: bytes (0, 1) and (2, 3).
template <typename CacheT>
__device__ __forceinline__ uint2 stored4_to_f16(uint32_t word) {
  if constexpr (std::is_same_v<CacheT, int8_t>) {
    // x + 128 (the byte with its top bit flipped) placed in the mantissa of the fp16 number
    // 1024 + (x + 128); one subtraction of 1152 leaves x exactly. Cheaper than four integer
    // to float conversions (quarter rate) and two packs.
    const uint32_t biased = word ^ 0x80808080u;
    const uint32_t lo = __byte_perm(biased, 0x64646464u, 0x5140), hi = __byte_perm(biased, 0x64646464u, 0x7362);
    return make_uint2(minus_1152(lo), minus_1152(hi));
  } else {
    return make_uint2(e4m3x2_to_f16x2(word), e4m3x2_to_f16x2(word >> 16));
  }
}

// The bytes (0, 2) and (1, 3) of a word as two f16x2 words, the lower byte in the low half:
// the value fragments of an int8 / fp8 tile read by ldmatrix.trans (each 16-bit element is a
// pair of neighbouring values of one key; bytes 0, 2 are one value column of two keys).
template <typename CacheT>
__device__ __forceinline__ uint2 stored4_interleaved_to_f16(uint32_t word) {
  if constexpr (std::is_same_v<CacheT, int8_t>) {
    const uint32_t biased = word ^ 0x80808080u;  // x + 128 in the mantissa of 1024 + ..., as above
    const uint32_t even = __byte_perm(biased, 0x64646464u, 0x5240), odd = __byte_perm(biased, 0x64646464u, 0x5341);
    return make_uint2(minus_1152(even), minus_1152(odd));
  } else {
    const uint32_t pairs = __byte_perm(word, 0u, 0x3120);  // bytes 0, 2 | 1, 3
    return make_uint2(e4m3x2_to_f16x2(pairs), e4m3x2_to_f16x2(pairs >> 16));
  }
}

}  // namespace mlakit::detail
