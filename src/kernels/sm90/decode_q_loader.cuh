// The Q tile of a segment: its copy into the 9 swizzled Q slabs, and the Q loader role of the
// Hopper dense decode.
//
// The copy is bound by its address arithmetic, not by memory: computing each 16-byte chunk's
// source (row -> token and head by runtime divisions, 64-bit offsets) cost ~80 instructions a
// chunk, and a Q tile took ~12,000 cycles per segment (mlakit-decode-timeline, H100). The rows
// of a CTA's tile are the same in every segment, only the sequence moves, so their offsets
// within a sequence are computed once into shared memory (q_row_offset) and each warp copies
// whole rows (32 lanes on consecutive chunks).
//
// Q loader: warps 1-3 of warpgroup 0 (idle beside the TMA producer warp) copy each segment's
// Q tile as soon as both consumers have finished their last S = Q K^T of the previous segment
// (`q_empty`, one arrival per consumer) and signal `q_full` through
// cp.async.mbarrier.arrive.noinc (kQLoaderThreads arrivals); right after, they prefetch the
// next segment's Q rows into L2. So the copy overlaps the end of the previous segment (its
// last softmax and P·V, and the store) instead of following it.
#pragma once

#include "device/cp_async.cuh"
#include "device/global_load.cuh"
#include "device/sm90/sync.cuh"
#include "kernels/decode_rows.cuh"
#include "kernels/sm90/decode_config.cuh"

namespace mlakit::detail::sm90 {

// sm.q_row_offset[r]: the element offset of row r of row tile `tile` of kv head hk within its
// sequence (token * q_stride_s + head * q_stride_h), -1 for a padding row; threads t of
// `threads` share the work. Readers need a barrier with the writers first.
__device__ __forceinline__ void fill_q_row_offsets(const MlaDecodeParams& p, Sm90DecodeSmem& sm, int hk, int tile,
                                                   int t, int threads) {
  using C = Sm90DecodeConfig;
  for (int r = t; r < C::kRows; r += threads) {
    const int row = tile * C::kRows + r;
    const RowCoord rc = row_coord(p, hk, row);
    sm.q_row_offset[r] = row < p.rows ? rc.t * p.q_stride_s + rc.head * p.q_stride_h : -1;
  }
}

// Issues the cp.async copies of scheduled sequence seq's Q tile (rows as sm.q_row_offset says)
// into sm.q, 128B-swizzled; padding rows and columns past d_qk are zeros. Warp w of the
// `threads` threads (t = this thread) copies rows w, w + threads / 32, ...
template <typename Elem>
__device__ __forceinline__ void copy_q_tile(const MlaDecodeParams& p, Sm90DecodeSmem& sm, int seq, int t,
                                            int threads) {
  using C = Sm90DecodeConfig;
  constexpr int kChunksPerRow = C::kDqk / 8;
  const Elem* q = static_cast<const Elem*>(p.q);
  const Elem* seq_q = q + seq_offset(p, seq, p.q_stride_b, p.q_stride_s);
  const uint32_t q_smem = device::smem_address(&sm.q[0][0]);
  const int lane = t % 32;
#pragma unroll 1
  for (int r = t / 32; r < C::kRows; r += threads / 32) {
    const int64_t offset = sm.q_row_offset[r];
#pragma unroll 1
    for (int k = lane; k < kChunksPerRow; k += 32) {
      const bool copy = offset >= 0 && k * 8 < p.d_qk;
      const Elem* src = copy ? seq_q + offset + k * 8 : q;  // a zero fill reads nothing
      const uint32_t dst = q_smem + (k / 8) * C::kSlabBytes + r * 128 + (((k % 8) ^ (r & 7)) * 16);
      device::cp_async_16_or_zero(dst, src, copy);
    }
  }
}

// Prefetches scheduled sequence seq's Q tile rows into L2 (same row split as copy_q_tile).
template <typename Elem>
__device__ __forceinline__ void prefetch_q_tile_l2(const MlaDecodeParams& p, const Sm90DecodeSmem& sm, int seq,
                                                   int t, int threads) {
  using C = Sm90DecodeConfig;
  const int row_bytes = p.d_qk * static_cast<int>(sizeof(Elem));
  const int lines = (row_bytes + 127) / 128 + 1;  // a row need not start on a 128-byte line
  const uint8_t* seq_q = static_cast<const uint8_t*>(p.q) + seq_offset(p, seq, p.q_stride_b, p.q_stride_s) * 2;
  const int lane = t % 32;
  for (int r = t / 32; r < C::kRows; r += threads / 32) {
    const int64_t offset = sm.q_row_offset[r];
    if (offset >= 0 && lane < lines) {
      device::prefetch_l2(seq_q + offset * static_cast<int64_t>(sizeof(Elem)) + min(lane * 128, row_bytes - 1));
    }
  }
}

// The loader role (threads kQLoaderFirstThread.. of warpgroup 0): one Q tile per segment of
// the CTA's part.
template <typename Elem>
__device__ __forceinline__ void load_q_tiles(const MlaDecodeParams& p, Sm90DecodeSmem& sm) {
  using C = Sm90DecodeConfig;
  const int t = threadIdx.x - C::kQLoaderFirstThread;
  fill_q_row_offsets(p, sm, blockIdx.y, blockIdx.x, t, C::kQLoaderThreads);
  device::sm90::named_barrier_sync(C::kBarQLoader, C::kQLoaderThreads);
  uint32_t parity = 1;  // q_empty's first lap passes
  auto load = [&](int seq) {
    device::sm90::mbarrier_wait(&sm.q_empty, parity);
    parity ^= 1;
    copy_q_tile<Elem>(p, sm, seq, t, C::kQLoaderThreads);
    device::cp_async_mbarrier_arrive_noinc(&sm.q_full);
  };
  int pending = -1;  // the segment whose Q is in L2 (or on its way) but not yet copied
  for_each_segment(p, p.part_ranges[blockIdx.z], [&](int seq, int, int, int, int) {
    if (pending >= 0) {
      load(pending);
    }
    prefetch_q_tile_l2<Elem>(p, sm, seq, t, C::kQLoaderThreads);
    pending = seq;
  });
  if (pending >= 0) load(pending);
}

}  // namespace mlakit::detail::sm90
