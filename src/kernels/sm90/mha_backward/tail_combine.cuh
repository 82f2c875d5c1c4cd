// The combine of the Hopper MHA backward's tail split (common/mha_backward_tiling.h): each key
// row of a tail tile inside its sequence sums its pieces' dK (already times the scale) and dV,
// in piece order (bitwise reproducible), into dk and dv in q's dtype.
#pragma once

#include <cstdint>

#include "device/numeric.cuh"
#include "kernels/mha_backward_params.h"
#include "kernels/sm90/mha_backward/work.cuh"

namespace mlakit::detail::mha_bwd_sm90 {

inline constexpr int kTailCombineWarps = 8;  // key rows per CTA, a warp each

// Sums the pieces' `kCols` values of one row from `src` (piece j at src + j * piece_stride),
// lane l holding columns 2 l + 64 i, i < kCols / 64, 8 pieces' loads in flight, and stores
// them (times 1) as pairs into `dst`.
template <int kCols, typename Elem>
__device__ __forceinline__ void sum_pieces(const float* src, int64_t piece_stride, int pieces, Elem* dst, int lane) {
  constexpr int kPairs = kCols / 64;
  constexpr int kUnroll = 8;
  float acc[kPairs][2] = {};
  for (int j0 = 0; j0 < pieces; j0 += kUnroll) {
    float2 x[kUnroll][kPairs];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int j = j0 + u < pieces ? j0 + u : pieces - 1;  // past the last piece: reloads it, unused
#pragma unroll
      for (int i = 0; i < kPairs; ++i) x[u][i] = *reinterpret_cast<const float2*>(src + j * piece_stride + 64 * i + 2 * lane);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (j0 + u >= pieces) continue;
#pragma unroll
      for (int i = 0; i < kPairs; ++i) {
        acc[i][0] += x[u][i].x;
        acc[i][1] += x[u][i].y;
      }
    }
  }
#pragma unroll
  for (int i = 0; i < kPairs; ++i) {
    *reinterpret_cast<uint32_t*>(dst + 64 * i + 2 * lane) = device::ElemOps<Elem>::pack(acc[i][0], acc[i][1]);
  }
}

// Grid (tail tiles, kBlockN / kTailCombineWarps).
template <class C, typename Elem>
__global__ void __launch_bounds__(kTailCombineWarps * 32)
    mha_backward_tail_combine_kernel(const __grid_constant__ MhaBackwardParams p) {
  static_assert(C::kDqk % 64 == 0 && C::kDv % 64 == 0, "whole pairs per lane");
  constexpr int kRow = C::kDqk + C::kDv;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const BackwardWork w = backward_work_at<C>(p, p.whole_tiles + blockIdx.x);
  const int r = static_cast<int>(blockIdx.y) * kTailCombineWarps + warp;  // key row within the tile
  if (!w.has_keys || w.key0 + r >= w.k_rows) return;
  const int64_t piece_stride = int64_t{C::kBlockN} * kRow;
  const float* src = p.partial_kv + (int64_t{blockIdx.x} * p.tail_pieces * C::kBlockN + r) * kRow;
  const int64_t row = int64_t{w.k_begin} + w.key0 + r;
  sum_pieces<C::kDqk>(src, piece_stride, p.tail_pieces,
                      static_cast<Elem*>(p.dk) + row * p.dk_stride_t + w.kv_head * p.dk_stride_h, lane);
  sum_pieces<C::kDv>(src + C::kDqk, piece_stride, p.tail_pieces,
                     static_cast<Elem*>(p.dv) + row * p.dv_stride_t + w.kv_head * p.dv_stride_h, lane);
}

}  // namespace mlakit::detail::mha_bwd_sm90
