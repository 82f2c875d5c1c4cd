#include "host/scheduler.h"

namespace mlakit::detail {

DecodeSchedule schedule_on_host(const int32_t* seqlens, int64_t b, const ScheduleConfig& c) {
  return schedule_on_host(dense_lengths(seqlens), b, c);
}

DecodeSchedule schedule_on_host(const SeqLengths& len, int64_t b, const ScheduleConfig& c) {
  DecodeSchedule s;
  s.cost_prefix.resize(b + 1);
  s.split_prefix.resize(b + 1);
  s.partial_prefix.resize(b + 1);
  s.cost_prefix[0] = 0;
  for (int64_t i = 0; i < b; ++i) s.cost_prefix[i + 1] = s.cost_prefix[i] + sequence_cost(len(i), c);
  const int64_t psize = part_size(s.cost_prefix[b], c);
  s.split_prefix[0] = 0;
  s.partial_prefix[0] = 0;
  for (int64_t i = 0; i < b; ++i) {
    int32_t splits = sequence_splits(s.cost_prefix[i], key_blocks(len(i), c.block_n), c, psize);
    s.split_prefix[i + 1] = s.split_prefix[i] + splits;
    s.partial_prefix[i + 1] = s.partial_prefix[i] + partial_slots(splits);
  }
  s.parts.resize(c.num_parts);
  for (int32_t p = 0; p < c.num_parts; ++p) {
    s.parts[p] = part_range(p, s.cost_prefix.data(), len, b, c, psize);
  }
  return s;
}

std::vector<ScheduledSegment> part_segments(const PartRange& r, const SeqLengths& len, int block_n) {
  std::vector<ScheduledSegment> segments;
  int64_t block = r.begin_block;
  int32_t split = r.begin_split;
  for (int32_t seq = r.begin_seq; seq < r.end_seq || (seq == r.end_seq && block < r.end_block); ++seq) {
    const int64_t block_end = seq == r.end_seq ? r.end_block : key_blocks(len(seq), block_n);
    if (block < block_end) segments.push_back({seq, block, block_end, split});
    block = 0;
    split = 0;
  }
  return segments;
}

}  // namespace mlakit::detail
