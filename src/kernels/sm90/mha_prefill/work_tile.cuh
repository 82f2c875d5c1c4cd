// Which query tile, head and sequence a CTA of the Hopper MHA prefill owns, and the key tiles
// it runs; producer, consumers and the tail combine compute it alike (they must agree).
#pragma once

#include <cstdint>

#include "common/mha_prefill_tiling.h"
#include "kernels/mha_prefill_params.h"

namespace mlakit::detail::mha_sm90 {

struct WorkTile {
  int m_block = 0;  // query tile within the sequence
  int head = 0, kv_head = 0, batch = 0;
  int q_begin = 0, k_begin = 0;  // rows of the sequence's first query / key in q / k
  int q_len = 0, k_len = 0;
  int q_rows = 0;  // rows written: q_len, cut at max_seqlen_q (the grid covers no more)
  // Key tiles run: n_last, n_last - 1, ..., n_last - n_blocks + 1 (last first: the masked ones
  // first); a whole tile runs all it sees, a piece of a tail tile its share of them.
  int n_blocks = 0, n_last = 0;
  int slot = -1;  // a piece of a tail tile: its partial rows' slot in the workspace; -1: whole
  bool has_rows = false;  // the tile starts inside its sequence
};

// Query tile m of head `head` of sequence `batch` (m in the grid's order: causal tiles run
// longest first, m 0 being the last query tile, which sees the most keys). Everything but the
// key range.
template <class C>
__device__ __forceinline__ WorkTile tile_at(const MhaPrefillParams& p, int m, int head, int batch) {
  WorkTile w;
  const int m_tiles = mha_tiles_of(p.max_seqlen_q, C::kBlockM);
  w.m_block = p.causal ? m_tiles - 1 - m : m;
  w.head = head;
  w.kv_head = w.head / p.heads_per_kv;
  w.batch = batch;
  w.q_begin = p.cu_seqlens_q[w.batch];
  w.q_len = p.cu_seqlens_q[w.batch + 1] - w.q_begin;
  w.k_begin = p.cu_seqlens_k[w.batch];
  w.k_len = p.cu_seqlens_k[w.batch + 1] - w.k_begin;
  w.q_rows = w.q_len < p.max_seqlen_q ? w.q_len : p.max_seqlen_q;
  w.has_rows = w.m_block * C::kBlockM < w.q_rows;
  return w;
}

// Key tiles of piece `piece` of `pieces` (0 of 1: the whole tile): those up to the tile's last
// row's diagonal with causal (bottom-right aligned), split evenly.
template <class C>
__device__ __forceinline__ void set_key_range(const MhaPrefillParams& p, int piece, int pieces, WorkTile* w) {
  if (!w->has_rows || w->k_len <= 0) return;
  int n_blocks = (w->k_len + C::kBlockN - 1) / C::kBlockN;
  if (p.causal) {
    // The tile's last row sees keys up to row_last + k_len - q_len.
    const int row_begin = w->m_block * C::kBlockM;
    const int row_last = (row_begin + C::kBlockM < w->q_len ? row_begin + C::kBlockM : w->q_len) - 1;
    const int64_t key_last = static_cast<int64_t>(row_last) + w->k_len - w->q_len;
    if (key_last < 0) return;
    const int64_t causal_blocks = key_last / C::kBlockN + 1;
    if (causal_blocks < n_blocks) n_blocks = static_cast<int>(causal_blocks);
  }
  if (pieces == 1) {  // every unsplit CTA: no 64-bit division in front of its first loads
    w->n_blocks = n_blocks;
    w->n_last = n_blocks - 1;
    return;
  }
  const int first = static_cast<int>(static_cast<int64_t>(n_blocks) * piece / pieces);
  const int end = static_cast<int>(static_cast<int64_t>(n_blocks) * (piece + 1) / pieces);
  w->n_blocks = end - first;
  w->n_last = end - 1;
}

// (m, head, batch) of tile `tile` of the grid's order (query tiles innermost, then h_q, then
// b) numbered in one dimension: the tiles of a grid with a tail split, which number less than
// 2^31 (mha_prefill_tail_split), so 32-bit division.
template <class C>
__device__ __forceinline__ void tile_coords(const MhaPrefillParams& p, uint32_t tile, int* m, int* head, int* batch) {
  const uint32_t m_tiles = static_cast<uint32_t>(mha_tiles_of(p.max_seqlen_q, C::kBlockM));
  const uint32_t head_batch = tile / m_tiles;
  *m = static_cast<int>(tile - head_batch * m_tiles);
  *head = static_cast<int>(head_batch % p.h_q);
  *batch = static_cast<int>(head_batch / p.h_q);
}

// The CTA's work. Without a split the grid is (query tiles, h_q, b); with one
// (params.tail_tiles > 0) it is one-dimensional, whole tiles first, then tail_pieces pieces of
// each tail tile, piece j running the j-th share of the tile's key tiles (possibly none: its
// rows get LSE -inf and zeros, which the combine weighs 0).
template <class C>
__device__ __forceinline__ WorkTile work_tile(const MhaPrefillParams& p) {
  int m = static_cast<int>(blockIdx.x), head = static_cast<int>(blockIdx.y), batch = static_cast<int>(blockIdx.z);
  int piece = 0, pieces = 1, slot = -1;
  if (p.tail_tiles > 0) {
    const uint32_t whole = static_cast<uint32_t>(p.whole_tiles);
    uint32_t tile = blockIdx.x;
    if (tile >= whole) {
      slot = static_cast<int>(tile - whole);
      pieces = p.tail_pieces;
      tile = whole + static_cast<uint32_t>(slot / pieces);
      piece = slot % pieces;
    }
    tile_coords<C>(p, tile, &m, &head, &batch);
  }
  WorkTile w = tile_at<C>(p, m, head, batch);
  w.slot = slot;
  set_key_range<C>(p, piece, pieces, &w);
  return w;
}

}  // namespace mlakit::detail::mha_sm90
