// The combine of the Hopper MHA prefill's tail split (common/mha_prefill_tiling.h): each row
// of a tail tile merges its pieces' partial rows with weights 2^(lse_j - lse), lse = log2 of
// sum_j 2^lse_j (docs/contract.md, Merging states), the pieces in order (bitwise
// reproducible); out in q's dtype, lse in natural log. A row for which no piece saw a key
// gets out 0 and lse +inf, as a whole tile writes it; a NaN partial LSE makes the row NaN.
// A piece's weight is 0 where it saw no key of the row (its partial row is then zeros).
#pragma once

#include <cmath>
#include <cstdint>

#include "device/numeric.cuh"
#include "kernels/mha_prefill_params.h"
#include "kernels/sm90/mha_prefill/work_tile.cuh"

namespace mlakit::detail::mha_sm90 {

inline constexpr int kTailCombineWarps = 8;  // rows per CTA, a warp each

// Grid (tail tiles, block_m / kTailCombineWarps).
template <class C, typename Elem>
__global__ void __launch_bounds__(kTailCombineWarps * 32)
    mha_prefill_tail_combine_kernel(const __grid_constant__ MhaPrefillParams p) {
  constexpr int kPerLane = C::kDv / 32;  // consecutive values of the row per lane: 2, 4 or 8
  static_assert(C::kDv % 64 == 0, "whole float2 per lane");
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  int m = 0, head = 0, batch = 0;
  tile_coords<C>(p, static_cast<uint32_t>(p.whole_tiles + blockIdx.x), &m, &head, &batch);
  const WorkTile w = tile_at<C>(p, m, head, batch);
  const int r = static_cast<int>(blockIdx.y) * kTailCombineWarps + warp;  // row within the tile
  const int row = w.m_block * C::kBlockM + r;                             // within the sequence
  if (!w.has_rows || row >= w.q_rows) return;
  const int64_t slot0 = static_cast<int64_t>(blockIdx.x) * p.tail_pieces;
  const auto lse_of = [&](int j) { return p.partial_lse[(slot0 + j) * C::kBlockM + r]; };

  // The pieces' LSEs in the lanes (32 at a time), their max, and each piece's weight.
  float mx = -INFINITY;
  bool nan = false;
  for (int j = lane; j < p.tail_pieces; j += 32) {
    const float v = lse_of(j);
    nan |= isnan(v);
    mx = fmaxf(mx, v);
  }
  for (int o = 16; o > 0; o /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  nan = __any_sync(0xffffffffu, nan);

  // Every piece wrote its rows (zeros where it saw no key), so the rows' loads do not wait for
  // the weights: kUnroll pieces' loads are in flight together.
  constexpr int kUnroll = 8;
  float sum = 0.f;
  float acc[kPerLane] = {};
  for (int j0 = 0; j0 < p.tail_pieces; j0 += 32) {
    const int n = min(32, p.tail_pieces - j0);
    const float lane_lse = lane < n ? lse_of(j0 + lane) : -INFINITY;
    const float lane_weight = lane_lse == -INFINITY || mx == -INFINITY ? 0.f : exp2f(lane_lse - mx);
    sum += lane_weight;
    for (int u0 = 0; u0 < n; u0 += kUnroll) {
      float x[kUnroll][kPerLane];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int j = j0 + (u0 + u < n ? u0 + u : n - 1);  // past the last piece: reloads it, weight 0
        const float* src = p.partial_out + ((slot0 + j) * C::kBlockM + r) * C::kDv + lane * kPerLane;
#pragma unroll
        for (int i = 0; i < kPerLane; i += 2) {
          const float2 v = *reinterpret_cast<const float2*>(src + i);
          x[u][i] = v.x;
          x[u][i + 1] = v.y;
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const float weight = __shfl_sync(0xffffffffu, lane_weight, (u0 + u) & 31);
        if (u0 + u >= n) continue;
#pragma unroll
        for (int i = 0; i < kPerLane; ++i) acc[i] += weight * x[u][i];
      }
    }
  }
  for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  const bool empty = !nan && mx == -INFINITY;
  const float inv = nan ? NAN : empty ? 0.f : 1.f / sum;
  const int64_t token = static_cast<int64_t>(w.q_begin) + row;
  Elem* out = static_cast<Elem*>(p.out) + token * p.out_stride_t + static_cast<int64_t>(w.head) * p.out_stride_h +
              lane * kPerLane;
#pragma unroll
  for (int i = 0; i < kPerLane; i += 2) {  // out's rows are 4-byte aligned (validated), not more
    *reinterpret_cast<uint32_t*>(out + i) = device::ElemOps<Elem>::pack(acc[i] * inv, acc[i + 1] * inv);
  }
  if (lane == 0 && p.lse != nullptr) {
    p.lse[w.head * p.lse_stride_h + token * p.lse_stride_t] =
        nan ? NAN : empty ? INFINITY : (mx + log2f(sum)) * device::kLn2;
  }
}

}  // namespace mlakit::detail::mha_sm90
