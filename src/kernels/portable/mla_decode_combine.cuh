// Combine step of the split-KV decode (SPEC section 6 merge, over all splits of a row).
//
// Grid (b, h_kv, row groups), 8 warps, one warp per query row: a group of 8 rows per CTA
// keeps enough rows in flight (a CTA per sequence left the H100 latency-bound: 47 us at
// b=128 h_q=128). Per sequence: 1 split -> already final, nothing to do; otherwise each row
// is merged (or, for length 0, written as 0 / +inf) by combine_row.
#pragma once

#include <cuda_runtime.h>

#include <cmath>

#include "kernels/combine_row.cuh"

namespace mlakit::detail::portable {

struct CombineConfig {
  static constexpr int kWarps = 8;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kMaxRowGroups = 65535;  // gridDim.z limit; larger row counts loop
};

template <typename Elem>
__global__ void __launch_bounds__(CombineConfig::kThreads)
    mla_decode_combine_kernel(const __grid_constant__ MlaDecodeParams p) {
  using C = CombineConfig;
  const int seq = blockIdx.x, hk = blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int splits = p.split_prefix[seq + 1] - p.split_prefix[seq];
  if (splits == 1) return;
  for (int row = blockIdx.z * C::kWarps + warp; row < p.rows; row += gridDim.z * C::kWarps) {
    combine_row<Elem>(p, seq, hk, row, splits, p.partial_prefix[seq], lane);
  }
}

}  // namespace mlakit::detail::portable
