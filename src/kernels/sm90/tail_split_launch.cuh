// The launch of a Hopper kernel with a tail split (common/mha_prefill_tiling.h; the MHA
// forward's and backward's): without a split its own grid; with one, its CTAs in one
// dimension (whole tiles first, then the pieces), and after it the combine of the pieces
// over (tail tiles, combine_y) blocks.
#pragma once

#include <cuda_runtime.h>

#include "common/mha_prefill_tiling.h"
#include "kernels/sm90/warp_roles.cuh"

namespace mlakit::detail::sm90 {

// params: the kernels' first argument, with whole_tiles, tail_tiles and tail_pieces.
template <class Kernel, class Combine, class Params, class... Args>
cudaError_t launch_with_tail_split(Kernel kernel, dim3 grid, int threads, int smem_bytes, Combine combine,
                                   unsigned combine_y, int combine_threads, cudaStream_t stream, const Params& params,
                                   const Args&... args) {
  const bool split = params.tail_tiles > 0;
  if (split) {
    grid = dim3(static_cast<unsigned>(
        MhaPrefillTailSplit{params.whole_tiles, params.tail_tiles, params.tail_pieces}.ctas()));
  }
  const cudaError_t e = launch_with_shared_memory(kernel, grid, threads, smem_bytes, stream, params, args...);
  if (e != cudaSuccess || !split) return e;
  combine<<<dim3(static_cast<unsigned>(params.tail_tiles), combine_y), combine_threads, 0, stream>>>(params);
  return cudaGetLastError();
}

}  // namespace mlakit::detail::sm90
