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

}  // namespace
}  // namespace mlakit::detail
