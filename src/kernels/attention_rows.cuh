// Row and segment bookkeeping shared by every MLA kernel (portable and Hopper): which query token and
// head a packed row is, how many keys a token may see, and the walk over a part's
// (sequence, key block) range that the planner produced.
#pragma once

#include <cstdint>

#include "common/decode_schedule.h"
#include "device/global_load.cuh"
#include "kernels/mla_params.h"

namespace mlakit::detail {

// Row r of kv head hk is query token r / heads_per_kv of head hk * heads_per_kv +
// r % heads_per_kv (FlashMLA's packing: consecutive rows share a query token).
struct RowCoord {
  int t;
  int head;
};
__device__ __forceinline__ RowCoord row_coord(const AttentionCore& p, int hk, int r) {
  return RowCoord{r / p.heads_per_kv, hk * p.heads_per_kv + r % p.heads_per_kv};
}

// Offset of scheduled sequence `seq` in a tensor with batch and token strides.
__device__ __forceinline__ int64_t seq_offset(const AttentionCore& p, int seq, int64_t stride_b, int64_t stride_s) {
  return static_cast<int64_t>(seq / p.seq_divisor) * stride_b + static_cast<int64_t>(seq % p.seq_divisor) * stride_s;
}

// Element offset of query row r of kv head hk (row_coord) of scheduled sequence seq in q.
__device__ __forceinline__ int64_t q_row_offset(const AttentionCore& p, int seq, int hk, int r) {
  const RowCoord rc = row_coord(p, hk, r);
  return seq_offset(p, seq, p.q_stride_b, p.q_stride_s) + rc.t * p.q_stride_s + rc.head * p.q_stride_h;
}

// Prefetches into L2 the Q rows [row0, row0 + rows) of kv head hk of scheduled sequence seq
// (all d_qk columns), spread over `threads` threads of which this is thread `t`: a kernel that
// knows which Q it loads next issues this early, so the load finds Q in L2 instead of DRAM.
__device__ __forceinline__ void prefetch_q_rows_l2(const AttentionCore& p, int seq, int hk, int row0, int rows,
                                                   int t, int threads) {
  const int row_bytes = p.d_qk * 2;  // q is bf16 or fp16
  const int lines = (row_bytes + 127) / 128 + 1;  // a row need not start on a 128-byte line
  const uint8_t* q = static_cast<const uint8_t*>(p.q);
  const int end = min(rows, p.rows - row0);
  for (int i = t; i < end * lines; i += threads) {
    const int r = i / lines, line = i % lines;
    device::prefetch_l2(q + q_row_offset(p, seq, hk, row0 + r) * 2 + min(line * 128, row_bytes - 1));
  }
}

// Sparse modes: key pos of scheduled sequence seq is slot indices[..][pos] = block *
// page_size + offset (the prefill passes its kv as s_kv pages of one row, so the slot is the
// row).
__device__ __forceinline__ int32_t listed_slot(const AttentionCore& c, const ListedKeys& k, int seq, int pos) {
  return k.indices[seq_offset(c, seq, k.indices_stride_b, k.indices_stride_s) + pos];
}

// The element offset of a slot's row, or -1 for a slot outside [0, num_blocks * page_size)
// (-1 included): skipped, never dereferenced. One unsigned compare (slot_limit) and a
// multiply-shift division (page_divisor): this runs once per key and tile on the FP8 decode
// producer's path, where a 64-bit division (a called routine) cost 5% and the 32-bit one
// (~20 instructions) still sat between the index load and the token's loads.
__device__ __forceinline__ int64_t slot_offset(const ListedKeys& p, int32_t slot) {
  const uint32_t unsigned_slot = static_cast<uint32_t>(slot);
  if (unsigned_slot >= p.slot_limit) return -1;
  const uint32_t page = p.page_divisor.quotient(unsigned_slot);
  return static_cast<int64_t>(page) * p.kv_stride_block +
         static_cast<int64_t>(unsigned_slot - page * p.page_divisor.divisor) * p.kv_stride_page;
}

// The sparse prefill's kv is rows (pages of one row): the slot is the row, no division.
__device__ __forceinline__ int64_t row_slot_offset(const ListedKeys& p, int32_t slot) {
  return static_cast<uint32_t>(slot) < p.slot_limit ? static_cast<int64_t>(slot) * p.kv_stride_block : -1;
}

__device__ __forceinline__ int64_t listed_key_offset(const AttentionCore& c, const ListedKeys& k, int seq, int pos) {
  return slot_offset(k, listed_slot(c, k, seq, pos));
}

// The attention-sink factor of a finished row (1 without a sink or for an empty row).
__device__ __forceinline__ float sink_factor(const AttentionCore& p, int head, float lse_natural) {
  if (p.attn_sink == nullptr || !isfinite(lse_natural)) return 1.f;
  return 1.f / (1.f + expf(p.attn_sink[head] - lse_natural));
}

// Keys visible to query token t of a sequence of length L (docs/contract.md, Dense decode: with causal, token t sees
// positions [0, L - s_q + t]).
__device__ __forceinline__ int visible_keys(const AttentionCore& p, int L, int t) {
  if (!p.causal) return L;
  int limit = L - p.s_q + t + 1;
  return limit < 0 ? 0 : (limit > L ? L : limit);
}

// One non-empty piece of a part's range: keys [key_begin, key_end) of scheduled sequence seq
// (length L), its split index within the sequence. key_begin is a multiple of block_n;
// key_end <= L.
struct Segment {
  int seq, L, key_begin, key_end, split;
};

// Walks the segments of a part's range in order; next() returns false past the last one.
class SegmentCursor {
 public:
  __device__ SegmentCursor(const AttentionCore& core, const SplitSchedule& schedule, const PartRange& range)
      : core_(core), schedule_(schedule), range_(range), seq_(range.begin_seq), block_(range.begin_block), split_(range.begin_split) {}

  __device__ bool next(Segment* s) {
    for (; seq_ < range_.end_seq || (seq_ == range_.end_seq && block_ < range_.end_block); ++seq_) {
      const int L = core_.lengths(seq_);
      const int64_t blocks = key_blocks(L, schedule_.block_n);
      const int64_t block_end = seq_ == range_.end_seq ? range_.end_block : blocks;
      if (block_ < block_end) {
        *s = Segment{seq_, L, block_ * schedule_.block_n,
                     static_cast<int>(min(block_end * schedule_.block_n, static_cast<int64_t>(L))), split_};
        ++seq_;
        block_ = 0;
        split_ = 0;
        return true;
      }
      block_ = 0;
      split_ = 0;
    }
    return false;
  }

 private:
  const AttentionCore& core_;
  const SplitSchedule& schedule_;
  const PartRange& range_;
  int seq_, block_, split_;
};

// Calls f(seq, L, key_begin, key_end, split) for each segment of the part's range, in order.
template <typename F>
__device__ __forceinline__ void for_each_segment(const AttentionCore& core, const SplitSchedule& schedule,
                                                 const PartRange& range, F&& f) {
  SegmentCursor cursor(core, schedule, range);
  Segment s;
  while (cursor.next(&s)) f(s.seq, s.L, s.key_begin, s.key_end, s.split);
}

// Exclusive end of the keys a row tile [tile_row0, tile_row0 + tile_rows) needs from a
// segment: causal visibility grows with the token, so the tile's last row bounds it.
__device__ __forceinline__ int tile_keys_end(const AttentionCore& p, int hk, int tile_row0, int tile_rows,
                                             int L, int key_end) {
  const int last_row = min(p.rows, tile_row0 + tile_rows) - 1;
  return min(key_end, visible_keys(p, L, row_coord(p, hk, last_row).t));
}

}  // namespace mlakit::detail
