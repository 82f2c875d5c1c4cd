// Tiling of the Hopper MHA prefill forward (src/kernels/sm90/mha_prefill/) and the workspace
// of its tail split, shared by the host (workspace size, launch) and the kernels, so the two
// cannot drift.
//
// The tail split. One CTA per SM runs one query tile against its keys, so a grid of T tiles
// over N SMs takes ceil(T / N) tile times: b 4 h 32 s 4096 is 4096 tiles, 31 waves of 132 and
// 4 tiles more, which alone keep 4 SMs busy for a whole tile time (3% of the kernel) while
// the rest wait. Without causal (tiles of equal work) the last T mod N tiles are split over
// their key tiles into `pieces` each, so the last wave is as wide as the GPU; each piece
// writes its rows' partial output (normalised, float32) and base-2 LSE to the workspace, and
// a combine kernel merges the pieces of a row in a fixed order (docs/contract.md, Merging
// states). The workspace, 256-byte aligned parts:
//   partial_out  float32 [slots, block_m, d_v]   slot = tail tile * pieces + piece
//   partial_lse  float32 [slots, block_m]        log2 of the piece's row sum, -inf: no key
#pragma once

#include <cstdint>

#include "common/host_device.h"

namespace mlakit::detail {

// Tile heights of the Hopper MHA prefill (its Config uses them, its maps' boxes too): 64 query
// rows per consumer warpgroup, two of them (128 rows), three at d_qk 64 (192 rows: there the
// softmax of a tile takes longer than its products, so two warpgroups multiply while one
// computes it); 128 keys, 112 at d_qk 64 (the three warpgroups have 160 registers each: S,
// P and O of 128 keys spilled) and 64 at d_v 256 (where O takes 128 registers per thread).
// Wide key tiles, 144 keys (2 stages), at d 128 (mha_sm90_wide_keys): fewer tiles for the
// same keys, so less fixed work per key (H100: s 16384 2.5% and the varlen mix 2.2% faster).
// Not with causal (the wider tiles cross the diagonal more often: up to 2% slower), nor where
// the keys are a multiple of 128 below 8192 (there 128-key tiles have no partial tile, and at
// s 4096 the 144-key tiles' partial one, loaded and zeroed first, cost 1.5%); 160 and more
// spill (docs/history.md).
MLAKIT_HD constexpr bool mha_sm90_wide_keys(int d_qk, bool causal, int max_seqlen_k) {
  return d_qk == 128 && !causal && (max_seqlen_k % 128 != 0 || max_seqlen_k >= 8192);
}
MLAKIT_HD constexpr int mha_sm90_block_m(int d_qk) { return d_qk == 64 ? 192 : 128; }
MLAKIT_HD constexpr int mha_sm90_block_n(int d_qk, int d_v, bool wide_keys) {
  return d_qk == 64 ? 112 : wide_keys ? 144 : d_v <= 128 ? 128 : 64;
}

// Tiles of `tile` rows over `rows` rows, without the overflow of (rows + tile - 1) / tile at
// a max_seqlen near 2^31 (the kernels' index arithmetic is int).
MLAKIT_HD constexpr int mha_tiles_of(int rows, int tile) { return rows <= 0 ? 0 : (rows - 1) / tile + 1; }

// Slots of the tail split: at most one per SM of a Hopper GPU (132 on the H100 / H200 SXM);
// a GPU with more SMs splits as if it had this many. The workspace size depends on the shapes
// only (no device query), so it is sized for this bound.
inline constexpr int kMhaPrefillTailSlots = 132;
// A tail tile is split only where each piece keeps at least this many steps (key tiles of the
// forward): the pieces' partial rows and the combine cost about what one or two steps do.
inline constexpr int kMhaPrefillMinKeyTilesPerPiece = 2;

struct MhaPrefillTailSplit {
  int64_t whole_tiles = 0;  // query tiles [0, whole_tiles) run whole, one CTA each
  int tail_tiles = 0;       // tiles [whole_tiles, whole_tiles + tail_tiles) run in pieces (0: no split)
  int pieces = 1;           // per tail tile
  MLAKIT_HD constexpr int64_t ctas() const { return whole_tiles + static_cast<int64_t>(tail_tiles) * pieces; }
};

// The grid's query tiles: (query tiles of max_seqlen_q) x h_q x b.
MLAKIT_HD constexpr int64_t mha_prefill_sm90_tiles(int max_seqlen_q, int h_q, int64_t b, int d_qk) {
  return static_cast<int64_t>(mha_tiles_of(max_seqlen_q, mha_sm90_block_m(d_qk))) * h_q * b;
}

// The split of a launch of `tiles` CTA tiles of at most `steps` steps each (the units a tile's
// work splits into: key tiles of a forward query tile; (query head, query tile) pairs of a
// backward key tile, common/mha_backward_tiling.h) on `sm_count` SMs: none with causal (its
// tiles run longest first and the short ones fill the last wave), none where the last wave is
// at least half full (pieces of 1).
MLAKIT_HD constexpr MhaPrefillTailSplit mha_prefill_tail_split(int64_t tiles, int64_t steps, bool causal,
                                                               int sm_count) {
  MhaPrefillTailSplit split;
  split.whole_tiles = tiles;
  const int slots = sm_count < kMhaPrefillTailSlots ? sm_count : kMhaPrefillTailSlots;
  if (causal || slots <= 0 || tiles <= 0) return split;
  const int64_t tail = tiles % slots;
  const int64_t by_steps = steps / kMhaPrefillMinKeyTilesPerPiece;
  const int64_t by_slots = tail > 0 ? slots / tail : 0;
  const int64_t pieces = by_steps < by_slots ? by_steps : by_slots;
  // The split grid is one-dimensional: its CTAs must fit gridDim.x.
  if (pieces < 2 || tiles > INT32_MAX - static_cast<int64_t>(slots)) return split;
  split.whole_tiles = tiles - tail;
  split.tail_tiles = static_cast<int>(tail);
  split.pieces = static_cast<int>(pieces);
  return split;
}

// Bytes of the workspace's parts for `slots` slots of block_m rows of d_v values.
inline constexpr int64_t kMhaPrefillAlignment = 256;
MLAKIT_HD constexpr int64_t mha_prefill_partial_out_bytes(int64_t slots, int block_m, int d_v) {
  return (slots * block_m * d_v * 4 + kMhaPrefillAlignment - 1) / kMhaPrefillAlignment * kMhaPrefillAlignment;
}
MLAKIT_HD constexpr int64_t mha_prefill_partial_lse_bytes(int64_t slots, int block_m) {
  return (slots * block_m * 4 + kMhaPrefillAlignment - 1) / kMhaPrefillAlignment * kMhaPrefillAlignment;
}

// The workspace mha_prefill needs (shapes only): room for every slot the split can use on any
// GPU, for the Hopper kernel's tile heights; 0 where no split can happen.
MLAKIT_HD constexpr int64_t mha_prefill_workspace_bytes(int max_seqlen_q, int max_seqlen_k, int h_q, int64_t b,
                                                        int d_qk, int d_v, bool causal) {
  const int64_t tiles = mha_prefill_sm90_tiles(max_seqlen_q, h_q, b, d_qk);
  const int block_n = mha_sm90_block_n(d_qk, d_v, mha_sm90_wide_keys(d_qk, causal, max_seqlen_k));
  const int64_t key_tiles = (static_cast<int64_t>(max_seqlen_k) + block_n - 1) / block_n;
  if (causal || tiles <= 0 || key_tiles < 2 * kMhaPrefillMinKeyTilesPerPiece) return 0;
  const int block_m = mha_sm90_block_m(d_qk);
  return mha_prefill_partial_out_bytes(kMhaPrefillTailSlots, block_m, d_v) +
         mha_prefill_partial_lse_bytes(kMhaPrefillTailSlots, block_m);
}

}  // namespace mlakit::detail
