// Conversions between float and the 16-bit activation types, uniform over bf16 and fp16.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "common/math_constants.h"

namespace mlakit::device {

template <typename Elem>
struct ElemOps;

template <>
struct ElemOps<__nv_bfloat16> {
  // lo in the low 16 bits, as the MMA fragments expect.
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
  static __device__ __forceinline__ uint32_t pack_raw(__nv_bfloat16 lo, __nv_bfloat16 hi) {
    return static_cast<uint32_t>(__bfloat16_as_ushort(lo)) |
           (static_cast<uint32_t>(__bfloat16_as_ushort(hi)) << 16);
  }
  static __device__ __forceinline__ __nv_bfloat16 from_float(float x) { return __float2bfloat16_rn(x); }
  // The two values of a packed pair (lo: the low 16 bits).
  static __device__ __forceinline__ float2 unpack(uint32_t pair) {
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&pair));
  }
};

template <>
struct ElemOps<__half> {
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
  static __device__ __forceinline__ uint32_t pack_raw(__half lo, __half hi) {
    return static_cast<uint32_t>(__half_as_ushort(lo)) |
           (static_cast<uint32_t>(__half_as_ushort(hi)) << 16);
  }
  static __device__ __forceinline__ __half from_float(float x) { return __float2half_rn(x); }
  static __device__ __forceinline__ float2 unpack(uint32_t pair) {
    return __half22float2(*reinterpret_cast<const __half2*>(&pair));
  }
};

// 2^x with ex2.approx.ftz.f32 (PTX ISA 9.7.4.x "ex2"): ~2 ulp, -inf -> 0, the softmax's
// exponential (exp2f without --use_fast_math is a longer, exact sequence).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// The float copies of common/math_constants.h's constants, for the kernels.
inline constexpr float kLn2 = static_cast<float>(detail::kLn2);
inline constexpr float kLog2e = static_cast<float>(detail::kLog2e);

}  // namespace mlakit::device
