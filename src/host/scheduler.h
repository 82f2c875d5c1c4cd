// CPU twin of the device planner (src/kernels/schedule/decode_plan.cu). Both evaluate the
// functions of common/decode_schedule.h, so their outputs must be bit-identical; the tests
// check that, plus coverage and balance.
#pragma once

#include <cstdint>
#include <vector>

#include "common/decode_schedule.h"

namespace mlakit::detail {

struct DecodeSchedule {
  std::vector<PartRange> parts;         // [num_parts]
  std::vector<int32_t> split_prefix;    // [b + 1] prefix sums of splits per sequence
  std::vector<int32_t> partial_prefix;  // [b + 1] prefix sums of partial-result slots
  std::vector<int64_t> cost_prefix;     // [b + 1] prefix sums of sequence costs
};

DecodeSchedule schedule_on_host(const SeqLengths& lengths, int64_t b, const ScheduleConfig& config);

// One segment of a part: key blocks [block_begin, block_end) of sequence seq, whose split index
// is `split`.
struct ScheduledSegment {
  int32_t seq;
  int64_t block_begin, block_end;
  int32_t split;
};

// The segments of part range r in the order the kernels walk them (SegmentCursor,
// src/kernels/attention_rows.cuh): for the tests and the timeline tool.
std::vector<ScheduledSegment> part_segments(const PartRange& r, const SeqLengths& lengths, int block_n);
// Dense decode: sequence i has length seqlens[i].
DecodeSchedule schedule_on_host(const int32_t* seqlens, int64_t b, const ScheduleConfig& config);

}  // namespace mlakit::detail
