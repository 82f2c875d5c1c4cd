// The walk of one key tile of the Hopper MHA backward (kernels/sm90/mha_backward/work.cuh):
// which query tiles see any of its keys, and, per query tile, the last key tile that adds into
// its dQ (the deterministic mode's order). Plain host-device arithmetic on one sequence's
// lengths, so the CPU tests check it against a brute-force visibility scan.
#pragma once

#include <cstdint>

#include "common/host_device.h"

namespace mlakit::detail {

struct MhaBackwardWalk {
  int q_rows = 0, k_rows = 0;    // rows inside max_seqlen_* and the tensors: the only ones touched
  int key0 = 0;                  // the key tile's first key
  int m_first = 0, m_tiles = 0;  // query tiles m_first .. m_first + m_tiles - 1 see one of its keys
  bool has_keys = false;         // key0 < k_rows: the tile's dK and dV are stored
};

// min(length, max_seqlen, room): room = the tensor's rows from the sequence's first one.
MLAKIT_HD int mha_rows_within(int length, int max_seqlen, int64_t room) {
  const int n = length < max_seqlen ? length : max_seqlen;
  return room < n ? static_cast<int>(room) : n;
}

// Key tile `key_tile` (block_n keys) of a sequence of q_len queries and k_len keys, query tiles
// of block_m rows; causal is bottom-right aligned (query t sees key j when j - t <= Lk - Lq).
MLAKIT_HD MhaBackwardWalk mha_backward_walk(int q_len, int k_len, int max_seqlen_q, int max_seqlen_k, int64_t room_q,
                                            int64_t room_k, bool causal, int key_tile, int block_m, int block_n) {
  MhaBackwardWalk w;
  w.q_rows = mha_rows_within(q_len, max_seqlen_q, room_q);
  w.k_rows = mha_rows_within(k_len, max_seqlen_k, room_k);
  w.key0 = key_tile * block_n;
  w.has_keys = w.key0 < w.k_rows;
  if (!w.has_keys) return w;
  // The first query that sees key0.
  int64_t first_row = causal ? int64_t{w.key0} - (int64_t{k_len} - q_len) : 0;
  if (first_row < 0) first_row = 0;
  if (first_row >= w.q_rows) return w;  // no query sees these keys: dK = dV = 0
  w.m_first = static_cast<int>(first_row / block_m);
  w.m_tiles = (w.q_rows + block_m - 1) / block_m - w.m_first;
  return w;
}

// The last key tile any query of the query tile at row0 (inside the sequence) sees: the key
// tiles that add into its dQ are 0 .. this one.
MLAKIT_HD int mha_backward_last_key_tile(const MhaBackwardWalk& w, int q_len, int k_len, bool causal, int row0,
                                         int block_m, int block_n) {
  int64_t last_key = w.k_rows - 1;
  if (causal) {
    const int64_t last_row = (row0 + block_m < w.q_rows ? row0 + block_m : w.q_rows) - 1;
    const int64_t seen = last_row + (int64_t{k_len} - q_len);
    if (seen < last_key) last_key = seen;
  }
  return static_cast<int>(last_key / block_n);
}

// The launch order of the main kernel's CTAs. The grid is (key_tiles, pairs) blocks, a pair
// being one (sequence, kv head): pair = kv_head + h_kv * sequence. The pairs are taken in
// groups of `group` (the last one may be smaller), and within a group key tile by key tile, so
// that with about one wave of CTAs per group (group = SMs / key tiles) a wave holds few heads
// (their Q and dO stay in L2) and the long walks of causal attention (key tile 0 sees every
// query tile) start before the short ones, not in the last wave. `reversed` (the deterministic
// mode) takes the key tiles from the last: a CTA then waits only on higher key tiles of its
// pair, which have lower block indices and are launched no later.
struct MhaBackwardBlock {
  int key_tile = 0;
  int64_t pair = 0;
};

// Index, given explicitly: int64_t, or uint32_t where the blocks number less than 2^32 (the
// kernels' CTA start: 64-bit division by a value known only at run time is a long instruction
// sequence, and the forward lost 1.3-1.6% on short CTAs to one in front of their first loads).
template <typename Index>
MLAKIT_HD MhaBackwardBlock mha_backward_block(Index linear, int key_tiles, Index pairs, int group,
                                              bool reversed) {
  const Index full = static_cast<Index>(group) * static_cast<Index>(key_tiles);  // blocks of a whole group
  const Index first_pair = linear / full * static_cast<Index>(group);
  const Index in_group = linear - first_pair * static_cast<Index>(key_tiles);
  const Index size = pairs - first_pair < static_cast<Index>(group) ? pairs - first_pair : static_cast<Index>(group);
  MhaBackwardBlock b;
  const int position = static_cast<int>(in_group / size);
  b.key_tile = reversed ? key_tiles - 1 - position : position;
  b.pair = static_cast<int64_t>(first_pair + in_group % size);
  return b;
}

// Pairs per group: about one wave of CTAs (one per SM), at least one pair.
MLAKIT_HD int mha_backward_launch_group(int key_tiles, int sm_count) {
  const int group = key_tiles > 0 ? sm_count / key_tiles : 1;
  return group > 1 ? group : 1;
}

}  // namespace mlakit::detail
