// Tiling and workspace of the MHA prefill backward (include/mlakit/mha_prefill.h), shared by
// the host (workspace size) and the kernels (where each part lives), so the two cannot drift.
//
// The workspace, each part 256-byte aligned:
//   dq_accum  float32 dq / softmax_scale summed over key tiles: [total_q, h_q, d_qk] for the
//             portable main kernel, in query tiles for the Hopper one (below); sized for both
//             where the Hopper one may run
//   row_dot   float32 [h_q, total_q]        D = rowsum(dout * out) per query row
//   counters  int32   [b, h_q, query tiles of max_seqlen_q]  (deterministic mode only): how
//             many key tiles have added into a query tile's dq_accum rows, which orders them
// E.g. total_q 16384, h_q 32, d 128, b 4, max_seqlen_q 4096, deterministic: dq_accum 260 MiB
// (260 slots of 64 rows; 256 MiB in rows), row_dot 2 MiB, counters 4 * 32 * 64 * 4 = 32 KiB.
#pragma once

#include <cstdint>

#include "common/host_device.h"
#include "common/mha_prefill_tiling.h"

namespace mlakit::detail {

// Query rows per tile of the portable main kernel: its register budget holds dK and dV of the
// CTA's keys (d_qk + d_v columns) beside the scores of one query tile, so wider heads take
// shorter query tiles. Also the deterministic counters' unit: the Hopper kernel's tiles
// (kMhaBackwardSm90QueryRows, never shorter) index the same counters, a prefix of each row.
MLAKIT_HD constexpr int mha_backward_query_rows(int d_qk) { return d_qk <= 128 ? 64 : 32; }

// The portable main kernel's tiling per head-dim pair (mha_backward_kernel.cuh explains it).
// kBulkDq (sm90): dQ units go through a per-warp staging area in shared memory and are added
// into dq_accum by bulk reductions (one per row) instead of one reduction per value.
template <int Dqk, int Dv, bool kBulkDqArg = false>
struct MhaBackwardConfig {
  static constexpr bool kBulkDq = kBulkDqArg;
  static constexpr int kDqk = Dqk;
  static constexpr int kDv = Dv;
  static constexpr int kElemBytes = 2;
  // 8 warps of 16 keys (128 keys: half the dQ reductions per FLOP of 64); at d 256 two warps
  // per 16 keys, each holding half of dK's and dV's columns.
  static constexpr int kKeyGroups = Dqk >= 256 ? 4 : 8;
  static constexpr int kDSplit = Dqk >= 256 ? 2 : 1;
  static constexpr int kWarps = kKeyGroups * kDSplit;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kKeys = 16 * kKeyGroups;
  static constexpr int kRows = mha_backward_query_rows(Dqk);
  static constexpr int kDkCols = Dqk / kDSplit;  // dK columns per warp
  static constexpr int kDvCols = Dv / kDSplit;
  static constexpr int kQkRowBytes = Dqk * kElemBytes;
  static constexpr int kVRowBytes = Dv * kElemBytes;
  static constexpr int kQkChunks = kQkRowBytes / 16;
  static constexpr int kVChunks = kVRowBytes / 16;
  static constexpr int kScoreTiles = kRows / 8;  // n8 tiles of S^T per warp
  // dS^T rows: kRows values plus 16 bytes, so the 8 rows of an ldmatrix matrix and the
  // accumulators' 4-byte stores fall in distinct banks.
  static constexpr int kDsRowBytes = kRows * kElemBytes + 16;
  static constexpr int kDqUnitCols = 64;  // dQ is computed and added in 16 x 64 units
  static constexpr int kDqUnits = kRows / 16 * (Dqk / kDqUnitCols);
  // Shared memory, byte offsets (each swizzled tile a multiple of 128 bytes).
  static constexpr int kKOffset = 0;
  static constexpr int kVOffset = kKOffset + kKeys * kQkRowBytes;
  static constexpr int kQBytes = kRows * kQkRowBytes;
  static constexpr int kOBytes = kRows * kVRowBytes;
  static constexpr int kQOffset = kVOffset + kKeys * kVRowBytes;  // [2] buffers
  static constexpr int kOOffset = kQOffset + 2 * kQBytes;          // dO, [2] buffers
  static constexpr int kDsOffset = kOOffset + 2 * kOBytes;
  static constexpr int kLseOffset = kDsOffset + kKeys * kDsRowBytes;  // float [2][kRows]
  static constexpr int kDOffset = kLseOffset + 2 * kRows * 4;          // float [2][kRows]
  // dQ staging, one 16 x 64 float unit per warp; rows padded to 288 bytes (72 words: the
  // accumulators' 8-byte stores of rows g = 0..7 start 8 banks apart).
  static constexpr int kStageRowBytes = kDqUnitCols * 4 + 32;
  static constexpr int kStageOffset = kDOffset + 2 * kRows * 4;
  static constexpr int kStageBytes = kBulkDq ? kWarps * 16 * kStageRowBytes : 0;
  static constexpr int kSmemBytes = kStageOffset + kStageBytes;
  // Per-block opt-in limit of sm80 without the staging, of sm90 with it (sm86 / sm89: 99 KB,
  // which d 128 exceeds: the host checks the device's limit, mha_backward_smem_bytes).
  static constexpr int kSmemLimitBytes = (kBulkDq ? 227 : 163) * 1024;
  static constexpr int kMinBlocks = 1;  // 255 registers per thread (256 threads)

  static_assert(Dqk % 64 == 0 && Dv % 64 == 0, "rows of whole 128-byte lines");
  static_assert(Dv % (16 * kDSplit) == 0 && Dqk % (16 * kDSplit) == 0, "whole n16 steps per column slice");
  static_assert(kRows % 16 == 0 && kRows % (kThreads / 8) == 0 && kKeys % (kThreads / 8) == 0,
                "whole row steps of copy_rows");
  static_assert(kSmemBytes <= kSmemLimitBytes, "one CTA fits sm80 and sm90");
};

// Dynamic shared memory of the main kernel for a supported (d_qk, d_v) pair (0 otherwise).
template <bool kBulkDq>
int mha_backward_smem_bytes(int d_qk, int d_v) {
  if (d_qk == 64 && d_v == 64) return MhaBackwardConfig<64, 64, kBulkDq>::kSmemBytes;
  if (d_qk == 128 && d_v == 128) return MhaBackwardConfig<128, 128, kBulkDq>::kSmemBytes;
  if (d_qk == 192 && d_v == 128) return MhaBackwardConfig<192, 128, kBulkDq>::kSmemBytes;
  if (d_qk == 256 && d_v == 256) return MhaBackwardConfig<256, 256, kBulkDq>::kSmemBytes;
  return 0;
}
inline int mha_backward_smem_bytes(int d_qk, int d_v, bool bulk_dq) {
  return bulk_dq ? mha_backward_smem_bytes<true>(d_qk, d_v) : mha_backward_smem_bytes<false>(d_qk, d_v);
}

// Head dims the Hopper main kernel serves (src/kernels/sm90/launch.h adds the grid's limits).
// d 256's dK and dV (256 accumulators a thread) do not fit its consumers' registers.
MLAKIT_HD constexpr bool mha_backward_hopper_dims(int d_qk, int d_v) {
  return ((d_qk == 128 || d_qk == 192) && d_v == 128) || (d_qk == 64 && d_v == 64);
}

// The Hopper main kernel's query tiles: 64 rows at every head dim it serves (one m64 wgmma of
// dQ per tile; at d_qk 192 it computes the scores over two 32-row halves instead).
inline constexpr int kMhaBackwardSm90QueryRows = 64;
// Its tiles index the deterministic counters, which are sized by the portable kernel's tiles.
static_assert(kMhaBackwardSm90QueryRows >= mha_backward_query_rows(64) &&
                  kMhaBackwardSm90QueryRows >= mha_backward_query_rows(128) &&
                  kMhaBackwardSm90QueryRows >= mha_backward_query_rows(192),
              "the Hopper kernel's query tiles are never shorter than the counters' (a prefix of each row)");

// The Hopper main kernel's dq_accum, in its query tiles ("slots" of rows = 64):
// sequence s (first row c = cu_seqlens_q[s]) has its tile j in slot c / rows + s + j. Slots of
// different sequences never meet: a sequence of n rows ends before slot (c + n) / rows + s + 1,
// the next one's first; the last ends before total_q / rows + b. Per slot and query head a
// block of rows x d_qk floats in two parts, one per consumer warpgroup, each in the wgmma
// accumulators' fragment order (float2 (i / 2) * 128 + t holds registers i, i + 1 of thread t
// of the warpgroup, device/sm90/wgmma_fragment.cuh; mha_backward_dq_part_column says which
// column): the kernel stages a tile's dQ with conflict-free stores and adds it with one bulk
// reduction; rows past the sequence add zeros into slot rows nobody reads.
MLAKIT_HD constexpr int64_t mha_backward_dq_slots(int64_t b, int64_t total_q) {
  return total_q == 0 ? 0 : total_q / kMhaBackwardSm90QueryRows + b;
}
MLAKIT_HD constexpr int64_t mha_backward_dq_slot(int64_t first_row, int64_t sequence, int64_t tile) {
  return first_row / kMhaBackwardSm90QueryRows + sequence + tile;
}
// Float offset of (slot, query head)'s block.
MLAKIT_HD constexpr int64_t mha_backward_dq_block(int64_t slot, int64_t head, int h_q, int d_qk) {
  return (slot * h_q + head) * kMhaBackwardSm90QueryRows * d_qk;
}
// dQ columns of a slot part's main accumulator: a 64-column K slab (d_qk 128, 192), or half
// of the one slab at d_qk 64.
MLAKIT_HD constexpr int mha_backward_dq_main_columns(int d_qk) { return d_qk / 2 < 64 ? d_qk / 2 : 64; }

// The dQ column of a slot part's column c (0 .. d_qk / 2 - 1; c = acc_col of the register's
// index within the part): consumer `part` computes the main columns `part` (K slab `part`, or
// at d_qk 64 half `part` of slab 0) and, at d_qk 192, the half `part` of slab 2 (32 columns)
// as a second accumulator after the first.
MLAKIT_HD constexpr int mha_backward_dq_part_column(int d_qk, int part, int c) {
  const int main = mha_backward_dq_main_columns(d_qk);
  const int tail = d_qk / 2 - main;
  return c < main ? main * part + c : 2 * main + tail * part + (c - main);
}

// Every sequence takes whole slots, so many short ones multiply the accumulator (b 8192
// one-token sequences at h_q 32: 8 GiB of slots against 128 MiB of rows). The workspace holds
// slots (and the Hopper kernel runs) only where they take at most twice the rows' floats or
// 64 MiB; elsewhere the portable kernels run. The Hopper grid's b <= 65535 also bounds the
// slots' size (no overflow: total_q * h_q * d_qk is addressable, b * h_q * 64 * d_qk floats <
// 2^61).
inline constexpr int64_t kMhaBackwardDqSlotsAnyBytes = int64_t{64} << 20;
MLAKIT_HD constexpr int64_t mha_backward_dq_slots_within_bounds(int64_t b, int64_t total_q, int h_q, int d_qk) {
  if (b > 65535) return 0;
  const int64_t slots = mha_backward_dq_slots(b, total_q);
  const int64_t slot_floats = mha_backward_dq_block(slots, 0, h_q, d_qk);
  const bool fits = slot_floats <= 2 * total_q * h_q * d_qk || slot_floats * 4 <= kMhaBackwardDqSlotsAnyBytes;
  return fits ? slots : 0;
}

struct MhaBackwardWorkspace {
  int64_t dq_accum_offset = 0;  // bytes from the workspace's start
  int64_t row_dot_offset = 0;
  int64_t counters_offset = 0;
  int64_t counters = 0;  // int32 counters (0 without the deterministic mode)
  int64_t dq_slots = 0;  // query-tile slots of the Hopper kernel's dq_accum (0: not sized for it: no Hopper kernel)
  int64_t partial_kv_offset = 0;  // the Hopper kernel's tail split (mha_backward_add_tail_split)
  int64_t partial_kv_slots = 0;   // 0: no split possible
  int64_t bytes = 0;     // total
};

inline constexpr int64_t kMhaBackwardAlignment = 256;

MLAKIT_HD constexpr int64_t mha_backward_align(int64_t bytes) {
  return (bytes + kMhaBackwardAlignment - 1) / kMhaBackwardAlignment * kMhaBackwardAlignment;
}

MLAKIT_HD constexpr int64_t mha_backward_query_tiles(int max_seqlen_q, int d_qk) {
  return (static_cast<int64_t>(max_seqlen_q) + mha_backward_query_rows(d_qk) - 1) / mha_backward_query_rows(d_qk);
}

// Index of the deterministic counter of (sequence, query head, query tile) among the
// workspace's counters [b, h_q, query_tiles].
MLAKIT_HD constexpr int64_t mha_backward_counter(int64_t sequence, int64_t head, int h_q, int64_t query_tiles,
                                                 int64_t tile) {
  return (sequence * h_q + head) * query_tiles + tile;
}

// The byte sizes cannot overflow: every extent was checked to fit its tensor (total_q * h_q *
// d_qk elements addressable), b, h_q, max_seqlen_q are ints, and the slots are bounded above.
MLAKIT_HD constexpr MhaBackwardWorkspace mha_backward_workspace(int64_t b, int64_t total_q, int h_q,
                                                                         int d_qk, int d_v, int max_seqlen_q,
                                                                         bool deterministic) {
  MhaBackwardWorkspace w;
  w.dq_accum_offset = 0;
  w.dq_slots = mha_backward_hopper_dims(d_qk, d_v) ? mha_backward_dq_slots_within_bounds(b, total_q, h_q, d_qk) : 0;
  const int64_t row_floats = total_q * h_q * d_qk;
  const int64_t tile_floats = mha_backward_dq_block(w.dq_slots, 0, h_q, d_qk);
  w.row_dot_offset = mha_backward_align((row_floats > tile_floats ? row_floats : tile_floats) * 4);
  w.counters_offset = w.row_dot_offset + mha_backward_align(total_q * h_q * 4);
  w.counters = deterministic ? b * h_q * mha_backward_query_tiles(max_seqlen_q, d_qk) : 0;
  w.bytes = w.counters_offset + mha_backward_align(w.counters * 4);
  return w;
}

// The Hopper main kernel's tail split (common/mha_prefill_tiling.h): without causal, the key
// tiles of its last wave run in pieces over their steps, the (query head, query tile) pairs of
// the walk, each piece's dK (times the scale) and dV in float32 into a slot of
// partial_kv [slots, kMhaBackwardSm90KeyRows, d_qk + d_v], summed in piece order by a combine.
// The steps a key tile may walk: its query heads times the query tiles of max_seqlen_q.
inline constexpr int kMhaBackwardSm90KeyRows = 128;  // keys per CTA (its K / V maps' boxes)
MLAKIT_HD constexpr int64_t mha_backward_tail_steps(int heads_per_kv, int max_seqlen_q) {
  return static_cast<int64_t>(heads_per_kv) * mha_tiles_of(max_seqlen_q, kMhaBackwardSm90QueryRows);
}
MLAKIT_HD constexpr int64_t mha_backward_partial_kv_floats(int64_t slots, int d_qk, int d_v) {
  return slots * kMhaBackwardSm90KeyRows * (d_qk + d_v);
}
// `w` with room for the split's slots where one can happen (dims the Hopper kernel serves,
// without causal, enough steps): kMhaPrefillTailSlots of them, whatever the GPU.
MLAKIT_HD constexpr MhaBackwardWorkspace mha_backward_add_tail_split(MhaBackwardWorkspace w, int d_qk, int d_v,
                                                                     int heads_per_kv, int max_seqlen_q, bool causal) {
  if (!mha_backward_hopper_dims(d_qk, d_v) || causal ||
      mha_backward_tail_steps(heads_per_kv, max_seqlen_q) < 2 * kMhaPrefillMinKeyTilesPerPiece) {
    return w;
  }
  w.partial_kv_offset = w.bytes;
  w.partial_kv_slots = kMhaPrefillTailSlots;
  w.bytes += mha_backward_align(mha_backward_partial_kv_floats(w.partial_kv_slots, d_qk, d_v) * 4);
  return w;
}

}  // namespace mlakit::detail
