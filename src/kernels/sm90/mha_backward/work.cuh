// Which keys a CTA of the Hopper MHA backward owns and which query tiles it runs; producer and
// consumers compute it alike (they must agree on the tile sequence). The arithmetic is
// common/mha_backward_walk.h (checked on the CPU against a brute-force scan).
#pragma once

#include <cstdint>

#include "common/mha_backward_walk.h"
#include "common/mha_prefill_tiling.h"
#include "kernels/mha_backward_params.h"

namespace mlakit::detail::mha_bwd_sm90 {

struct BackwardWork : MhaBackwardWalk {
  int kv_head = 0, batch = 0;
  int q_begin = 0, k_begin = 0;  // rows of the sequence's first query / key in q / k
  int q_len = 0, k_len = 0;      // the sequence's lengths (the causal diagonal's offset)
  int key_tile = 0;              // the CTA's key tile within the sequence
  // The walk's steps it runs: tile0 .. tile0 + tiles - 1 of the heads_per_kv * m_tiles (query
  // head, query tile) pairs, in that order; all of them but in a piece of a tail tile.
  int tile0 = 0, tiles = 0;
  int slot = -1;  // a piece of a tail tile: its dK / dV slot in partial_kv; -1: a whole tile
};

// Grid (key tiles of max_seqlen_k, h_kv, b), launched in the order of mha_backward_block. Causal,
// default mode: the (sequence, kv head) pairs in groups of about one wave of CTAs, key tile by key
// tile within a group, so that the long walks (key tile 0 sees every query tile) start first
// (b4 s4096 causal 1.5-2% faster, session 17). Otherwise one pair at a time, its key tiles in a
// row: the walks are equally long without causal masking (groups won nothing there), and in the
// deterministic mode a pair's key tiles run from the last one (a key tile waits on the query
// tiles' counters only for higher key tiles, which have lower block indices and never wait on
// it), its chain of turns through CTAs launched together (groups made its causal cases 3-5%
// slower). The tail split's pieces come after every whole tile (and in the deterministic mode
// after the higher key tiles they wait on).

// The key tile of launch position `linear` (mha_backward_block), everything but the steps.
template <class C>
__device__ __forceinline__ BackwardWork backward_work_at(const MhaBackwardParams& p, int64_t linear) {
  BackwardWork w;
  const int key_tiles = mha_tiles_of(p.max_seqlen_k, C::kBlockN);  // no int overflow near 2^31
  const int64_t pairs = int64_t{p.h_kv} * p.b;
  const int group = p.causal && !p.deterministic ? mha_backward_launch_group(key_tiles, p.sm_count) : 1;
  if (pairs * key_tiles <= int64_t{UINT32_MAX}) {  // every realistic grid: 32-bit division
    const MhaBackwardBlock block = mha_backward_block<uint32_t>(static_cast<uint32_t>(linear), key_tiles,
                                                                static_cast<uint32_t>(pairs), group, p.deterministic);
    const auto pair = static_cast<uint32_t>(block.pair);
    w.kv_head = static_cast<int>(pair % static_cast<uint32_t>(p.h_kv));
    w.batch = static_cast<int>(pair / static_cast<uint32_t>(p.h_kv));
    w.key_tile = block.key_tile;
  } else {
    const MhaBackwardBlock block = mha_backward_block<int64_t>(linear, key_tiles, pairs, group, p.deterministic);
    w.kv_head = static_cast<int>(block.pair % p.h_kv);
    w.batch = static_cast<int>(block.pair / p.h_kv);
    w.key_tile = block.key_tile;
  }
  w.q_begin = p.cu_seqlens_q[w.batch];
  w.q_len = p.cu_seqlens_q[w.batch + 1] - w.q_begin;
  w.k_begin = p.cu_seqlens_k[w.batch];
  w.k_len = p.cu_seqlens_k[w.batch + 1] - w.k_begin;
  static_cast<MhaBackwardWalk&>(w) =
      mha_backward_walk(w.q_len, w.k_len, p.max_seqlen_q, p.max_seqlen_k, p.total_q - w.q_begin,
                        p.total_k - w.k_begin, p.causal, w.key_tile, C::kBlockM, C::kBlockN);
  return w;
}

// The CTA's work. Without a tail split the grid is (key tiles, h_kv, b) and its linear index
// the launch position; with one (params.tail_tiles > 0) the grid is one-dimensional, whole
// tiles first, then tail_pieces pieces of each tail tile, piece j walking the j-th share of
// the tile's steps (possibly none: its dK and dV are then zeros).
template <class C>
__device__ __forceinline__ BackwardWork backward_work(const MhaBackwardParams& p) {
  int64_t linear = blockIdx.x + int64_t{gridDim.x} * (blockIdx.y + int64_t{gridDim.y} * blockIdx.z);
  int piece = 0, pieces = 1, slot = -1;
  if (p.tail_tiles > 0 && linear >= p.whole_tiles) {  // one dimension of fewer than 2^31 CTAs
    const auto whole = static_cast<uint32_t>(p.whole_tiles);
    const uint32_t in_tail = blockIdx.x - whole;
    slot = static_cast<int>(in_tail);
    pieces = p.tail_pieces;
    linear = whole + in_tail / static_cast<uint32_t>(pieces);
    piece = static_cast<int>(in_tail % static_cast<uint32_t>(pieces));
  }
  BackwardWork w = backward_work_at<C>(p, linear);
  w.slot = slot;
  const int all = p.heads_per_kv * w.m_tiles;
  w.tile0 = static_cast<int>(int64_t{all} * piece / pieces);
  w.tiles = static_cast<int>(int64_t{all} * (piece + 1) / pieces) - w.tile0;
  return w;
}

template <class C>
__device__ __forceinline__ int last_key_tile(const MhaBackwardParams& p, const BackwardWork& w, int row0) {
  return mha_backward_last_key_tile(w, w.q_len, w.k_len, p.causal, row0, C::kBlockM, C::kBlockN);
}

// The CTA's step `it` (0 .. tiles - 1): its query head and first row within the sequence.
template <class C>
__device__ __forceinline__ int tile_head(const MhaBackwardParams& p, const BackwardWork& w, int it) {
  return w.kv_head * p.heads_per_kv + (w.tile0 + it) / w.m_tiles;
}
template <class C>
__device__ __forceinline__ int tile_row0(const BackwardWork& w, int it) {
  return (w.m_first + (w.tile0 + it) % w.m_tiles) * C::kBlockM;
}

}  // namespace mlakit::detail::mha_bwd_sm90
