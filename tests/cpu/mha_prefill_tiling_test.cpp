// The Hopper MHA prefill's tail split (src/common/mha_prefill_tiling.h): which tiles run in
// pieces on a GPU of a given SM count, and the workspace the host asks for, which must hold
// every slot any plan uses.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>

#include "common/mha_prefill_tiling.h"

namespace mlakit::detail {
namespace {

// The header's example: b 4 h 32 s 4096 at d 128, 4096 tiles of 32 key tiles on 132 SMs: 31
// waves and 4 tiles, each of which runs in 16 pieces of 2 key tiles (64 CTAs in the last wave).
TEST(MhaPrefillTiling, TheLastWaveOfTheBenchmarkShapeIsSplit) {
  const int64_t tiles = mha_prefill_sm90_tiles(4096, 32, 4, 128);
  ASSERT_EQ(tiles, 4096);
  const MhaPrefillTailSplit s = mha_prefill_tail_split(tiles, 4096 / 128, /*causal=*/false, 132);
  EXPECT_EQ(s.whole_tiles, 4092);
  EXPECT_EQ(s.tail_tiles, 4);
  EXPECT_EQ(s.pieces, 16);
  EXPECT_EQ(s.ctas(), 4092 + 64);
  // 33 pieces fit the SMs, but a piece keeps at least two key tiles: 16. With 8 key tiles, 4.
  EXPECT_EQ(mha_prefill_tail_split(tiles, 8, false, 132).pieces, 4);
  // d 64: 192-row tiles, 22 per sequence, 2816 tiles = 21 waves and 44 tiles: 3 pieces each.
  const MhaPrefillTailSplit d64 = mha_prefill_tail_split(mha_prefill_sm90_tiles(4096, 32, 4, 64), 37, false, 132);
  EXPECT_EQ(d64.tail_tiles, 44);
  EXPECT_EQ(d64.pieces, 3);
}

TEST(MhaPrefillTiling, NoSplitWhereItCannotPay) {
  EXPECT_EQ(mha_prefill_tail_split(4096, 32, /*causal=*/true, 132).tail_tiles, 0);  // longest first fills the tail
  EXPECT_EQ(mha_prefill_tail_split(132 * 7, 32, false, 132).tail_tiles, 0);         // whole waves
  EXPECT_EQ(mha_prefill_tail_split(132 + 67, 32, false, 132).tail_tiles, 0);        // the last wave over half full
  EXPECT_EQ(mha_prefill_tail_split(4096, 3, false, 132).tail_tiles, 0);             // too few key tiles
  EXPECT_EQ(mha_prefill_tail_split(0, 32, false, 132).tail_tiles, 0);
  EXPECT_EQ(mha_prefill_tail_split(4096, 32, false, 0).tail_tiles, 0);
  // A one-dimensional grid of more than 2^31 - 1 CTAs: the three-dimensional one instead.
  EXPECT_EQ(mha_prefill_tail_split(int64_t{1} << 40, 32, false, 132).tail_tiles, 0);
}

// Any plan on any SM count uses at most kMhaPrefillTailSlots slots, whole and tail tiles add
// up, pieces keep their key tiles, and the workspace the host asks for holds the slots.
TEST(MhaPrefillTiling, EveryPlanFitsTheWorkspace) {
  std::mt19937_64 rng(7);
  const int dims[4][2] = {{64, 64}, {128, 128}, {192, 128}, {256, 256}};
  for (int i = 0; i < 20000; ++i) {
    const auto& d = dims[rng() % 4];
    const int max_q = static_cast<int>(rng() % 20000), max_k = static_cast<int>(rng() % 20000);
    const int h_q = 1 + static_cast<int>(rng() % 64);
    const int64_t b = 1 + static_cast<int64_t>(rng() % 16);
    const bool causal = rng() % 2 == 0;
    const int sm_count = 1 + static_cast<int>(rng() % 200);
    const int block_n = mha_sm90_block_n(d[0], d[1], mha_sm90_wide_keys(d[0], causal, max_k));
    const int64_t key_tiles = (max_k + block_n - 1) / block_n;
    const int64_t tiles = mha_prefill_sm90_tiles(max_q, h_q, b, d[0]);
    const MhaPrefillTailSplit s = mha_prefill_tail_split(tiles, key_tiles, causal, sm_count);
    EXPECT_EQ(s.whole_tiles + s.tail_tiles, tiles);
    if (s.tail_tiles == 0) continue;
    const int64_t slots = static_cast<int64_t>(s.tail_tiles) * s.pieces;
    EXPECT_LE(slots, sm_count);
    EXPECT_LE(slots, kMhaPrefillTailSlots);
    EXPECT_GE(s.pieces, 2);
    EXPECT_GE(key_tiles / s.pieces, kMhaPrefillMinKeyTilesPerPiece);
    EXPECT_FALSE(causal);
    const int block_m = mha_sm90_block_m(d[0]);
    const int64_t needed = mha_prefill_partial_out_bytes(kMhaPrefillTailSlots, block_m, d[1]) +
                           mha_prefill_partial_lse_bytes(slots, block_m);
    EXPECT_GE(mha_prefill_workspace_bytes(max_q, max_k, h_q, b, d[0], d[1], causal), needed)
        << "max_q " << max_q << " max_k " << max_k << " d " << d[0];
  }
}

TEST(MhaPrefillTiling, WorkspaceOnlyWhereASplitCanHappen) {
  // d 128 / 128: 132 slots of 128 rows x 128 floats and their LSEs.
  EXPECT_EQ(mha_prefill_workspace_bytes(4096, 4096, 32, 4, 128, 128, false), 132 * 128 * 128 * 4 + 132 * 128 * 4);
  EXPECT_EQ(mha_prefill_workspace_bytes(4096, 4096, 32, 4, 128, 128, /*causal=*/true), 0);
  EXPECT_EQ(mha_prefill_workspace_bytes(4096, 300, 32, 4, 128, 128, false), 0);  // 3 key tiles
  EXPECT_EQ(mha_prefill_workspace_bytes(0, 4096, 32, 4, 128, 128, false), 0);    // no query tile
  EXPECT_GT(mha_prefill_workspace_bytes(1, 4096, 1, 1, 64, 64, false), 0);
}

}  // namespace
}  // namespace mlakit::detail
