// CPU twin of the device planner (src/kernels/portable/decode_plan.cu). Both evaluate the
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
// Dense decode: sequence i has length seqlens[i].
DecodeSchedule schedule_on_host(const int32_t* seqlens, int64_t b, const ScheduleConfig& config);

}  // namespace mlakit::detail
