// The append of one GQA cache row (one token of one kv head) by one warp: read d new values,
// rotate the first rotary_dim of a key, quantize to the cache's format and store values and
// scale. The GQA decode's fused append and the cache tools (gqa_cache_tools.cu: append and
// quantize) call this one routine, and the CPU tools evaluate the same arithmetic
// (reference::append_cache_row: common/rotary.h for the rotation, common/gqa_cache_quant.h
// and common/fp8_cache_row.h for the quantization), so all of them store identical bytes.
//
// Lane l owns the D / 32 contiguous columns [l * D / 32, (l + 1) * D / 32): one vector load of
// the new values and one vector store of the quantized ones per lane when the rows are
// aligned to that width (scalar accesses otherwise; the choice is per row, warp-uniform).
// Rotation partners: GPT-J's are in the lane's own columns; NeoX's (column e +- rotary_dim / 2)
// come by one shuffle per value when rotary_dim / 2 is a multiple of D / 32 (the lanes' column
// blocks then pair up whole), else by a scalar reload from src. The row's max |x| is a warp
// reduction with fmaxf, which skips NaN as the reference's std::fmax does (max is order-free,
// so the reduction order does not matter).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

#include "common/fp8_cache_row.h"
#include "common/gqa_cache_quant.h"
#include "common/rotary.h"
#include "kernels/gqa/gqa_params.h"

namespace mlakit::detail {

inline constexpr unsigned kFullWarp = 0xffffffffu;

// How one value of a cache of CacheT is written and read back (before the scale).
template <typename CacheT>
struct GqaCacheCodec;

template <>
struct GqaCacheCodec<__nv_bfloat16> {
  static constexpr bool kQuantized = false;
  static __device__ __forceinline__ __nv_bfloat16 encode(float y, float) { return __float2bfloat16_rn(y); }
  static __device__ __forceinline__ float decode(__nv_bfloat16 v) { return __bfloat162float(v); }
};

template <>
struct GqaCacheCodec<__half> {
  static constexpr bool kQuantized = false;
  static __device__ __forceinline__ __half encode(float y, float) { return __float2half_rn(y); }
  static __device__ __forceinline__ float decode(__half v) { return __half2float(v); }
};

template <>
struct GqaCacheCodec<int8_t> {
  static constexpr bool kQuantized = true;
  static __device__ __forceinline__ float row_scale(float amax) { return int8_row_scale(amax); }
  static __device__ __forceinline__ int8_t encode(float y, float scale) { return int8_quantize(y, scale); }
  static __device__ __forceinline__ float decode(int8_t v) { return static_cast<float>(v); }
};

template <>
struct GqaCacheCodec<__nv_fp8_e4m3> {
  static constexpr bool kQuantized = true;
  static __device__ __forceinline__ float row_scale(float amax) { return fp8_row_scale(amax); }
  static __device__ __forceinline__ __nv_fp8_e4m3 encode(float y, float scale) {
    __nv_fp8_e4m3 v;
    v.__x = fp8_quantize(y, scale);
    return v;
  }
  static __device__ __forceinline__ float decode(__nv_fp8_e4m3 v) { return e4m3_to_float(v.__x); }
};

__device__ __forceinline__ float elem_to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float elem_to_float(__half v) { return __half2float(v); }

// An unsigned type of `bytes` bytes (2, 4, 8 or 16): one vector access.
template <int bytes>
struct VectorOf;
template <>
struct VectorOf<2> {
  using Type = uint16_t;
};
template <>
struct VectorOf<4> {
  using Type = uint32_t;
};
template <>
struct VectorOf<8> {
  using Type = uint2;
};
template <>
struct VectorOf<16> {
  using Type = uint4;
};

// n contiguous T from src to dst (registers / memory): one vector access when src and dst
// are aligned to its size (the register side always is), else n scalar ones.
template <typename T, int n>
__device__ __forceinline__ void copy_chunk(T* dst, const T* src) {
  using Vec = typename VectorOf<static_cast<int>(sizeof(T)) * n>::Type;
  if (reinterpret_cast<uintptr_t>(src) % sizeof(Vec) == 0 && reinterpret_cast<uintptr_t>(dst) % sizeof(Vec) == 0) {
    *reinterpret_cast<Vec*>(dst) = *reinterpret_cast<const Vec*>(src);
  } else {
#pragma unroll
    for (int i = 0; i < n; ++i) dst[i] = src[i];
  }
}

// Appends one row (see the header comment): src = D contiguous Elem values (global or shared
// memory); with `rotate` and rope.style != 0 its first rope.rotary_dim columns are rotated at
// position `pos`; the result is stored in CacheT at cache.values + cache.row(block, page_row,
// hk), with, for a kPerToken cache, the row's scale at cache.scale[cache.scale_index(block,
// page_row, hk)] (a kPerTensor cache quantizes with cache.scale[0] and stores no scale).
//   Elem: __nv_bfloat16 | __half.  CacheT: Elem (rounded to nearest even), int8_t (scale
//   max|x| / 127, always per token) or __nv_fp8_e4m3 (scale max|x| / 448 per token, or the
//   tensor's).  D: 64, 128 or 256.
// All 32 lanes of the warp call it with the same arguments but `lane` (full-mask shuffles).
template <typename Elem, typename CacheT, int D>
__device__ void append_row_warp(const Elem* src, const GqaRope& rope, bool rotate, int64_t pos,
                                const GqaCacheView& cache, int64_t block, int64_t page_row, int hk, int lane) {
  static_assert(D == 64 || D == 128 || D == 256, "head dims of the GQA decode");
  constexpr int kPerLane = D / 32;  // even: GPT-J pairs never straddle two lanes
  using Codec = GqaCacheCodec<CacheT>;
  static_assert(Codec::kQuantized || std::is_same_v<CacheT, Elem>, "a 16-bit cache holds q's dtype");
  const int first = lane * kPerLane;

  alignas(16) Elem raw[kPerLane];
  copy_chunk<Elem, kPerLane>(raw, src + first);
  float y[kPerLane];
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) y[i] = elem_to_float(raw[i]);

  const int rotary_dim = rope.rotary_dim;
  if (rotate && rope.style != 0 && rotary_dim > 0) {
    float partner[kPerLane];
    const int half = rotary_dim / 2;
    if (rope.style == 2) {
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) partner[i] = y[i ^ 1];
    } else if (half % kPerLane == 0) {
      // Whole column blocks pair up: lane l's partners are lane l +- half / kPerLane's values.
      const int shift = half / kPerLane;
      const int from = first >= rotary_dim ? lane : (first < half ? lane + shift : lane - shift);
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) partner[i] = __shfl_sync(kFullWarp, y[i], from);
    } else {
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) {
        const int e = first + i;
        partner[i] = e < rotary_dim ? elem_to_float(src[rope_pair(e, 1, rotary_dim).partner]) : 0.f;
      }
    }
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int e = first + i;
      if (e >= rotary_dim) continue;
      const RopePair p = rope_pair(e, rope.style, rotary_dim);
      float cs, sn;
      rope_cos_sin(pos, p.c, rotary_dim, rope.log_theta, &cs, &sn);
      y[i] = rope_rotate(y[i], partner[i], cs, sn, p.first);
    }
  }

  float scale = 0.f;
  if constexpr (Codec::kQuantized) {
    if (!std::is_same_v<CacheT, int8_t> && cache.scale_kind == GqaScaleKind::kPerTensor) {
      scale = cache.scale[0];
    } else {
      float amax = 0.f;
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) amax = fmaxf(amax, fabsf(y[i]));
#pragma unroll
      for (int offset = 16; offset > 0; offset /= 2) amax = fmaxf(amax, __shfl_xor_sync(kFullWarp, amax, offset));
      scale = Codec::row_scale(amax);
    }
  }
  alignas(16) CacheT out[kPerLane];
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) out[i] = Codec::encode(y[i], scale);
  CacheT* row = static_cast<CacheT*>(cache.values) + cache.row(block, page_row, hk);
  copy_chunk<CacheT, kPerLane>(row + first, out);
  if (lane == 0 && cache.scale_kind == GqaScaleKind::kPerToken) {
    cache.scale[cache.scale_index(block, page_row, hk)] = scale;
  }
}

}  // namespace mlakit::detail
