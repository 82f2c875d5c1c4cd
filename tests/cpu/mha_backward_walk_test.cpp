// The Hopper MHA backward's walk (src/common/mha_backward_walk.h) against a brute-force scan of
// which (query, key) pairs see each other: a key tile visits exactly the query tiles that hold a
// query seeing one of its keys, and the key tiles that add into a query tile's dQ are exactly
// 0 .. its last key tile (the deterministic mode's counter counts them down from there).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "common/mha_backward_walk.h"

namespace mlakit::detail {
namespace {

constexpr int kBlockM = 64, kBlockN = 128;

struct Sequence {
  int q_len, k_len, max_q, max_k;
  int64_t room_q, room_k;
  bool causal;
};

std::string describe(const Sequence& s) {
  return "q_len " + std::to_string(s.q_len) + " k_len " + std::to_string(s.k_len) + " max " + std::to_string(s.max_q) +
         "/" + std::to_string(s.max_k) + " room " + std::to_string(s.room_q) + "/" + std::to_string(s.room_k) +
         (s.causal ? " causal" : "");
}

// Whether query tile m and key tile n hold a pair that sees each other, by scanning the pairs.
bool sees(const Sequence& s, int q_rows, int k_rows, int m, int n) {
  for (int t = m * kBlockM; t < std::min((m + 1) * kBlockM, q_rows); ++t) {
    for (int j = n * kBlockN; j < std::min((n + 1) * kBlockN, k_rows); ++j) {
      if (!s.causal || int64_t{j} - t <= int64_t{s.k_len} - s.q_len) return true;
    }
  }
  return false;
}

void check(const Sequence& s) {
  SCOPED_TRACE(describe(s));
  const int key_tiles = (s.max_k + kBlockN - 1) / kBlockN;
  const int q_rows = mha_rows_within(s.q_len, s.max_q, s.room_q);
  const int k_rows = mha_rows_within(s.k_len, s.max_k, s.room_k);
  const int query_tiles = (q_rows + kBlockM - 1) / kBlockM;
  std::vector<std::set<int>> adders(query_tiles);  // key tiles that add into query tile m
  for (int n = 0; n < key_tiles; ++n) {
    const MhaBackwardWalk w =
        mha_backward_walk(s.q_len, s.k_len, s.max_q, s.max_k, s.room_q, s.room_k, s.causal, n, kBlockM, kBlockN);
    ASSERT_EQ(w.q_rows, q_rows);
    ASSERT_EQ(w.k_rows, k_rows);
    ASSERT_EQ(w.has_keys, n * kBlockN < k_rows) << "key tile " << n;
    for (int m = 0; m < query_tiles; ++m) {
      const bool walked = w.has_keys && m >= w.m_first && m < w.m_first + w.m_tiles;
      ASSERT_EQ(walked, sees(s, q_rows, k_rows, m, n)) << "key tile " << n << ", query tile " << m;
      if (walked) adders[m].insert(n);
    }
  }
  const MhaBackwardWalk any = mha_backward_walk(s.q_len, s.k_len, s.max_q, s.max_k, s.room_q, s.room_k, s.causal, 0,
                                                kBlockM, kBlockN);
  for (int m = 0; m < query_tiles; ++m) {
    if (adders[m].empty()) continue;  // no key seen: no counter is waited on
    const int last = mha_backward_last_key_tile(any, s.q_len, s.k_len, s.causal, m * kBlockM, kBlockM, kBlockN);
    ASSERT_EQ(static_cast<int>(adders[m].size()), last + 1) << "query tile " << m;
    ASSERT_EQ(*adders[m].begin(), 0) << "query tile " << m;
    ASSERT_EQ(*adders[m].rbegin(), last) << "query tile " << m;
  }
}

TEST(MhaBackwardWalk, EdgeCases) {
  for (bool causal : {false, true}) {
    check({0, 0, 0, 0, 0, 0, causal});
    check({0, 300, 10, 300, 100, 300, causal});    // no query: dK = dV = 0
    check({300, 0, 300, 128, 300, 100, causal});    // no key
    check({1, 1, 1, 1, 1, 1, causal});
    check({64, 128, 64, 128, 64, 128, causal});     // whole tiles
    check({65, 129, 65, 129, 65, 129, causal});     // one row / key past a tile
    check({1000, 300, 1000, 300, 1000, 300, causal});  // Lq > Lk: rows that see no key (causal)
    check({300, 1000, 300, 1000, 300, 1000, causal});  // Lk > Lq: keys no query sees (causal)
    check({500, 500, 400, 300, 1 << 20, 1 << 20, causal});  // max_seqlen below the lengths
    check({500, 500, 500, 500, 200, 250, causal});  // the tensors end inside the sequence
  }
}

TEST(MhaBackwardWalk, RandomSequences) {
  std::mt19937 rng(20261127);
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  for (int i = 0; i < 2000; ++i) {
    Sequence s;
    s.q_len = uniform(0, 700);
    s.k_len = uniform(0, 700);
    s.max_q = uniform(0, 3) == 0 ? uniform(0, 700) : s.q_len + uniform(0, 100);
    s.max_k = uniform(0, 3) == 0 ? uniform(0, 700) : s.k_len + uniform(0, 100);
    s.room_q = uniform(0, 5) == 0 ? uniform(0, 700) : 1 << 20;
    s.room_k = uniform(0, 5) == 0 ? uniform(0, 700) : 1 << 20;
    s.causal = uniform(0, 1) == 1;
    check(s);
    if (HasFatalFailure()) return;
  }
}

// The launch order covers every (key tile, pair) block once; a group of pairs runs key tile by
// key tile (ascending, or from the last in the deterministic mode, where every block's
// predecessor in its pair's chain, the next higher key tile, has a lower block index).
void check_launch_order(int key_tiles, int64_t pairs, int group, bool reversed) {
  SCOPED_TRACE(testing::Message() << key_tiles << " key tiles, " << pairs << " pairs, groups of " << group
                                  << (reversed ? ", reversed" : ""));
  const int64_t blocks = int64_t{key_tiles} * pairs;
  std::vector<int64_t> index_of(static_cast<size_t>(blocks), -1);
  for (int64_t linear = 0; linear < blocks; ++linear) {
    const MhaBackwardBlock b = mha_backward_block<int64_t>(linear, key_tiles, pairs, group, reversed);
    // The kernels' 32-bit form (grids of fewer than 2^32 blocks) gives the same block.
    const MhaBackwardBlock b32 = mha_backward_block<uint32_t>(static_cast<uint32_t>(linear), key_tiles,
                                                              static_cast<uint32_t>(pairs), group, reversed);
    ASSERT_EQ(b32.key_tile, b.key_tile) << "block " << linear;
    ASSERT_EQ(b32.pair, b.pair) << "block " << linear;
    ASSERT_TRUE(b.key_tile >= 0 && b.key_tile < key_tiles && b.pair >= 0 && b.pair < pairs) << "block " << linear;
    int64_t& seen = index_of[static_cast<size_t>(b.pair * key_tiles + b.key_tile)];
    ASSERT_EQ(seen, -1) << "block " << linear << " repeats key tile " << b.key_tile << " of pair " << b.pair;
    seen = linear;
    // Pairs of one group: those of the same index / group.
    EXPECT_EQ(b.pair / group, linear / (int64_t{group} * key_tiles)) << "block " << linear;
  }
  for (int64_t pair = 0; pair < pairs; ++pair) {
    for (int n = 0; n + 1 < key_tiles; ++n) {
      const int64_t lower = index_of[static_cast<size_t>(pair * key_tiles + n)];
      const int64_t higher = index_of[static_cast<size_t>(pair * key_tiles + n + 1)];
      if (reversed) {
        EXPECT_LT(higher, lower) << "pair " << pair << ", key tile " << n;
      } else {
        EXPECT_LT(lower, higher) << "pair " << pair << ", key tile " << n;
      }
    }
  }
}

TEST(MhaBackwardLaunchOrder, EveryBlockOnceInItsGroupsOrder) {
  for (const bool reversed : {false, true}) {
    for (const int key_tiles : {1, 2, 3, 32, 33}) {
      for (const int64_t pairs : {1, 2, 5, 7, 128}) {
        for (const int group : {1, 2, 4, 5, 200}) {
          check_launch_order(key_tiles, pairs, group, reversed);
          if (HasFatalFailure()) return;
        }
      }
    }
  }
}

TEST(MhaBackwardLaunchOrder, OneGroupPerPairIsTheGridOrder) {
  // Groups of one pair: block x + key_tiles * pair, key tiles ascending (backwards if reversed).
  for (int64_t linear = 0; linear < 5 * 7; ++linear) {
    const MhaBackwardBlock b = mha_backward_block<int64_t>(linear, 5, 7, 1, false);
    EXPECT_EQ(b.key_tile, linear % 5);
    EXPECT_EQ(b.pair, linear / 5);
    EXPECT_EQ(mha_backward_block<int64_t>(linear, 5, 7, 1, true).key_tile, 4 - linear % 5);
  }
}

TEST(MhaBackwardLaunchOrder, GroupsHoldAboutOneWave) {
  EXPECT_EQ(mha_backward_launch_group(32, 132), 4);    // s 4096: 128 CTAs a group
  EXPECT_EQ(mha_backward_launch_group(128, 132), 1);   // s 16384: one pair's key tiles
  EXPECT_EQ(mha_backward_launch_group(1000, 132), 1);  // more key tiles than SMs
  EXPECT_EQ(mha_backward_launch_group(0, 132), 1);
  EXPECT_EQ(mha_backward_launch_group(32, 0), 1);      // no SM count known
}

}  // namespace
}  // namespace mlakit::detail
