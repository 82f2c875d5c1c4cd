// Launchers of the portable (sm80+) decode kernels: the planner, the split-KV attention
// and the combine. One explicit instantiation per dtype lives in its own .cu file.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/decode_schedule.h"
#include "kernels/mla_decode_params.h"

namespace mlakit::detail {

// Device planner: one CTA evaluates common/decode_schedule.h for every sequence and part.
cudaError_t launch_decode_plan(const SeqLengths& lengths, int64_t b, const ScheduleConfig& config,
                               int64_t* cost_prefix, int32_t* split_prefix,
                               int32_t* partial_prefix, PartRange* parts, cudaStream_t stream);

// Attention (grid: 32-row tiles x h_kv x num_parts) then combine. Elem: __nv_bfloat16 or
// __half. Runs with a plan of any kernel family (the schedule does not depend on the tiling).
template <typename Elem>
cudaError_t launch_mla_decode_portable(const MlaDecodeParams& params, cudaStream_t stream);

// Attention without a plan (the sparse prefill): grid (b * row tiles, h_kv), each CTA one
// row tile of one sequence over all of its keys, final rows written directly; no workspace,
// no combine. The caller keeps b * row tiles <= 2^31 - 1. Instantiated for bf16.
template <typename Elem>
cudaError_t launch_mla_portable_whole_sequence(const MlaDecodeParams& params, cudaStream_t stream);

// Merges the partial results of split sequences and writes empty sequences (0, +inf);
// launches nothing when params.no_splits (no split, no empty sequence).
template <typename Elem>
cudaError_t launch_mla_decode_combine(const MlaDecodeParams& params, cudaStream_t stream);

}  // namespace mlakit::detail
