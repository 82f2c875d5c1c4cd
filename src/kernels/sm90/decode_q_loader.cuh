// The Q tile of a segment: its copy into the 9 swizzled Q slabs, and the Q loader role of the
// Hopper dense decode.
//
// Q loader: warps 1-3 of warpgroup 0 (idle beside the TMA producer warp) copy each segment's
// Q tile as soon as both consumers have finished their last S = Q K^T of the previous segment
// (`q_empty`, one arrival per consumer) and signal `q_full` through
// cp.async.mbarrier.arrive.noinc (kQLoaderThreads arrivals). Right after, they prefetch the
// next segment's Q rows into L2, so that copy reads L2, not DRAM. The copy thus overlaps the
// end of the previous segment (its last softmax and P·V, and the store) instead of following
// it: loaded by the consumers between segments it cost ~12,000 cycles per segment on the H100
// (mlakit-decode-timeline, b=128 h_q=128 s_k~4k).
#pragma once

#include "device/cp_async.cuh"
#include "device/sm90/sync.cuh"
#include "kernels/decode_rows.cuh"
#include "kernels/sm90/decode_config.cuh"

namespace mlakit::detail::sm90 {

// Issues the cp.async copies of the Q tile of row tile `tile` of kv head hk of scheduled
// sequence seq into sm.q, spread over `threads` threads of which this is thread t: 16-byte
// chunks of 128B-swizzled rows; padding rows (past p.rows) and columns past d_qk are zeros.
template <typename Elem>
__device__ __forceinline__ void copy_q_tile(const MlaDecodeParams& p, Sm90DecodeSmem& sm, int seq, int hk, int tile,
                                            int t, int threads) {
  using C = Sm90DecodeConfig;
  const Elem* q = static_cast<const Elem*>(p.q);
  constexpr int kChunksPerRow = C::kDqk / 8;
  for (int c = t; c < C::kRows * kChunksPerRow; c += threads) {
    const int r = c / kChunksPerRow, k = c % kChunksPerRow;
    const int slab = k / 8, chunk = k % 8;
    const int row = tile * C::kRows + r;
    const bool copy = row < p.rows && k * 8 < p.d_qk;
    const Elem* src = copy ? q + q_row_offset(p, seq, hk, row) + k * 8 : q;  // zero fill reads nothing
    device::cp_async_16_or_zero(&sm.q[slab][r * 128 + ((chunk ^ (r & 7)) * 16)], src, copy);
  }
}

// The loader role (threads 32..127 of the CTA): one Q tile per segment of the CTA's part.
template <typename Elem>
__device__ __forceinline__ void load_q_tiles(const MlaDecodeParams& p, Sm90DecodeSmem& sm) {
  using C = Sm90DecodeConfig;
  const int t = threadIdx.x - C::kQLoaderFirstThread;
  const int hk = blockIdx.y, tile = blockIdx.x;
  uint32_t parity = 1;  // q_empty's first lap passes
  auto load = [&](int seq) {
    device::sm90::mbarrier_wait(&sm.q_empty, parity);
    parity ^= 1;
    copy_q_tile<Elem>(p, sm, seq, hk, tile, t, C::kQLoaderThreads);
    device::cp_async_mbarrier_arrive_noinc(&sm.q_full);
  };
  int pending = -1;  // the segment whose Q is in L2 (or on its way) but not yet copied
  for_each_segment(p, p.part_ranges[blockIdx.z], [&](int seq, int, int, int, int) {
    prefetch_q_rows_l2(p, seq, hk, tile * C::kRows, C::kRows, t, C::kQLoaderThreads);
    if (pending >= 0) load(pending);
    pending = seq;
  });
  if (pending >= 0) load(pending);
}

}  // namespace mlakit::detail::sm90
