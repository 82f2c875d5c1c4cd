// The MHA backward's host-side tiling (src/common/mha_backward_tiling.h): the workspace layout
// both the host (size) and the kernels (offsets) read, the query tile per head dims, and the
// shared memory each main-kernel config asks for against the devices' per-block limits.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "common/mha_backward_tiling.h"

namespace mlakit::detail {
namespace {

constexpr int64_t kMiB = 1024 * 1024;

// The worked example of the header comment: b 4, total_q 16384, h_q 32, d_qk 128,
// max_seqlen_q 4096.
TEST(MhaBackwardTiling, WorkspaceOfTheWorkedExample) {
  const MhaBackwardWorkspace w = mha_backward_workspace(4, 16384, 32, 128, 128, 4096, /*deterministic=*/true);
  EXPECT_EQ(w.dq_accum_offset, 0);
  EXPECT_EQ(w.dq_slots, 16384 / 64 + 4);
  EXPECT_EQ(w.row_dot_offset, 260 * kMiB);               // dq_accum: 260 slots x 32 heads x 64 x 128 floats
  EXPECT_EQ(w.counters_offset, 260 * kMiB + 2 * kMiB);   // row_dot: 32 * 16384 floats
  EXPECT_EQ(w.counters, 4 * 32 * (4096 / 64));           // 64-row query tiles at d_qk 128
  EXPECT_EQ(w.bytes, w.counters_offset + 32 * 1024);
  // d 192 / 128: the same 64-row slots, 192 columns; counters per 32-row tile (the portable
  // kernel's), of which the Hopper kernel uses every other one's index range.
  const MhaBackwardWorkspace wide = mha_backward_workspace(4, 16384, 32, 192, 128, 4096, true);
  EXPECT_EQ(wide.dq_slots, 260);
  EXPECT_EQ(wide.row_dot_offset, 390 * kMiB);  // 260 slots x 32 heads x 64 x 192 floats
  EXPECT_EQ(wide.counters, 4 * 32 * (4096 / 32));
  // Head dims the Hopper kernel does not serve: dq_accum in rows only.
  const MhaBackwardWorkspace rows = mha_backward_workspace(4, 16384, 32, 256, 256, 4096, false);
  EXPECT_EQ(rows.dq_slots, 0);
  EXPECT_EQ(rows.row_dot_offset, 512 * kMiB);  // 16384 * 32 * 256 floats
}

// The slot parts' columns: consumer g holds K slab g (64 columns) and, at d_qk 192, half g of
// slab 2 (at d_qk 64, half g of the one slab); together the two parts hold every column once.
TEST(MhaBackwardTiling, DqPartsCoverEveryColumnOnce) {
  for (int d_qk : {64, 128, 192}) {
    std::vector<int> seen(static_cast<size_t>(d_qk), 0);
    for (int part = 0; part < 2; ++part) {
      for (int c = 0; c < d_qk / 2; ++c) {
        const int col = mha_backward_dq_part_column(d_qk, part, c);
        ASSERT_GE(col, 0);
        ASSERT_LT(col, d_qk) << "d_qk " << d_qk << " part " << part << " c " << c;
        ++seen[static_cast<size_t>(col)];
      }
    }
    for (int col = 0; col < d_qk; ++col) EXPECT_EQ(seen[static_cast<size_t>(col)], 1) << "d_qk " << d_qk << " col " << col;
  }
  EXPECT_EQ(mha_backward_dq_part_column(192, 0, 64), 128);
  EXPECT_EQ(mha_backward_dq_part_column(192, 1, 64), 160);
  EXPECT_EQ(mha_backward_dq_part_column(192, 1, 63), 127);
  EXPECT_EQ(mha_backward_dq_part_column(128, 1, 0), 64);
  EXPECT_EQ(mha_backward_dq_part_column(64, 1, 0), 32);
  EXPECT_EQ(mha_backward_dq_part_column(64, 0, 31), 31);
}

// Slots of the Hopper kernel's dq_accum: every query tile of every sequence gets its own, all
// below dq_slots, for random varlen batches (a brute-force check of the header's argument).
TEST(MhaBackwardTiling, DqSlotsOfDifferentSequencesNeverMeet) {
  uint64_t state = 12345;
  auto next = [&](int bound) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<int>((state >> 33) % static_cast<uint64_t>(bound));
  };
  for (int trial = 0; trial < 500; ++trial) {
    const int b = 1 + next(9);
    std::vector<int64_t> cu(b + 1, 0);
    for (int s = 0; s < b; ++s) cu[s + 1] = cu[s] + (next(4) == 0 ? 0 : next(300));
    const int64_t slots = mha_backward_dq_slots(b, cu[b]);
    std::vector<int> owner(static_cast<size_t>(slots), -1);
    for (int s = 0; s < b; ++s) {
      const int64_t tiles = (cu[s + 1] - cu[s] + 63) / 64;
      for (int64_t j = 0; j < tiles; ++j) {
        const int64_t slot = mha_backward_dq_slot(cu[s], s, j);
        ASSERT_GE(slot, 0);
        ASSERT_LT(slot, slots) << "trial " << trial << " sequence " << s << " tile " << j;
        ASSERT_EQ(owner[static_cast<size_t>(slot)], -1) << "trial " << trial << " slot " << slot;
        owner[static_cast<size_t>(slot)] = s;
      }
    }
  }
  EXPECT_EQ(mha_backward_dq_slots(5, 0), 0);  // no query row: no slot
}

// Many short sequences take whole slots each: the workspace holds slots (and the Hopper kernel
// runs) only where they take at most twice the rows' floats or 64 MiB.
TEST(MhaBackwardTiling, DqSlotsOnlyWhereTheyStaySmall) {
  // The shapes: 260 slots of 64 rows for 16384 rows (1.6% more).
  EXPECT_EQ(mha_backward_workspace(4, 16384, 32, 128, 128, 4096, false).dq_slots, 260);
  // 8192 one-token sequences at h_q 32: 8320 slots (8.1 GiB) against 128 MiB of rows: none.
  const MhaBackwardWorkspace many = mha_backward_workspace(8192, 8192, 32, 128, 128, 1, false);
  EXPECT_EQ(many.dq_slots, 0);
  EXPECT_EQ(many.row_dot_offset, int64_t{8192} * 32 * 128 * 4);  // the rows' accumulator alone
  // Small problems keep their slots whatever the ratio (the stress test's shapes): 8 sequences
  // of 3 rows, 4 heads.
  EXPECT_EQ(mha_backward_workspace(8, 24, 4, 128, 128, 3, false).dq_slots, 24 / 64 + 8);
  // Beyond the Hopper grid's b: none.
  EXPECT_EQ(mha_backward_workspace(65536, 65536 * 64, 1, 128, 128, 64, false).dq_slots, 0);
  // At the bound: twice the rows' floats exactly (64-row sequences; slots = total_q / 64 + b).
  EXPECT_EQ(mha_backward_dq_slots_within_bounds(4096, 4096 * 64, 32, 128), 4096 + 4096);
  EXPECT_EQ(mha_backward_dq_slots_within_bounds(4096, 4096 * 64 - 64, 32, 128), 0);
}

// The Hopper kernel's tail split: room for kMhaPrefillTailSlots slots of 128 key rows x
// (d_qk + d_v) floats after the other parts, only where a split can happen; b 4 h 32 s 4096 at
// d 128 is 4096 key tiles (31 waves of 132 and 4), whose last 4 run in 32 pieces of 2 steps
// (64-row query tiles).
TEST(MhaBackwardTiling, TailSplitSlotsOnlyWhereASplitCanHappen) {
  const MhaBackwardWorkspace base = mha_backward_workspace(4, 16384, 32, 128, 128, 4096, false);
  const MhaBackwardWorkspace w = mha_backward_add_tail_split(base, 128, 128, 1, 4096, /*causal=*/false);
  EXPECT_EQ(w.partial_kv_offset, base.bytes);
  EXPECT_EQ(w.partial_kv_slots, kMhaPrefillTailSlots);
  EXPECT_EQ(w.bytes, base.bytes + int64_t{132} * 128 * 256 * 4);
  EXPECT_EQ(w.partial_kv_offset % kMhaBackwardAlignment, 0);
  EXPECT_EQ(mha_backward_add_tail_split(base, 128, 128, 1, 4096, /*causal=*/true).bytes, base.bytes);
  EXPECT_EQ(mha_backward_add_tail_split(base, 256, 256, 1, 4096, false).bytes, base.bytes);  // no Hopper kernel
  EXPECT_EQ(mha_backward_add_tail_split(base, 128, 128, 1, 192, false).bytes, base.bytes);   // 3 query tiles
  EXPECT_GT(mha_backward_add_tail_split(base, 128, 128, 4, 128, false).bytes, base.bytes);   // 4 heads x 2 tiles
  EXPECT_EQ(mha_backward_tail_steps(4, 130), 12);

  const MhaPrefillTailSplit split = mha_prefill_tail_split(4096, mha_backward_tail_steps(1, 4096), false, 132);
  EXPECT_EQ(split.whole_tiles, 4092);
  EXPECT_EQ(split.tail_tiles, 4);
  EXPECT_EQ(split.pieces, 32);
  EXPECT_LE(int64_t{split.tail_tiles} * split.pieces, w.partial_kv_slots);
}

TEST(MhaBackwardTiling, PartsAreAlignedAndCountersOnlyInTheDeterministicMode) {
  const int dims[][2] = {{64, 64}, {128, 128}, {192, 128}, {192, 192}, {256, 256}};
  for (const auto& [d_qk, d_v] : dims) {
    for (int64_t total_q : {int64_t{0}, int64_t{1}, int64_t{33}, int64_t{4097}}) {
      for (bool deterministic : {false, true}) {
        const MhaBackwardWorkspace w = mha_backward_workspace(3, total_q, 5, d_qk, d_v, 300, deterministic);
        SCOPED_TRACE(::testing::Message() << "d " << d_qk << "/" << d_v << " total_q " << total_q << " det "
                                          << deterministic);
        EXPECT_EQ(w.row_dot_offset % kMhaBackwardAlignment, 0);
        EXPECT_EQ(w.counters_offset % kMhaBackwardAlignment, 0);
        EXPECT_EQ(w.bytes % kMhaBackwardAlignment, 0);
        EXPECT_GE(w.row_dot_offset, total_q * 5 * d_qk * 4);
        EXPECT_EQ(w.dq_slots, mha_backward_hopper_dims(d_qk, d_v) ? mha_backward_dq_slots(3, total_q) : 0);
        EXPECT_GE(w.row_dot_offset, mha_backward_dq_block(w.dq_slots, 0, 5, d_qk) * 4);
        EXPECT_GE(w.counters_offset - w.row_dot_offset, total_q * 5 * 4);
        EXPECT_EQ(w.counters, deterministic ? 3 * 5 * mha_backward_query_tiles(300, d_qk) : 0);
        EXPECT_GE(w.bytes - w.counters_offset, w.counters * 4);
        if (total_q == 0 && !deterministic) EXPECT_EQ(w.bytes, 0);  // nothing to hold: no workspace
      }
    }
  }
}

TEST(MhaBackwardTiling, QueryTilesFollowTheHeadDims) {
  EXPECT_EQ(mha_backward_query_rows(64), 64);
  EXPECT_EQ(mha_backward_query_rows(128), 64);
  EXPECT_EQ(mha_backward_query_rows(192), 32);
  EXPECT_EQ(mha_backward_query_rows(256), 32);
  EXPECT_EQ(mha_backward_query_tiles(0, 128), 0);
  EXPECT_EQ(mha_backward_query_tiles(1, 128), 1);
  EXPECT_EQ(mha_backward_query_tiles(65, 128), 2);
  EXPECT_EQ(mha_backward_query_tiles(65, 192), 3);
}

// Without the dQ staging every config fits sm80's 163 KB; with it (sm90 only) sm90's 227 KB.
// sm86 / sm89 (99 KB) take d 64 only: the host reports the others as unsupported there.
TEST(MhaBackwardTiling, SharedMemoryFitsTheDevicesThatRunEachVariant) {
  const int pairs[4][2] = {{64, 64}, {128, 128}, {192, 128}, {256, 256}};
  for (const auto& p : pairs) {
    const int plain = mha_backward_smem_bytes(p[0], p[1], /*bulk_dq=*/false);
    const int staged = mha_backward_smem_bytes(p[0], p[1], /*bulk_dq=*/true);
    SCOPED_TRACE(::testing::Message() << "d " << p[0] << "/" << p[1]);
    EXPECT_GT(plain, 0);
    EXPECT_LE(plain, 163 * 1024);
    EXPECT_GT(staged, plain);
    EXPECT_LE(staged, 227 * 1024);
  }
  EXPECT_LE(mha_backward_smem_bytes(64, 64, false), 99 * 1024);
  EXPECT_GT(mha_backward_smem_bytes(128, 128, false), 99 * 1024);
  EXPECT_EQ(mha_backward_smem_bytes(96, 96, false), 0);  // not a supported pair
}

}  // namespace
}  // namespace mlakit::detail
