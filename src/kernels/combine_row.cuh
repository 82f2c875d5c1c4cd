// Merge of one query row over the split-KV partial results of its sequence (SPEC section 6),
// by one warp: the standalone combine kernel (portable decode) and the Hopper kernel's fused
// merge (the last CTA of a split sequence) both call it.
//
// Weights exp2(lse_s - lse) over the n >= 2 normalised partials, lse = log2 sum exp2(lse_s);
// a partial LSE of -inf is an empty state and contributes nothing; NaN (invalid block table)
// propagates. No split with a key (length 0) gives out 0, lse +inf.
#pragma once

#include <cuda_runtime.h>

#include <cmath>

#include "device/numeric.cuh"
#include "kernels/decode_rows.cuh"
#include "kernels/mla_decode_params.h"

namespace mlakit::detail {

__device__ __forceinline__ float warp_max(float x) {
  for (int o = 16; o > 0; o /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}
__device__ __forceinline__ float warp_sum(float x) {
  for (int o = 16; o > 0; o /= 2) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// Row `row` (of kv head hk) of scheduled sequence `seq`, whose `splits` partials start at
// slot `slot0`. All 32 lanes of the warp call it. Partials are read with ld.global.cg: the
// fused merge reads what other CTAs wrote during this kernel.
template <typename Elem>
__device__ void combine_row(const MlaDecodeParams& p, int seq, int hk, int row, int splits, int slot0, int lane) {
  constexpr int kDv = 512;
  constexpr int kValuesPerLane = kDv / 32;  // four float4 per lane
  using Ops = device::ElemOps<Elem>;
  const int t = row / p.heads_per_kv;
  const int head = hk * p.heads_per_kv + row % p.heads_per_kv;
  auto lse_of = [&](int s) {
    return __ldcg(&p.partial_lse[(static_cast<int64_t>(slot0 + s) * p.h_kv + hk) * p.rows + row]);
  };
  float max_lse = -INFINITY;
  bool has_nan = false;
  for (int s = lane; s < splits; s += 32) {
    const float v = lse_of(s);
    has_nan |= isnan(v);
    if (isfinite(v)) max_lse = fmaxf(max_lse, v);
  }
  max_lse = warp_max(max_lse);
  has_nan = __any_sync(0xffffffffu, has_nan);
  float sum = 0.f;
  for (int s = lane; s < splits; s += 32) {
    const float v = lse_of(s);
    if (isfinite(v)) sum += exp2f(v - max_lse);
  }
  sum = warp_sum(sum);

  float acc[kValuesPerLane] = {};
  const bool empty = max_lse == -INFINITY;  // also true for splits == 0
  if (!empty && !has_nan) {
    for (int s = 0; s < splits; ++s) {
      const float v = lse_of(s);
      if (!isfinite(v)) continue;
      const float w = exp2f(v - max_lse) / sum;
      const float* src = p.partial_out + ((static_cast<int64_t>(slot0 + s) * p.h_kv + hk) * p.rows + row) * kDv;
#pragma unroll
      for (int i = 0; i < kValuesPerLane / 4; ++i) {
        const float4 x = __ldcg(reinterpret_cast<const float4*>(src + 128 * i + 4 * lane));
        acc[4 * i + 0] += w * x.x;
        acc[4 * i + 1] += w * x.y;
        acc[4 * i + 2] += w * x.z;
        acc[4 * i + 3] += w * x.w;
      }
    }
  }
  Elem* out = static_cast<Elem*>(p.out) + seq_offset(p, seq, p.out_stride_b, p.out_stride_s) + t * p.out_stride_s +
              head * p.out_stride_h;
  const float lse = has_nan ? NAN : (empty ? INFINITY : (max_lse + log2f(sum)) * device::kLn2);
  const float sink = sink_factor(p, head, lse);
#pragma unroll
  for (int i = 0; i < kValuesPerLane / 4; ++i) {
    const float a0 = has_nan ? NAN : acc[4 * i] * sink, a1 = has_nan ? NAN : acc[4 * i + 1] * sink;
    const float a2 = has_nan ? NAN : acc[4 * i + 2] * sink, a3 = has_nan ? NAN : acc[4 * i + 3] * sink;
    *reinterpret_cast<uint2*>(out + 128 * i + 4 * lane) = make_uint2(Ops::pack(a0, a1), Ops::pack(a2, a3));
  }
  if (lane == 0) {
    p.lse[seq_offset(p, seq, p.lse_stride_b, p.lse_stride_s) + head * p.lse_stride_h + t * p.lse_stride_s] = lse;
  }
}

}  // namespace mlakit::detail
