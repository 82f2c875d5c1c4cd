// Launcher of the device planner of the split-KV decode, shared by every decode kernel family
// (the schedule does not depend on the tiling): kernels/schedule/decode_plan.cu.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/decode_schedule.h"

namespace mlakit::detail {

// Device planner: one CTA evaluates common/decode_schedule.h for every sequence and part.
cudaError_t launch_decode_plan(const SeqLengths& lengths, int64_t b, const ScheduleConfig& config,
                               int64_t* cost_prefix, int32_t* split_prefix,
                               int32_t* partial_prefix, PartRange* parts, cudaStream_t stream);

}  // namespace mlakit::detail
