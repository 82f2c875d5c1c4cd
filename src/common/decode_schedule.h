// The split-KV schedule of the MLA decode, as pure integer functions shared by the device
// planner (src/kernels/schedule/decode_plan.cu) and its CPU twin (src/host/scheduler.cpp):
// both evaluate exactly these functions, so their outputs are bit-identical.
//
// Model. Sequence i has n_i = ceil(L_i / block_n) key blocks and costs n_i + overhead units
// (the overhead stands for loading Q, writing a partial result and combining it). Laying the
// costs of all sequences end to end gives a "cost line" of total length T; its first
// `overhead` units of each sequence carry no block, then block j of sequence i sits at
// position C_i + overhead + j (C_i the exclusive prefix of costs). The line is cut into
// num_parts equal pieces of P = ceil(T / num_parts) units; part p (one CTA per kv head and
// row tile) processes the blocks whose positions fall in [p*P, (p+1)*P).
//
// Why: every part gets at most P units of blocks-plus-overheads plus the overhead of the one
// sequence it continues from the previous part, so the work is balanced within one overhead,
// and each part's range follows from a binary search, so the device computes all parts in
// parallel.
//
// Worked example: lengths {100, 0, 300}, block_n 64, overhead 2, num_parts 3.
//   blocks n = {2, 0, 5}; costs {4, 2, 7}; C = {0, 4, 6}; T = 13; P = 5.
//   positions: seq0 blocks at 2,3; seq2 blocks at 8..12.
//   part 0 [0,5): seq0 blocks 0-1.  part 1 [5,10): seq2 blocks 0-1.  part 2 [10,15): seq2 2-4.
//   splits = {1, 0, 2}; seq2's partial results are merged by the combine kernel.
#pragma once

#include <cstdint>

#include "common/host_device.h"

namespace mlakit::detail {

// Per-part work range: blocks [begin, end) in (sequence, block) lexicographic order.
// Stored as kPartRangeInts int32 per part in the workspace.
struct PartRange {
  int32_t begin_seq;
  int32_t begin_block;
  int32_t end_seq;     // may equal b (then end_block is 0)
  int32_t end_block;
  int32_t begin_split; // split index of the first segment within begin_seq
  int32_t reserved[3];
};
inline constexpr int kPartRangeInts = 8;
static_assert(sizeof(PartRange) == kPartRangeInts * sizeof(int32_t), "PartRange layout");

// Length of scheduled sequence i: lengths[i / divisor] (`fixed` when lengths is null),
// clamped to [0, cap]. The dense decode schedules its sequences; the sparse decode schedules
// one "sequence" per (batch entry, query token), of length topk_length[b] or topk, plus, with a
// second cache, extra_topk_length[b] or extra_topk (its keys follow the first cache's: key
// positions [first(i), first(i) + extra(i))).
struct SeqLengths {
  const int32_t* lengths;
  int32_t fixed;
  int32_t divisor;
  int32_t cap;
  const int32_t* extra_lengths = nullptr;
  int32_t extra_fixed = 0;
  int32_t extra_cap = 0;
  MLAKIT_HD static int32_t clamp(int32_t l, int32_t cap) { return l < 0 ? 0 : (l > cap ? cap : l); }
  // Keys from the first (or only) key source.
  MLAKIT_HD int32_t first(int64_t i) const { return clamp(lengths != nullptr ? lengths[i / divisor] : fixed, cap); }
  MLAKIT_HD int32_t extra(int64_t i) const {
    return clamp(extra_lengths != nullptr ? extra_lengths[i / divisor] : extra_fixed, extra_cap);
  }
  // cap + extra_cap <= 2^21 where both are used (topk, extra_topk <= 2^20): no overflow.
  MLAKIT_HD int32_t operator()(int64_t i) const { return extra_cap > 0 ? first(i) + extra(i) : first(i); }
};
MLAKIT_HD SeqLengths dense_lengths(const int32_t* seqlens) { return SeqLengths{seqlens, 0, 1, 0x7fffffff}; }

struct ScheduleConfig {
  int num_parts;        // >= 1
  int block_n;          // keys per scheduling block, >= 1
  int overhead_blocks;  // cost of one segment beyond its blocks, >= 1
};

MLAKIT_HD int64_t key_blocks(int32_t seqlen, int block_n) {
  return seqlen <= 0 ? 0 : (static_cast<int64_t>(seqlen) + block_n - 1) / block_n;
}

MLAKIT_HD int64_t sequence_cost(int32_t seqlen, const ScheduleConfig& c) {
  return key_blocks(seqlen, c.block_n) + c.overhead_blocks;
}

// Units per part: ceil(total / num_parts), at least 1.
MLAKIT_HD int64_t part_size(int64_t total_cost, const ScheduleConfig& c) {
  int64_t p = (total_cost + c.num_parts - 1) / c.num_parts;
  return p < 1 ? 1 : p;
}

// First and last part holding a block of a sequence with `blocks` > 0 blocks whose cost
// starts at `cost_begin`.
MLAKIT_HD int32_t first_part(int64_t cost_begin, const ScheduleConfig& c, int64_t psize) {
  return static_cast<int32_t>((cost_begin + c.overhead_blocks) / psize);
}
MLAKIT_HD int32_t last_part(int64_t cost_begin, int64_t blocks, const ScheduleConfig& c,
                            int64_t psize) {
  return static_cast<int32_t>((cost_begin + c.overhead_blocks + blocks - 1) / psize);
}

// Number of parts (splits) a sequence is cut into; 0 for an empty sequence.
MLAKIT_HD int32_t sequence_splits(int64_t cost_begin, int64_t blocks, const ScheduleConfig& c,
                                  int64_t psize) {
  if (blocks == 0) return 0;
  return last_part(cost_begin, blocks, c, psize) - first_part(cost_begin, c, psize) + 1;
}

// Slots a sequence needs in the partial-result buffers: only split sequences are combined.
MLAKIT_HD int32_t partial_slots(int32_t splits) { return splits >= 2 ? splits : 0; }

// The first block at a cost position >= x, as (seq, block); (b, 0) when none.
// `cost_prefix` holds the b + 1 exclusive prefix sums of sequence costs; `len` the
// lengths. Binary search for the last sequence whose cost starts at or before x, then skip
// forward past sequences whose blocks all lie before x (only empty ones, in practice).
MLAKIT_HD void first_block_at_or_after(int64_t x, const int64_t* cost_prefix,
                                       const SeqLengths& len, int64_t b,
                                       const ScheduleConfig& c, int32_t* seq,
                                       int32_t* block) {
  int64_t lo = 0, hi = b;  // invariant: cost_prefix[lo] <= x (or lo == 0), answer in [lo, b]
  while (hi - lo > 1) {
    int64_t mid = lo + (hi - lo) / 2;
    if (cost_prefix[mid] <= x) lo = mid; else hi = mid;
  }
  for (int64_t i = lo; i < b; ++i) {
    int64_t first_pos = cost_prefix[i] + c.overhead_blocks;
    int64_t j = x > first_pos ? x - first_pos : 0;
    if (j < key_blocks(len(i), c.block_n)) {
      *seq = static_cast<int32_t>(i);
      *block = static_cast<int32_t>(j);
      return;
    }
  }
  *seq = static_cast<int32_t>(b);
  *block = 0;
}

// The work range of part p.
MLAKIT_HD PartRange part_range(int32_t p, const int64_t* cost_prefix, const SeqLengths& len,
                               int64_t b, const ScheduleConfig& c, int64_t psize) {
  PartRange r{};
  first_block_at_or_after(static_cast<int64_t>(p) * psize, cost_prefix, len, b, c,
                          &r.begin_seq, &r.begin_block);
  first_block_at_or_after(static_cast<int64_t>(p + 1) * psize, cost_prefix, len, b, c,
                          &r.end_seq, &r.end_block);
  r.begin_split = 0;
  bool empty = r.begin_seq == r.end_seq && r.begin_block == r.end_block;
  if (!empty) {
    r.begin_split = p - first_part(cost_prefix[r.begin_seq], c, psize);
  }
  return r;
}

}  // namespace mlakit::detail
