// Which keys a CTA of the Hopper MHA backward owns and which query tiles it runs; producer and
// consumers compute it alike (they must agree on the tile sequence).
#pragma once

#include <cstdint>

#include "kernels/mha_backward_params.h"

namespace mlakit::detail::mha_bwd_sm90 {

struct BackwardWork {
  int kv_head = 0, batch = 0;
  int q_begin = 0, k_begin = 0;  // rows of the sequence's first query / key in q / k
  int q_len = 0, k_len = 0;      // the sequence's lengths (the causal diagonal's offset)
  int q_rows = 0, k_rows = 0;    // rows inside max_seqlen_* and the tensors: the only ones touched
  int key_tile = 0;              // the CTA's 128-key tile within the sequence
  int key0 = 0;                  // its first key
  int m_first = 0, m_tiles = 0;  // query tiles m_first .. m_first + m_tiles - 1 of every query head
  int tiles = 0;                 // heads_per_kv * m_tiles, in the order (head, query tile)
  bool has_keys = false;         // key0 < k_rows: the CTA stores dK and dV
};

__device__ __forceinline__ int rows_within(int length, int max_seqlen, int64_t room) {
  const int n = length < max_seqlen ? length : max_seqlen;
  return room < n ? static_cast<int>(room) : n;
}

// Grid (key tiles of max_seqlen_k, h_kv, b); in the deterministic mode x runs over the key
// tiles backwards (as the portable kernel's): a key tile waits on the query tiles' counters only
// for higher key tiles, which have lower block indices and never wait on it.
template <class C>
__device__ __forceinline__ BackwardWork backward_work(const MhaBackwardParams& p) {
  BackwardWork w;
  w.kv_head = static_cast<int>(blockIdx.y);
  w.batch = static_cast<int>(blockIdx.z);
  w.q_begin = p.cu_seqlens_q[w.batch];
  w.q_len = p.cu_seqlens_q[w.batch + 1] - w.q_begin;
  w.k_begin = p.cu_seqlens_k[w.batch];
  w.k_len = p.cu_seqlens_k[w.batch + 1] - w.k_begin;
  w.q_rows = rows_within(w.q_len, p.max_seqlen_q, p.total_q - w.q_begin);
  w.k_rows = rows_within(w.k_len, p.max_seqlen_k, p.total_k - w.k_begin);
  w.key_tile = p.deterministic ? static_cast<int>(gridDim.x - 1 - blockIdx.x) : static_cast<int>(blockIdx.x);
  w.key0 = w.key_tile * C::kBlockN;
  w.has_keys = w.key0 < w.k_rows;
  if (!w.has_keys) return w;
  // Query t sees key j when j <= t + Lk - Lq: the first query that sees key0.
  int64_t first_row = p.causal ? int64_t{w.key0} - (int64_t{w.k_len} - w.q_len) : 0;
  if (first_row < 0) first_row = 0;
  if (first_row >= w.q_rows) return w;  // no query sees these keys: dK = dV = 0
  w.m_first = static_cast<int>(first_row / C::kBlockM);
  w.m_tiles = (w.q_rows + C::kBlockM - 1) / C::kBlockM - w.m_first;
  w.tiles = p.heads_per_kv * w.m_tiles;
  return w;
}

// The last key tile any query of the query tile at row0 sees: the key tiles that add into its
// dQ are 0 .. this one (deterministic mode: they add from it down to 0).
template <class C>
__device__ __forceinline__ int last_key_tile(const MhaBackwardParams& p, const BackwardWork& w, int row0) {
  int64_t last_key = w.k_rows - 1;
  if (p.causal) {
    const int64_t last_row = (row0 + C::kBlockM < w.q_rows ? row0 + C::kBlockM : w.q_rows) - 1;
    const int64_t seen = last_row + (int64_t{w.k_len} - w.q_len);
    if (seen < last_key) last_key = seen;
  }
  return static_cast<int>(last_key / C::kBlockN);
}

// Tile `it` of the walk: its query head and first row within the sequence.
template <class C>
__device__ __forceinline__ int tile_head(const MhaBackwardParams& p, const BackwardWork& w, int it) {
  return w.kv_head * p.heads_per_kv + it / w.m_tiles;
}
template <class C>
__device__ __forceinline__ int tile_row0(const BackwardWork& w, int it) {
  return (w.m_first + it % w.m_tiles) * C::kBlockM;
}

}  // namespace mlakit::detail::mha_bwd_sm90
