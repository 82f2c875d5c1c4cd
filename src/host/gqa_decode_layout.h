// Host-side layout of the GQA decode's plan: the kernel's tiling (common/gqa_decode_tiling.h)
// turned into the planner's configuration and the workspace regions. Pure functions of the
// problem and the device, unit-tested on the CPU.
#pragma once

#include <cstdint>

#include "common/decode_schedule.h"
#include "dispatch/gqa_decode_shape.h"
#include "host/device.h"
#include "mlakit/gqa_decode.h"

namespace mlakit::detail {

// b, s_q (0..8), h_q, h_kv, d (64 / 128 / 256) and window (>= 0) of a plan's problem.
Status validate_gqa_decode_problem(const char* op, const GqaDecodeProblem& problem);

inline bool is_empty_problem(const GqaDecodeProblem& p) { return p.b == 0 || p.s_q == 0; }

// CTAs of the kernel one SM holds (shared memory bound): 2 up to d = 128 on an H100.
int gqa_ctas_per_sm(int d, const DeviceInfo& device);

// Fills every field of `plan` but `workspace`, including workspace_bytes.
Status make_gqa_decode_layout(const char* op, const GqaDecodeProblem& problem, const DeviceInfo& device,
                              GqaDecodePlan* plan);

}  // namespace mlakit::detail
