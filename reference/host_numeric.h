// bf16 / fp16 <-> float on the host, bit-exact round-to-nearest-even (the rounding of the
// GPU's __float2bfloat16_rn / __float2half_rn), for the reference, tests and benchmarks.
#pragma once

#include <cstdint>
#include <cstring>

#include "mlakit/tensor.h"

namespace mlakit::host {

inline float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint32_t float_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

inline float bf16_to_float(uint16_t h) { return bits_to_float(static_cast<uint32_t>(h) << 16); }

inline uint16_t float_to_bf16(float f) {
  uint32_t u = float_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline float fp16_to_float(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  if (exp == 0x1f) return bits_to_float(sign | 0x7f800000u | (man << 13));  // inf / NaN
  if (exp == 0) {
    if (man == 0) return bits_to_float(sign);
    float v = static_cast<float>(man) * (1.0f / 16777216.0f);  // man * 2^-24
    return sign ? -v : v;
  }
  return bits_to_float(sign | ((exp + 112) << 23) | (man << 13));
}

inline uint16_t float_to_fp16(float f) {
  uint32_t u = float_to_bits(f);
  uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to inf
  if (abs < 0x38800000u) {  // below the smallest normal half (2^-14): subnormal or zero
    // value = abs_float; units of 2^-24, rounded to nearest even
    float a = bits_to_float(abs);
    float scaled = a * 16777216.0f;  // exact (power of two)
    uint32_t q = static_cast<uint32_t>(scaled);
    float frac = scaled - static_cast<float>(q);
    if (frac > 0.5f || (frac == 0.5f && (q & 1u))) ++q;
    return static_cast<uint16_t>(sign | q);
  }
  uint32_t exp = (abs >> 23) - 112;
  uint32_t man = abs & 0x7fffffu;
  uint32_t half = (exp << 10) | (man >> 13);
  uint32_t rest = man & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) ++half;
  return static_cast<uint16_t>(sign | half);
}

// Element `index` of a host array of T. Host arrays need not be aligned to T (a caller's
// view can start at any byte; only the kernels require aligned rows), so the access goes
// through memcpy, which compiles to a plain load or store.
template <typename T>
inline T load_as(const void* base, int64_t index) {
  T value;
  std::memcpy(&value, static_cast<const unsigned char*>(base) + index * static_cast<int64_t>(sizeof(T)), sizeof(T));
  return value;
}
template <typename T>
inline void store_as(void* base, int64_t index, T value) {
  std::memcpy(static_cast<unsigned char*>(base) + index * static_cast<int64_t>(sizeof(T)), &value, sizeof(T));
}

// Element of a 16-bit activation tensor as float / from float, by dtype.
inline float load_half(const void* base, int64_t index, DType dtype) {
  const uint16_t h = load_as<uint16_t>(base, index);
  return dtype == DType::kBF16 ? bf16_to_float(h) : fp16_to_float(h);
}
inline void store_half(void* base, int64_t index, DType dtype, float value) {
  store_as<uint16_t>(base, index, dtype == DType::kBF16 ? float_to_bf16(value) : float_to_fp16(value));
}

// `value` rounded to nearest even in a 16-bit activation dtype, as float.
inline float round_to_half(float value, DType dtype) {
  return dtype == DType::kBF16 ? bf16_to_float(float_to_bf16(value)) : fp16_to_float(float_to_fp16(value));
}

// A result element of an output that is q's 16-bit dtype or float32 (the references'
// unrounded results): rounded to nearest even, or stored as is.
inline void store_result(void* base, int64_t index, DType dtype, float value) {
  if (dtype == DType::kFP32) {
    store_as<float>(base, index, value);
  } else {
    store_half(base, index, dtype, value);
  }
}

}  // namespace mlakit::host
