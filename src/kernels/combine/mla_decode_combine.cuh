// Combine step of the split-KV decode (docs/contract.md, Merging states, over all splits of a row).
//
// Grid (b, h_kv, row groups), 8 warps, one warp per query row: a group of 8 rows per CTA
// keeps enough rows in flight (a CTA per sequence left the H100 latency-bound: 47 us at
// b=128 h_q=128). Per sequence: 1 split -> already final,
// nothing to do; 0 splits (length 0) -> out 0, lse +inf; n >= 2 -> merge the n normalised
// partial outputs with weights exp2(lse_s - lse), lse = log2 sum exp2(lse_s). A partial LSE
// of -inf is an empty state and contributes nothing; NaN (invalid block table) propagates.
//
// Shared by both kernel families (the portable and the Hopper attention write the same
// partials). Its namespace stays `portable`, where it was first written: the kernel's symbol
// is what profiles and bench/results name.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <type_traits>

#include "device/numeric.cuh"
#include "kernels/attention_rows.cuh"
#include "kernels/mla_params.h"

namespace mlakit::detail::portable {

struct CombineConfig {
  static constexpr int kWarps = 8;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kMaxRowGroups = 65535;  // gridDim.z limit; larger row counts loop
};

// A row of kDv values over a warp: chunks of kVec consecutive floats, lane l holding chunk l
// of every group of 32 (coalesced): d_v 512 four float4 per lane, 64 one float2.
template <int kDv>
struct CombineRow {
  static constexpr int kVec = kDv >= 128 ? 4 : 2;
  static constexpr int kChunks = kDv / (32 * kVec);  // per lane
  static constexpr int kValuesPerLane = kDv / 32;
  static_assert(kDv % (32 * kVec) == 0, "d_v: a multiple of 64");
  using Chunk = std::conditional_t<kVec == 4, float4, float2>;
  // Splits merged per load round: 16 loads in flight per lane at d_v 64 / 128, 2 splits for
  // the longer rows (4 per round at d_v 256 made ptxas spill).
  static constexpr int kUnroll = kChunks == 1 ? 16 : 2;
  static_assert(32 % kUnroll == 0, "a round never crosses a group of 32 splits");
  __device__ static void add(float* acc, float w, const Chunk& x) {
    if constexpr (kVec == 4) {
      acc[0] += w * x.x;
      acc[1] += w * x.y;
      acc[2] += w * x.z;
      acc[3] += w * x.w;
    } else {
      acc[0] += w * x.x;
      acc[1] += w * x.y;
    }
  }
};

__device__ __forceinline__ float warp_max(float x) {
  for (int o = 16; o > 0; o /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}
__device__ __forceinline__ float warp_sum(float x) {
  for (int o = 16; o > 0; o /= 2) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

template <typename Elem, int kDv>
__global__ void __launch_bounds__(CombineConfig::kThreads)
    mla_decode_combine_kernel(const __grid_constant__ CombineParams params) {
  using C = CombineConfig;
  using R = CombineRow<kDv>;
  using Ops = device::ElemOps<Elem>;
  const AttentionCore& p = params.core;
  const SplitSchedule& schedule = params.schedule;
  const int seq = blockIdx.x, hk = blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int splits = schedule.split_prefix[seq + 1] - schedule.split_prefix[seq];
  if (splits == 1) return;
  if (p.skip != nullptr && p.skip[seq / p.seq_divisor] != 0) return;  // left as it is
  const int slot0 = schedule.partial_prefix[seq];

  for (int row = blockIdx.z * C::kWarps + warp; row < p.rows; row += gridDim.z * C::kWarps) {
    const int t = row / p.heads_per_kv;
    const int head = hk * p.heads_per_kv + row % p.heads_per_kv;
    auto lse_of = [&](int s) {
      return schedule.partial_lse[(static_cast<int64_t>(slot0 + s) * p.h_kv + hk) * p.rows + row];
    };
    float max_lse = -INFINITY;
    bool has_nan = false;
    for (int s = lane; s < splits; s += 32) {
      float v = lse_of(s);
      has_nan |= isnan(v);
      if (isfinite(v)) max_lse = fmaxf(max_lse, v);
    }
    max_lse = warp_max(max_lse);
    has_nan = __any_sync(0xffffffffu, has_nan);
    float sum = 0.f;
    for (int s = lane; s < splits; s += 32) {
      float v = lse_of(s);
      if (isfinite(v)) sum += exp2f(v - max_lse);
    }
    sum = warp_sum(sum);

    float acc[R::kValuesPerLane] = {};
    const bool empty = max_lse == -INFINITY;  // also true for splits == 0
    if (!empty && !has_nan) {
      // Lane l holds the LSE of split s0 + l; the splits are summed in order, kUnroll at a
      // time with their loads issued together (one split per load round left a sequence
      // with 33 splits latency-bound: 22 us for its 32 rows).
      for (int s0 = 0; s0 < splits; s0 += 32) {
        const int n = min(32, splits - s0);
        const float lane_lse = lane < n ? lse_of(s0 + lane) : -INFINITY;
        for (int u0 = 0; u0 < n; u0 += R::kUnroll) {
          float w[R::kUnroll];
          uint32_t use = 0;  // bit u: split u0 + u in range with a finite LSE (an empty one adds nothing)
          typename R::Chunk x[R::kUnroll][R::kChunks];
#pragma unroll
          for (int u = 0; u < R::kUnroll; ++u) {
            const float v = __shfl_sync(0xffffffffu, lane_lse, u0 + u);  // u0 + u < 32: kUnroll divides 32
            const bool used = u0 + u < n && isfinite(v);
            use |= static_cast<uint32_t>(used) << u;
            w[u] = used ? exp2f(v - max_lse) / sum : 0.f;
            const float* src =
                schedule.partial_out + ((static_cast<int64_t>(slot0 + s0 + u0 + u) * p.h_kv + hk) * p.rows + row) * kDv;
#pragma unroll
            for (int i = 0; i < R::kChunks; ++i) {
              x[u][i] = used ? *reinterpret_cast<const typename R::Chunk*>(src + 32 * R::kVec * i + R::kVec * lane)
                            : typename R::Chunk{};
            }
          }
#pragma unroll
          for (int u = 0; u < R::kUnroll; ++u) {
            if ((use >> u & 1u) == 0) continue;
#pragma unroll
            for (int i = 0; i < R::kChunks; ++i) R::add(acc + R::kVec * i, w[u], x[u][i]);
          }
        }
      }
    }
    Elem* out = static_cast<Elem*>(p.out) + seq_offset(p, seq, p.out_stride_b, p.out_stride_s) +
                t * p.out_stride_s + head * p.out_stride_h;
    const float lse = has_nan ? NAN : (empty ? INFINITY : (max_lse + log2f(sum)) * device::kLn2);
    const float sink = sink_factor(p, head, lse);
#pragma unroll
    for (int i = 0; i < R::kChunks; ++i) {
      uint32_t packed[R::kVec / 2];
#pragma unroll
      for (int v = 0; v < R::kVec; v += 2) {
        const float a0 = has_nan ? NAN : acc[R::kVec * i + v] * sink;
        const float a1 = has_nan ? NAN : acc[R::kVec * i + v + 1] * sink;
        packed[v / 2] = Ops::pack(a0, a1);
      }
      Elem* chunk = out + 32 * R::kVec * i + R::kVec * lane;
      if constexpr (R::kVec == 4) {
        *reinterpret_cast<uint2*>(chunk) = make_uint2(packed[0], packed[1]);
      } else {
        *reinterpret_cast<uint32_t*>(chunk) = packed[0];
      }
    }
    if (lane == 0 && p.lse != nullptr) {
      p.lse[seq_offset(p, seq, p.lse_stride_b, p.lse_stride_s) + head * p.lse_stride_h + t * p.lse_stride_s] = lse;
    }
  }
}

}  // namespace mlakit::detail::portable
