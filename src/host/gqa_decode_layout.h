// Host-side layout of the GQA decode's plan: the kernel's tiling (common/gqa_decode_tiling.h)
// turned into the planner's configuration and the workspace regions. Pure functions of the
// problem and the device, unit-tested on the CPU.
#pragma once

#include <climits>
#include <cstdint>

#include "common/decode_schedule.h"
#include "host/device.h"
#include "mlakit/gqa_decode.h"

namespace mlakit::detail {

// b, s_q (0..8), h_q, h_kv, d (64 / 128 / 256) and window (>= 0) of a plan's problem.
Status validate_gqa_decode_problem(const char* op, const GqaDecodeProblem& problem);

inline bool is_empty_problem(const GqaDecodeProblem& p) { return p.b == 0 || p.s_q == 0; }

// Query rows per kv head: s_q * h_q / h_kv.
int64_t gqa_decode_rows(const GqaDecodeProblem& problem);

// Keys scheduled per batch entry: with a window only the last window + s_q - 1 positions can
// be seen by any of the s_q tokens (causal or not), so lengths are capped there and the
// kernel reads scheduled key k at position L - min(L, cap) + k. INT_MAX without a window.
inline int32_t gqa_scheduled_cap(const GqaDecodeProblem& p) {
  return p.window > 0 ? static_cast<int32_t>(std::min<int64_t>(INT_MAX, int64_t{p.window} + p.s_q - 1)) : INT_MAX;
}

// CTAs of the kernel one SM holds (shared memory bound): 2 up to d = 128 on an H100.
int gqa_ctas_per_sm(int d, const DeviceInfo& device);

// Fills every field of `plan` but `workspace`, including workspace_bytes.
Status make_gqa_decode_layout(const char* op, const GqaDecodeProblem& problem, const DeviceInfo& device,
                              GqaDecodePlan* plan);

}  // namespace mlakit::detail
