// The split-KV scheduler (common/decode_schedule.h through its CPU twin schedule_on_host):
// the worked example of the header, then coverage, balance and metadata invariants over
// random length vectors, walking each part's range exactly as the decode kernel does.
#include "host/scheduler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace mlakit::detail {
namespace {

// One contiguous piece of a sequence's key blocks processed by one part.
struct Segment {
  int32_t part;
  int32_t seq;
  int64_t block_begin, block_end;
  int32_t split;  // the split index the kernel uses for it
};

// The kernels' walk over part p (part_segments), tagged with the part.
std::vector<Segment> walk_part(int32_t p, const PartRange& r, const std::vector<int32_t>& lens,
                               int block_n) {
  std::vector<Segment> segments;
  for (const ScheduledSegment& s : part_segments(r, dense_lengths(lens.data()), block_n)) {
    segments.push_back({p, s.seq, s.block_begin, s.block_end, s.split});
  }
  return segments;
}

std::string describe(const std::vector<int32_t>& lens, const ScheduleConfig& c) {
  std::ostringstream s;
  s << "b=" << lens.size() << " num_parts=" << c.num_parts << " block_n=" << c.block_n
    << " overhead=" << c.overhead_blocks << " lengths={";
  for (size_t i = 0; i < lens.size() && i < 16; ++i) s << (i ? "," : "") << lens[i];
  s << (lens.size() > 16 ? ",...}" : "}");
  return s.str();
}

// Every invariant of the schedule for one length vector; the first failure is reported.
void check_schedule(const std::vector<int32_t>& lens, const ScheduleConfig& c) {
  SCOPED_TRACE(describe(lens, c));
  const auto b = static_cast<int64_t>(lens.size());
  const DecodeSchedule s = schedule_on_host(lens.data(), b, c);
  ASSERT_EQ(s.parts.size(), static_cast<size_t>(c.num_parts));
  ASSERT_EQ(s.split_prefix.size(), static_cast<size_t>(b + 1));
  ASSERT_EQ(s.partial_prefix.size(), static_cast<size_t>(b + 1));
  ASSERT_EQ(s.cost_prefix.size(), static_cast<size_t>(b + 1));

  int64_t total_cost = 0;
  for (int32_t len : lens) total_cost += key_blocks(len, c.block_n) + c.overhead_blocks;
  ASSERT_EQ(s.cost_prefix[b], total_cost);
  const int64_t psize = std::max<int64_t>(1, (total_cost + c.num_parts - 1) / c.num_parts);

  // Walk every part; record which part covers each block.
  std::vector<std::vector<int32_t>> covered(b);
  for (int64_t i = 0; i < b; ++i) covered[i].assign(key_blocks(lens[i], c.block_n), -1);
  std::vector<std::vector<Segment>> segments_of(b);
  for (int32_t p = 0; p < c.num_parts; ++p) {
    const PartRange& r = s.parts[p];
    ASSERT_GE(r.begin_seq, 0);
    ASSERT_LE(r.end_seq, b);
    ASSERT_TRUE(r.begin_seq < r.end_seq ||
                (r.begin_seq == r.end_seq && r.begin_block <= r.end_block))
        << "part " << p << " ends before it begins";
    if (r.end_seq == b) ASSERT_EQ(r.end_block, 0) << "part " << p;
    if (p > 0) {  // parts tile the (seq, block) order without gaps
      ASSERT_EQ(r.begin_seq, s.parts[p - 1].end_seq) << "part " << p;
      ASSERT_EQ(r.begin_block, s.parts[p - 1].end_block) << "part " << p;
    }
    int64_t blocks = 0;
    const std::vector<Segment> segments = walk_part(p, r, lens, c.block_n);
    for (const Segment& g : segments) {
      for (int64_t j = g.block_begin; j < g.block_end; ++j) {
        ASSERT_LT(j, static_cast<int64_t>(covered[g.seq].size()))
            << "part " << p << " walks past the end of sequence " << g.seq;
        ASSERT_EQ(covered[g.seq][j], -1)
            << "block " << j << " of sequence " << g.seq << " covered by parts "
            << covered[g.seq][j] << " and " << p;
        covered[g.seq][j] = p;
      }
      blocks += g.block_end - g.block_begin;
      segments_of[g.seq].push_back(g);
    }
    // Balance: at most P units of blocks and overheads, plus the overhead of the sequence
    // continued from the previous part.
    const auto n_segments = static_cast<int64_t>(segments.size());
    EXPECT_LE(blocks + c.overhead_blocks * n_segments, psize + c.overhead_blocks)
        << "part " << p << ": " << blocks << " blocks in " << n_segments << " segments";
  }
  for (int64_t i = 0; i < b; ++i) {
    for (size_t j = 0; j < covered[i].size(); ++j) {
      ASSERT_NE(covered[i][j], -1) << "block " << j << " of sequence " << i << " not covered";
    }
  }
  // The last part ends past the batch (coverage above shows the first starts at its beginning).
  EXPECT_EQ(s.parts.back().end_seq, b);
  EXPECT_EQ(s.parts.back().end_block, 0);

  // Split metadata agrees with the segments the parts produce.
  EXPECT_EQ(s.split_prefix[0], 0);
  EXPECT_EQ(s.partial_prefix[0], 0);
  for (int64_t i = 0; i < b; ++i) {
    const int32_t splits = s.split_prefix[i + 1] - s.split_prefix[i];
    ASSERT_EQ(splits, static_cast<int32_t>(segments_of[i].size())) << "sequence " << i;
    if (key_blocks(lens[i], c.block_n) == 0) ASSERT_EQ(splits, 0) << "sequence " << i;
    for (size_t k = 0; k < segments_of[i].size(); ++k) {
      ASSERT_EQ(segments_of[i][k].split, static_cast<int32_t>(k))
          << "segment " << k << " of sequence " << i << " (part " << segments_of[i][k].part << ")";
    }
    const int32_t slots = s.partial_prefix[i + 1] - s.partial_prefix[i];
    ASSERT_EQ(slots, splits >= 2 ? splits : 0) << "sequence " << i;
  }
  // Each split sequence crosses distinct part boundaries (decode_layout.h relies on this).
  EXPECT_LE(s.partial_prefix[b], 2 * (c.num_parts - 1));
  EXPECT_LE(s.partial_prefix[b], 2 * c.num_parts);
}

TEST(Scheduler, WorkedExampleOfTheHeader) {
  const std::vector<int32_t> lens = {100, 0, 300};
  const ScheduleConfig c{.num_parts = 3, .block_n = 64, .overhead_blocks = 2};
  const DecodeSchedule s = schedule_on_host(lens.data(), 3, c);
  EXPECT_EQ(s.cost_prefix, (std::vector<int64_t>{0, 4, 6, 13}));
  EXPECT_EQ(part_size(s.cost_prefix[3], c), 5);
  EXPECT_EQ(s.split_prefix, (std::vector<int32_t>{0, 1, 1, 3}));
  EXPECT_EQ(s.partial_prefix, (std::vector<int32_t>{0, 0, 0, 2}));
  ASSERT_EQ(s.parts.size(), 3u);
  auto expect_range = [&](int p, int bs, int bb, int es, int eb, int split) {
    const PartRange& r = s.parts[p];
    EXPECT_EQ(r.begin_seq, bs) << "part " << p;
    EXPECT_EQ(r.begin_block, bb) << "part " << p;
    EXPECT_EQ(r.end_seq, es) << "part " << p;
    EXPECT_EQ(r.end_block, eb) << "part " << p;
    EXPECT_EQ(r.begin_split, split) << "part " << p;
  };
  expect_range(0, 0, 0, 2, 0, 0);  // seq0 blocks 0-1
  expect_range(1, 2, 0, 2, 2, 0);  // seq2 blocks 0-1
  expect_range(2, 2, 2, 3, 0, 1);  // seq2 blocks 2-4, its second split
  check_schedule(lens, c);
}

TEST(Scheduler, PureFunctionsOfTheHeader) {
  const ScheduleConfig c{.num_parts = 4, .block_n = 64, .overhead_blocks = 3};
  EXPECT_EQ(key_blocks(0, 64), 0);
  EXPECT_EQ(key_blocks(-5, 64), 0);
  EXPECT_EQ(key_blocks(1, 64), 1);
  EXPECT_EQ(key_blocks(64, 64), 1);
  EXPECT_EQ(key_blocks(65, 64), 2);
  EXPECT_EQ(key_blocks(INT32_MAX, 64), (int64_t{INT32_MAX} + 63) / 64);  // no int32 overflow
  EXPECT_EQ(sequence_cost(0, c), 3);
  EXPECT_EQ(sequence_cost(129, c), 6);
  EXPECT_EQ(part_size(0, c), 1);
  EXPECT_EQ(part_size(13, c), 4);
  EXPECT_EQ(part_size(16, c), 4);
  EXPECT_EQ(sequence_splits(0, 0, c, 4), 0);
  EXPECT_EQ(partial_slots(0), 0);
  EXPECT_EQ(partial_slots(1), 0);
  EXPECT_EQ(partial_slots(2), 2);
  EXPECT_EQ(partial_slots(7), 7);
}

TEST(Scheduler, SingleSequenceAndSinglePart) {
  check_schedule({1}, {.num_parts = 1, .block_n = 64, .overhead_blocks = 1});
  check_schedule({64, 65, 0, 63}, {.num_parts = 1, .block_n = 64, .overhead_blocks = 5});
  // One long sequence over many parts: it is split into as many pieces as parts hold blocks.
  const std::vector<int32_t> one = {64 * 1000};
  const ScheduleConfig c{.num_parts = 10, .block_n = 64, .overhead_blocks = 5};
  check_schedule(one, c);
  const DecodeSchedule s = schedule_on_host(one.data(), 1, c);
  EXPECT_EQ(s.split_prefix[1], 10);
  EXPECT_EQ(s.partial_prefix[1], 10);
}

TEST(Scheduler, AllSequencesEmpty) {
  const std::vector<int32_t> lens(17, 0);
  const ScheduleConfig c{.num_parts = 8, .block_n = 64, .overhead_blocks = 5};
  check_schedule(lens, c);
  const DecodeSchedule s = schedule_on_host(lens.data(), 17, c);
  for (const PartRange& r : s.parts) {
    EXPECT_EQ(r.begin_seq, 17);
    EXPECT_EQ(r.end_seq, 17);
  }
  EXPECT_EQ(s.split_prefix.back(), 0);
  EXPECT_EQ(s.partial_prefix.back(), 0);
}

TEST(Scheduler, MorePartsThanWork) {
  check_schedule({1, 0, 1}, {.num_parts = 300, .block_n = 64, .overhead_blocks = 1});
  check_schedule({5000}, {.num_parts = 300, .block_n = 64, .overhead_blocks = 8});
}

TEST(Scheduler, NegativeLengthsAreEmpty) {
  const std::vector<int32_t> neg = {-1, 300, INT32_MIN, 0, 70, -64};
  const std::vector<int32_t> zero = {0, 300, 0, 0, 70, 0};
  const ScheduleConfig c{.num_parts = 3, .block_n = 64, .overhead_blocks = 2};
  check_schedule(neg, c);
  const DecodeSchedule a = schedule_on_host(neg.data(), 6, c);
  const DecodeSchedule z = schedule_on_host(zero.data(), 6, c);
  EXPECT_EQ(a.cost_prefix, z.cost_prefix);
  EXPECT_EQ(a.split_prefix, z.split_prefix);
  EXPECT_EQ(a.partial_prefix, z.partial_prefix);
  for (int p = 0; p < c.num_parts; ++p) {
    EXPECT_EQ(a.parts[p].begin_seq, z.parts[p].begin_seq);
    EXPECT_EQ(a.parts[p].begin_block, z.parts[p].begin_block);
    EXPECT_EQ(a.parts[p].end_seq, z.parts[p].end_seq);
    EXPECT_EQ(a.parts[p].end_block, z.parts[p].end_block);
    EXPECT_EQ(a.parts[p].begin_split, z.parts[p].begin_split);
  }
}

TEST(Scheduler, EdgeLengthsAroundBlockBoundaries) {
  const std::vector<int32_t> lens = {1, 63, 64, 65, 127, 128, 129, 0, 0, 4096, 1, 0};
  for (int parts : {1, 2, 3, 5, 7, 11, 64, 132}) {
    for (int overhead : {1, 2, 5, 8}) {
      check_schedule(lens, {.num_parts = parts, .block_n = 64, .overhead_blocks = overhead});
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
}

TEST(Scheduler, RandomLengthVectorsKeepEveryInvariant) {
  std::mt19937_64 rng(0x5eed0001);
  for (int trial = 0; trial < 600; ++trial) {
    const auto b = std::uniform_int_distribution<int>(1, 300)(rng);
    const double zero_fraction = std::uniform_real_distribution<double>(0.0, 0.7)(rng);
    // Mix short and long sequences: a random cap makes some batches all short.
    const int32_t cap = std::uniform_int_distribution<int32_t>(1, 20000)(rng);
    std::vector<int32_t> lens(b);
    for (auto& l : lens) {
      const bool zero = std::bernoulli_distribution(zero_fraction)(rng);
      l = zero ? 0 : std::uniform_int_distribution<int32_t>(0, cap)(rng);
    }
    const ScheduleConfig c{.num_parts = std::uniform_int_distribution<int>(1, 300)(rng),
                           .block_n = 64,
                           .overhead_blocks = std::uniform_int_distribution<int>(1, 8)(rng)};
    check_schedule(lens, c);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

TEST(Scheduler, LargeBatchOfLongSequences) {
  // b 4096 of up to 256K tokens (the dense decode's required range, docs/contract.md): int64 costs, no overflow.
  std::mt19937_64 rng(7);
  std::vector<int32_t> lens(4096);
  for (auto& l : lens) l = std::uniform_int_distribution<int32_t>(0, 262144)(rng);
  check_schedule(lens, {.num_parts = 66, .block_n = 64, .overhead_blocks = 5});
}

}  // namespace
}  // namespace mlakit::detail
