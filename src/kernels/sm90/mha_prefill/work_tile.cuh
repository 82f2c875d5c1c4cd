// Which query tile, head and sequence a CTA of the Hopper MHA prefill owns, and the key tiles
// it runs; producer and consumers compute it alike (they must agree on the tile count).
#pragma once

#include <cstdint>

#include "kernels/mha_prefill_params.h"

namespace mlakit::detail::mha_sm90 {

struct WorkTile {
  int m_block = 0;  // query tile within the sequence
  int head = 0, kv_head = 0, batch = 0;
  int q_begin = 0, k_begin = 0;  // rows of the sequence's first query / key in q / k
  int q_len = 0, k_len = 0;
  int q_rows = 0;  // rows written: q_len, cut at max_seqlen_q (the grid covers no more)
  int n_blocks = 0;  // key tiles 0 .. n_blocks - 1, run last first (the masked ones first)
  bool has_rows = false;  // the tile starts inside its sequence
};

// Grid (query tiles of max_seqlen_q, h_q, b). Causal tiles run longest first: blockIdx.x 0 is
// the last query tile, which sees the most keys.
template <class C>
__device__ __forceinline__ WorkTile work_tile(const MhaPrefillParams& p) {
  WorkTile w;
  const int m_tiles = static_cast<int>(gridDim.x);
  w.m_block = p.causal ? m_tiles - 1 - static_cast<int>(blockIdx.x) : static_cast<int>(blockIdx.x);
  w.head = static_cast<int>(blockIdx.y);
  w.kv_head = w.head / p.heads_per_kv;
  w.batch = static_cast<int>(blockIdx.z);
  w.q_begin = p.cu_seqlens_q[w.batch];
  w.q_len = p.cu_seqlens_q[w.batch + 1] - w.q_begin;
  w.k_begin = p.cu_seqlens_k[w.batch];
  w.k_len = p.cu_seqlens_k[w.batch + 1] - w.k_begin;
  w.q_rows = w.q_len < p.max_seqlen_q ? w.q_len : p.max_seqlen_q;
  const int row_begin = w.m_block * C::kBlockM;
  w.has_rows = row_begin < w.q_rows;
  if (!w.has_rows || w.k_len <= 0) return w;
  int n_blocks = (w.k_len + C::kBlockN - 1) / C::kBlockN;
  if (p.causal) {
    // Bottom-right aligned: the tile's last row sees keys up to row_last + k_len - q_len.
    const int row_last = (row_begin + C::kBlockM < w.q_len ? row_begin + C::kBlockM : w.q_len) - 1;
    const int64_t key_last = static_cast<int64_t>(row_last) + w.k_len - w.q_len;
    if (key_last < 0) return w;
    const int64_t causal_blocks = key_last / C::kBlockN + 1;
    if (causal_blocks < n_blocks) n_blocks = static_cast<int>(causal_blocks);
  }
  w.n_blocks = n_blocks;
  return w;
}

}  // namespace mlakit::detail::mha_sm90
