// Whole sequences per part for the sparse decode without topk_length
// (host/decode_layout.h: whole_sequence_parts, make_sparse_decode_layout): the selection on
// the benchmark shapes and where it must not apply, checked against the schedule the CPU twin
// of the planner (schedule_on_host) computes for the chosen num_parts.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>

#include "host/decode_layout.h"
#include "host/scheduler.h"

namespace mlakit::detail {
namespace {

DeviceInfo h100() {
  return DeviceInfo{.ordinal = 0, .sm_count = 132, .cc_major = 9, .cc_minor = 0,
                    .max_smem_per_block_optin = 227 * 1024};
}

// What the kernels see of a schedule of `sequences` sequences of `length` keys each.
struct ScheduleStats {
  int32_t split_sequences = 0;  // sequences in >= 2 parts (partial stores + combine)
  int32_t max_splits = 0;       // of one sequence
  int64_t max_blocks = 0;       // key blocks (tiles) of the busiest part
  int64_t max_segments = 0;     // segments (Q load + output store) of one part
  int64_t max_cost = 0;         // blocks + overhead * segments of one part
  int64_t partial_slots = 0;    // partial-result slots the schedule uses
};

// The sparse decode's lengths (sparse_lengths in src/host/mla_sparse_decode.cpp) without
// topk_length: every scheduled sequence has topk keys.
SeqLengths uniform_lengths(int32_t topk) { return SeqLengths{nullptr, topk, 1, topk}; }

// Every part's segments as the kernels walk them (part_segments).
ScheduleStats schedule_stats(int64_t sequences, int32_t length, const ScheduleConfig& c) {
  const SeqLengths len = uniform_lengths(length);
  const DecodeSchedule s = schedule_on_host(len, sequences, c);
  ScheduleStats st;
  for (int64_t i = 0; i < sequences; ++i) {
    const int32_t splits = s.split_prefix[i + 1] - s.split_prefix[i];
    st.split_sequences += splits >= 2 ? 1 : 0;
    st.max_splits = std::max(st.max_splits, splits);
  }
  st.partial_slots = s.partial_prefix[sequences];
  for (const PartRange& r : s.parts) {
    int64_t blocks = 0, segments = 0;
    for (const ScheduledSegment& seg : part_segments(r, len, c.block_n)) {
      blocks += seg.block_end - seg.block_begin;
      ++segments;
    }
    st.max_blocks = std::max(st.max_blocks, blocks);
    st.max_segments = std::max(st.max_segments, segments);
    st.max_cost = std::max(st.max_cost, blocks + c.overhead_blocks * segments);
  }
  return st;
}

// When the selection says no_splits, the twin's schedule for its num_parts has every
// sequence whole in one part (split count 1, no partial slot) and part p holds exactly
// sequences [m p, m (p + 1)).
void expect_whole_sequences(int64_t sequences, int32_t length, const ScheduleConfig& chosen) {
  SCOPED_TRACE("sequences=" + std::to_string(sequences) + " length=" + std::to_string(length) +
               " num_parts=" + std::to_string(chosen.num_parts) + " overhead=" +
               std::to_string(chosen.overhead_blocks));
  ASSERT_EQ(sequences % chosen.num_parts, 0);
  const int64_t m = sequences / chosen.num_parts;
  const DecodeSchedule s = schedule_on_host(uniform_lengths(length), sequences, chosen);
  EXPECT_EQ(part_size(s.cost_prefix[sequences], chosen), m * (key_blocks(length, chosen.block_n) + chosen.overhead_blocks));
  for (int64_t i = 0; i <= sequences; ++i) {
    ASSERT_EQ(s.split_prefix[i], i) << "sequence " << i << " is split";
    ASSERT_EQ(s.partial_prefix[i], 0);
  }
  for (int32_t p = 0; p < chosen.num_parts; ++p) {
    const PartRange& r = s.parts[p];
    EXPECT_EQ(r.begin_seq, m * p) << "part " << p;
    EXPECT_EQ(r.begin_block, 0) << "part " << p;
    EXPECT_EQ(r.end_seq, m * (p + 1)) << "part " << p;
    EXPECT_EQ(r.end_block, 0) << "part " << p;
    EXPECT_EQ(r.begin_split, 0) << "part " << p;
  }
}

ScheduleConfig with_parts(ScheduleConfig c, int num_parts) {
  c.num_parts = num_parts;
  return c;
}

// b = 64 / 128, s_q = 2, h_q = 128, topk = 2048 on a 132-SM H100 with the Hopper kernel:
// 66 parts by default, the sparse decode's segment cost 5, 32 blocks per sequence.
TEST(WholeSequenceParts, BenchmarkShapesGet64PartsOfWholeSequences) {
  // The default schedule: the sparse plan made with topk_length (no whole-sequence choice).
  MlaDecodePlan varying;
  ASSERT_TRUE(make_sparse_decode_layout(MlaDecodeProblem{.b = 128, .s_q = 1, .h_q = 128, .h_kv = 1}, SparseKeyLists{.topk = 2048, .topk_length = true},
                                        h100(), MlaKernel::kSm90, &varying)
                  .is_ok());
  const ScheduleConfig def{
      .num_parts = varying.num_parts, .block_n = varying.block_n, .overhead_blocks = varying.overhead_blocks};
  ASSERT_EQ(def.num_parts, 66);
  ASSERT_EQ(def.overhead_blocks, 5);
  ASSERT_EQ(key_blocks(2048, def.block_n), 32);

  struct Expected {
    int64_t sequences;
    int64_t per_part;
    // The default schedule (docs/kernels/mla_sparse_decode_sm90.md, "Next steps").
    int32_t default_splits;
    int64_t default_segments;
  };
  for (const Expected& e : {Expected{128, 2, 56, 3}, Expected{256, 4, 55, 5}}) {
    SCOPED_TRACE("sequences=" + std::to_string(e.sequences));
    const WholeSequenceParts w = whole_sequence_parts(e.sequences, 32, def);
    EXPECT_EQ(w.num_parts, 64);
    EXPECT_TRUE(w.no_splits);

    const ScheduleStats before = schedule_stats(e.sequences, 2048, def);
    EXPECT_EQ(before.split_sequences, e.default_splits);
    EXPECT_EQ(before.max_blocks, 32 * e.per_part);
    EXPECT_EQ(before.max_segments, e.default_segments);

    const ScheduleConfig chosen = with_parts(def, w.num_parts);
    const ScheduleStats after = schedule_stats(e.sequences, 2048, chosen);
    EXPECT_EQ(after.split_sequences, 0);
    EXPECT_EQ(after.max_splits, 1);
    EXPECT_EQ(after.partial_slots, 0);
    EXPECT_EQ(after.max_blocks, before.max_blocks);  // the same tiles per CTA
    EXPECT_EQ(after.max_segments, e.per_part);       // one segment fewer
    // The balance condition: the busiest part costs at most the default's bound.
    EXPECT_LE(after.max_cost, part_size(e.sequences * 37, def) + def.overhead_blocks);
    expect_whole_sequences(e.sequences, 2048, chosen);
  }
}

TEST(WholeSequenceParts, NotWhenPartsCannotHoldEqualCounts) {
  // b = 74, s_q = 2: 148 sequences, m = 3 per part, 148 % 3 != 0: the default schedule.
  const ScheduleConfig def{.num_parts = 66, .block_n = 64, .overhead_blocks = 5};
  for (int64_t blocks : {1, 2, 9, 32}) {
    const WholeSequenceParts w = whole_sequence_parts(148, blocks, def);
    EXPECT_EQ(w.num_parts, 66) << blocks;
    EXPECT_FALSE(w.no_splits) << blocks;
  }
  // 130 sequences: m = 2, 65 parts.
  EXPECT_EQ(whole_sequence_parts(130, 32, def).num_parts, 65);
  EXPECT_TRUE(whole_sequence_parts(130, 32, def).no_splits);
  // Empty sequences (topk 0 is rejected by the entry points anyway) are the combine's to
  // write: never without it.
  EXPECT_FALSE(whole_sequence_parts(128, 0, def).no_splits);
  EXPECT_EQ(whole_sequence_parts(128, 0, def).num_parts, 66);
}

TEST(WholeSequenceParts, NotWhenItCostsBalance) {
  const ScheduleConfig def{.num_parts = 66, .block_n = 64, .overhead_blocks = 5};
  // 200 sequences of 32 blocks: m = 4 divides 200, but 4 * 37 = 148 > ceil(200 * 37 / 66) + 5
  // = 118: 50 parts would leave 16 SMs idle for a quarter more work each.
  WholeSequenceParts w = whole_sequence_parts(200, 32, def);
  EXPECT_EQ(w.num_parts, 66);
  EXPECT_FALSE(w.no_splits);
  EXPECT_GT(schedule_stats(200, 2048, def).split_sequences, 0);
}

// No more sequences than parts (m = 1): one sequence per part would leave SMs idle that the
// split schedule uses; the balance test rejects that for long sequences and accepts it only
// when the default parts hold a whole sequence's blocks anyway.
TEST(WholeSequenceParts, FewerSequencesThanPartsKeepTheSplitScheduleForLongSequences) {
  const ScheduleConfig def{.num_parts = 66, .block_n = 64, .overhead_blocks = 5};
  for (int64_t sequences : {1, 2, 4, 8, 16, 32, 48}) {
    SCOPED_TRACE("sequences=" + std::to_string(sequences));
    const WholeSequenceParts w = whole_sequence_parts(sequences, 32, def);
    EXPECT_EQ(w.num_parts, 66);
    EXPECT_FALSE(w.no_splits);
    // The default spreads them over (nearly) all parts: a CTA's blocks drop well below 32.
    const ScheduleStats st = schedule_stats(sequences, 2048, def);
    EXPECT_LT(st.max_blocks, 32);
    EXPECT_GT(st.split_sequences, 0);
  }
  // 64 sequences of 32 blocks: P_default = ceil(64 * 37 / 66) = 36 >= 32, whole sequences cost
  // at most one overhead more than the default's busiest part: 64 parts, none split (the
  // default splits some of them over the 2 spare parts for no gain).
  WholeSequenceParts w = whole_sequence_parts(64, 32, def);
  EXPECT_EQ(w.num_parts, 64);
  EXPECT_TRUE(w.no_splits);
  expect_whole_sequences(64, 2048, with_parts(def, 64));
  EXPECT_LE(schedule_stats(64, 2048, with_parts(def, 64)).max_cost,
            schedule_stats(64, 2048, def).max_cost + def.overhead_blocks);
  // One-block sequences cannot be split anyway: one part each.
  w = whole_sequence_parts(4, 1, def);
  EXPECT_EQ(w.num_parts, 4);
  EXPECT_TRUE(w.no_splits);
  expect_whole_sequences(4, 64, with_parts(def, 4));
}

TEST(WholeSequenceParts, ExactMultiplesKeepTheDefaultPartsWithoutSplits) {
  // 132 sequences over 66 parts: the default schedule already cuts on sequence boundaries.
  const ScheduleConfig def{.num_parts = 66, .block_n = 64, .overhead_blocks = 5};
  const WholeSequenceParts w = whole_sequence_parts(132, 32, def);
  EXPECT_EQ(w.num_parts, 66);
  EXPECT_TRUE(w.no_splits);
  expect_whole_sequences(132, 2048, def);
}

// Any selection that says no_splits is one the CPU twin agrees with, never has more parts than
// the default (so the default workspace fits it) and keeps the balance bound.
TEST(WholeSequenceParts, RandomSelectionsAreWholeAndBalanced) {
  std::mt19937_64 rng(0x5eed0042);
  int taken = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const int64_t sequences = std::uniform_int_distribution<int64_t>(1, 600)(rng);
    const int32_t length = std::uniform_int_distribution<int32_t>(1, 8192)(rng);
    const ScheduleConfig def{.num_parts = std::uniform_int_distribution<int>(1, 300)(rng),
                             .block_n = 64,
                             .overhead_blocks = std::uniform_int_distribution<int>(1, 8)(rng)};
    const int64_t blocks = key_blocks(length, def.block_n);
    const WholeSequenceParts w = whole_sequence_parts(sequences, blocks, def);
    ASSERT_GE(w.num_parts, 1);
    ASSERT_LE(w.num_parts, def.num_parts);
    if (!w.no_splits) {
      ASSERT_EQ(w.num_parts, def.num_parts);
      continue;
    }
    ++taken;
    const ScheduleConfig chosen = with_parts(def, w.num_parts);
    expect_whole_sequences(sequences, length, chosen);
    const int64_t cost = blocks + def.overhead_blocks;
    ASSERT_LE(sequences / w.num_parts * cost, part_size(sequences * cost, def) + def.overhead_blocks);
    if (::testing::Test::HasFailure()) return;
  }
  EXPECT_GT(taken, 100);  // the property was exercised
}

TEST(SparseDecodeLayout, WholeSequencesOnlyWithoutTopkLength) {
  // b 64 s_q 2 h_q 128 topk 2048 (the scheduled problem: 128 sequences of h_q rows).
  const MlaDecodeProblem scheduled{.b = 128, .s_q = 1, .h_q = 128, .h_kv = 1};
  MlaDecodePlan dense, uniform, varying;
  ASSERT_TRUE(make_decode_layout(scheduled, h100(), &dense, MlaKernel::kAuto).is_ok());
  ASSERT_TRUE(make_sparse_decode_layout(scheduled, SparseKeyLists{.topk = 2048, .topk_length = false}, h100(), MlaKernel::kAuto, &uniform).is_ok());
  ASSERT_TRUE(make_sparse_decode_layout(scheduled, SparseKeyLists{.topk = 2048, .topk_length = true}, h100(), MlaKernel::kAuto, &varying).is_ok());
  EXPECT_EQ(dense.num_parts, 66);
  EXPECT_FALSE(dense.no_splits);
  EXPECT_EQ(dense.sparse_topk, 0);

  EXPECT_EQ(uniform.kernel, MlaKernel::kSm90);
  EXPECT_EQ(uniform.num_parts, 64);
  EXPECT_TRUE(uniform.no_splits);
  EXPECT_EQ(uniform.sparse_topk, 2048);
  EXPECT_EQ(uniform.partial_slots, 128);  // regions laid out for the final num_parts
  // The workspace-size query (the default layout's) covers it.
  EXPECT_LE(uniform.workspace_bytes, dense.workspace_bytes);

  // topk_length given: lengths vary on the device, the default schedule.
  EXPECT_EQ(varying.num_parts, 66);
  EXPECT_FALSE(varying.no_splits);
  EXPECT_EQ(varying.sparse_topk, 2048);
  EXPECT_EQ(varying.workspace_bytes, dense.workspace_bytes);

  // The portable kernel (32 rows, 2 CTAs per SM: also 66 parts at h_q 128) gets the same.
  MlaDecodePlan portable;
  ASSERT_TRUE(make_sparse_decode_layout(scheduled, SparseKeyLists{.topk = 2048, .topk_length = false}, h100(), MlaKernel::kPortable, &portable).is_ok());
  EXPECT_EQ(portable.num_parts, 64);
  EXPECT_TRUE(portable.no_splits);
}

TEST(SparseDecodeLayout, SetNumPartsRelaysTheRegionsOut) {
  const MlaDecodeProblem p{.b = 256, .s_q = 1, .h_q = 128, .h_kv = 1};
  MlaDecodePlan a, b;
  ASSERT_TRUE(make_decode_layout(p, h100(), &a).is_ok());
  b = a;
  set_decode_num_parts(a.num_parts, &b);  // the same num_parts: the same layout
  EXPECT_EQ(b.workspace_bytes, a.workspace_bytes);
  EXPECT_EQ(b.partial_out_offset, a.partial_out_offset);
  EXPECT_EQ(b.partial_lse_offset, a.partial_lse_offset);
  set_decode_num_parts(64, &b);
  EXPECT_EQ(b.num_parts, 64);
  EXPECT_EQ(b.partial_slots, 128);
  EXPECT_LT(b.workspace_bytes, a.workspace_bytes);
  EXPECT_LE(b.partial_lse_offset + sizeof(float) * 128 * 128, b.workspace_bytes);
  EXPECT_LE(b.partial_out_offset + sizeof(float) * 128 * 128 * 512, b.partial_lse_offset);
}

}  // namespace
}  // namespace mlakit::detail
