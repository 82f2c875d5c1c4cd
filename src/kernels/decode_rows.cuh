// Row and segment bookkeeping shared by every dense MLA decode kernel: which query token and
// head a packed row is, how many keys a token may see, and the walk over a part's
// (sequence, key block) range that the planner produced.
#pragma once

#include <cstdint>

#include "common/decode_schedule.h"
#include "kernels/mla_decode_params.h"

namespace mlakit::detail {

// Row r of kv head hk is query token r / heads_per_kv of head hk * heads_per_kv +
// r % heads_per_kv (FlashMLA's packing: consecutive rows share a query token).
struct RowCoord {
  int t;
  int head;
};
__device__ __forceinline__ RowCoord row_coord(const MlaDecodeParams& p, int hk, int r) {
  return RowCoord{r / p.heads_per_kv, hk * p.heads_per_kv + r % p.heads_per_kv};
}

// Offset of scheduled sequence `seq` in a tensor with batch and token strides.
__device__ __forceinline__ int64_t seq_offset(const MlaDecodeParams& p, int seq, int64_t stride_b, int64_t stride_s) {
  return static_cast<int64_t>(seq / p.seq_divisor) * stride_b + static_cast<int64_t>(seq % p.seq_divisor) * stride_s;
}

// The attention-sink factor of a finished row (1 without a sink or for an empty row).
__device__ __forceinline__ float sink_factor(const MlaDecodeParams& p, int head, float lse_natural) {
  if (p.attn_sink == nullptr || !isfinite(lse_natural)) return 1.f;
  return 1.f / (1.f + expf(p.attn_sink[head] - lse_natural));
}

// Keys visible to query token t of a sequence of length L (SPEC 1: with causal, token t sees
// positions [0, L - s_q + t]).
__device__ __forceinline__ int visible_keys(const MlaDecodeParams& p, int L, int t) {
  if (!p.causal) return L;
  int limit = L - p.s_q + t + 1;
  return limit < 0 ? 0 : (limit > L ? L : limit);
}

// A non-empty piece of a part's range: keys [key_begin, key_end) of sequence seq (length L),
// its split-th piece. key_begin is a multiple of block_n; key_end <= L.
struct Segment {
  int seq, L, key_begin, key_end, split;
};

// The segments of a part's range, in order.
class SegmentCursor {
 public:
  __device__ SegmentCursor(const MlaDecodeParams& p, const PartRange& range)
      : p_(p), range_(range), seq_(range.begin_seq), block_(range.begin_block), split_(range.begin_split) {}

  // The next segment into *s; false when none is left.
  __device__ bool next(Segment* s) {
    for (; seq_ < range_.end_seq || (seq_ == range_.end_seq && block_ < range_.end_block); ++seq_) {
      const int L = p_.lengths(seq_);
      const int64_t block_end = seq_ == range_.end_seq ? range_.end_block : key_blocks(L, p_.block_n);
      const int block = block_, split = split_;
      block_ = 0;
      split_ = 0;
      if (block < block_end) {
        *s = Segment{seq_++, L, block * p_.block_n, static_cast<int>(min(block_end * p_.block_n, static_cast<int64_t>(L))),
                     split};
        return true;
      }
    }
    return false;
  }

 private:
  const MlaDecodeParams& p_;
  const PartRange range_;
  int seq_, block_, split_;
};

// Calls f(seq, L, key_begin, key_end, split) for each segment of the part's range, in order.
template <typename F>
__device__ __forceinline__ void for_each_segment(const MlaDecodeParams& p, const PartRange& range, F&& f) {
  SegmentCursor cursor(p, range);
  Segment s;
  while (cursor.next(&s)) f(s.seq, s.L, s.key_begin, s.key_end, s.split);
}

// Exclusive end of the keys a row tile [tile_row0, tile_row0 + tile_rows) needs from a
// segment: causal visibility grows with the token, so the tile's last row bounds it.
__device__ __forceinline__ int tile_keys_end(const MlaDecodeParams& p, int hk, int tile_row0, int tile_rows,
                                             int L, int key_end) {
  const int last_row = min(p.rows, tile_row0 + tile_rows) - 1;
  return min(key_end, visible_keys(p, L, row_coord(p, hk, last_row).t));
}

}  // namespace mlakit::detail
