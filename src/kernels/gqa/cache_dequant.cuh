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

// Four stored values (one little-endian word) as two packed Elem pairs.
template <typename Elem, typename CacheT>
__device__ __forceinline__ uint2 stored4_to_elem(uint32_t word) {
  if constexpr (std::is_same_v<CacheT, int8_t>) {
    // x + 128 (the byte with its top bit flipped) placed in the mantissa of a number whose
    // exponent makes it 1024 + (x + 128) (f16) or 2^23 + (x + 128) (f32); one subtraction
    // leaves x exactly. Cheaper than four integer-to-float conversions (quarter rate).
    const uint32_t biased = word ^ 0x80808080u;
    if constexpr (std::is_same_v<Elem, __half>) {
      const uint32_t lo = __byte_perm(biased, 0x64646464u, 0x5140), hi = __byte_perm(biased, 0x64646464u, 0x7362);
      const __half2 offset = __halves2half2(__ushort_as_half(0x6480), __ushort_as_half(0x6480));  // 1152
      const __half2 a = __hsub2(*reinterpret_cast<const __half2*>(&lo), offset);
      const __half2 b = __hsub2(*reinterpret_cast<const __half2*>(&hi), offset);
      return make_uint2(*reinterpret_cast<const uint32_t*>(&a), *reinterpret_cast<const uint32_t*>(&b));
    } else {
      constexpr float kOffset = 8388736.f;  // 2^23 + 128
      const float v0 = __uint_as_float(__byte_perm(biased, 0x4b000000u, 0x7650)) - kOffset;
      const float v1 = __uint_as_float(__byte_perm(biased, 0x4b000000u, 0x7651)) - kOffset;
      const float v2 = __uint_as_float(__byte_perm(biased, 0x4b000000u, 0x7652)) - kOffset;
      const float v3 = __uint_as_float(__byte_perm(biased, 0x4b000000u, 0x7653)) - kOffset;
      return make_uint2(device::ElemOps<Elem>::pack(v0, v1), device::ElemOps<Elem>::pack(v2, v3));
    }
  } else {
    const uint32_t lo = e4m3x2_to_f16x2(word), hi = e4m3x2_to_f16x2(word >> 16);
    if constexpr (std::is_same_v<Elem, __half>) {
      return make_uint2(lo, hi);
    } else {  // f16 -> f32 -> bf16 is exact for e4m3 values
      const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&lo));
      const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&hi));
      return make_uint2(device::ElemOps<Elem>::pack(a.x, a.y), device::ElemOps<Elem>::pack(b.x, b.y));
    }
  }
}

// Sixteen stored bytes as sixteen Elem (two 16-byte chunks).
template <typename Elem, typename CacheT>
__device__ __forceinline__ void stored16_to_elem(uint4 raw, uint4* first, uint4* second) {
  const uint2 a = stored4_to_elem<Elem, CacheT>(raw.x), b = stored4_to_elem<Elem, CacheT>(raw.y);
  const uint2 c = stored4_to_elem<Elem, CacheT>(raw.z), d = stored4_to_elem<Elem, CacheT>(raw.w);
  *first = make_uint4(a.x, a.y, b.x, b.y);
  *second = make_uint4(c.x, c.y, d.x, d.y);
}

}  // namespace mlakit::detail
