// The Q tile of a segment: its copy into the 9 swizzled Q slabs of shared memory.
//
// The copy is bound by its address arithmetic, not by memory: computing each 16-byte chunk's
// source (row -> token and head by runtime divisions, 64-bit offsets) cost ~80 instructions a
// chunk, and a Q tile took ~12,000 cycles per segment (mlakit-decode-timeline, H100, b=128
// h_q=128 s_k~4k). Now each row's offset within its sequence is computed once per copy, by
// one thread, into shared memory (q_row_offset; the values are the same in every segment of a
// CTA, only the sequence base moves), and each warp copies whole rows (32 lanes on consecutive
// chunks): ~8,900 cycles from one segment's store to the next segment's Q.
#pragma once

#include "device/cp_async.cuh"
#include "device/sm90/swizzle.cuh"
#include "device/sm90/sync.cuh"
#include "device/sm90/warpgroup.cuh"
#include "kernels/attention_rows.cuh"
#include "kernels/sm90/mla_config.cuh"

namespace mlakit::detail::sm90 {

// sm.q_row_offset[r]: the element offset of row r of row tile `tile` of kv head hk within its
// sequence (token * q_stride_s + head * q_stride_h), -1 for a padding row; threads t of
// `threads` share the work. Readers need a barrier with the writers first.
__device__ __forceinline__ void fill_q_row_offsets(const AttentionCore& p, Sm90MlaSmem& sm, int hk, int tile,
                                                   int t, int threads) {
  using C = Sm90MlaConfig;
  for (int r = t; r < C::kRows; r += threads) {
    const int row = tile * C::kRows + r;
    const RowCoord rc = row_coord(p, hk, row);
    sm.q_row_offset[r] = row < p.rows ? rc.t * p.q_stride_s + rc.head * p.q_stride_h : -1;
  }
}

// Issues the cp.async copies of scheduled sequence seq's Q tile (rows as sm.q_row_offset says)
// into sm.q, 128B-swizzled; padding rows and columns past d_qk are zeros. Warp w of the
// `threads` threads (t = this thread) copies rows w, w + threads / kWarpSize, ...
template <typename Elem>
__device__ __forceinline__ void copy_q_tile(const AttentionCore& p, Sm90MlaSmem& sm, int seq, int t,
                                            int threads) {
  namespace dev = mlakit::device::sm90;
  using C = Sm90MlaConfig;
  constexpr int kChunksPerRow = C::kDqk / 8;
  const Elem* q = static_cast<const Elem*>(p.q);
  const Elem* seq_q = q + seq_offset(p, seq, p.q_stride_b, p.q_stride_s);
  const uint32_t q_smem = device::smem_address(&sm.q[0][0]);
  const int lane = t % dev::kWarpSize;
#pragma unroll 1
  for (int r = t / dev::kWarpSize; r < C::kRows; r += threads / dev::kWarpSize) {
    const int64_t offset = sm.q_row_offset[r];
#pragma unroll 1
    for (int k = lane; k < kChunksPerRow; k += dev::kWarpSize) {
      const bool copy = offset >= 0 && k * 8 < p.d_qk;
      const Elem* src = copy ? seq_q + offset + k * 8 : q;  // a zero fill reads nothing
      const uint32_t dst = q_smem + (k / dev::kSwizzleRowChunks) * C::kSlabBytes +
                           dev::sw128_offset(r, k % dev::kSwizzleRowChunks);
      device::cp_async_16_or_zero(dst, src, copy);
    }
  }
}

}  // namespace mlakit::detail::sm90
