// What the planned decodes' dispatch shares (mla_decode_dispatch.cu,
// mla_sparse_decode_dispatch.cu, gqa_decode_dispatch.cu): the planner launch over a plan's
// workspace, the plan and the q / out / lse tensors as kernel parameters, and the combine after
// the attention kernel. The plan functions take an MlaDecodePlan or a GqaDecodePlan (the same
// schedule fields). Dispatch-internal (CUDA).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "common/decode_schedule.h"
#include "kernels/combine/mla_decode_combine_launch.h"
#include "kernels/mla_params.h"
#include "kernels/schedule/decode_plan_launch.h"
#include "mlakit/gqa_decode.h"
#include "mlakit/mla_decode.h"

namespace mlakit::detail {

template <typename T, typename Plan>
T* region(const Plan& plan, std::size_t offset) {
  return reinterpret_cast<T*>(static_cast<char*>(plan.workspace) + offset);
}

// The device planner of `plan` over `lengths`, writing the plan's schedule regions.
template <typename Plan>
cudaError_t launch_plan(const Plan& plan, const SeqLengths& lengths, cudaStream_t stream) {
  const ScheduleConfig config{
      .num_parts = plan.num_parts,
      .block_n = plan.block_n,
      .overhead_blocks = plan.overhead_blocks,
  };
  return launch_decode_plan(lengths, plan.problem.b, config, region<int64_t>(plan, plan.cost_prefix_offset),
                            region<int32_t>(plan, plan.split_prefix_offset),
                            region<int32_t>(plan, plan.partial_prefix_offset),
                            region<PartRange>(plan, plan.part_ranges_offset), stream);
}

// Whether every scheduled sequence lies whole in one part (MLA sparse plans only).
inline bool no_splits(const MlaDecodePlan& plan) { return plan.no_splits; }
inline bool no_splits(const GqaDecodePlan&) { return false; }

// What every planned launch takes from its plan: the workspace regions (schedule, partial
// results) and the schedule's shape.
template <typename Plan>
SplitSchedule plan_schedule(const Plan& plan) {
  return SplitSchedule{
      .part_ranges = region<const PartRange>(plan, plan.part_ranges_offset),
      .split_prefix = region<const int32_t>(plan, plan.split_prefix_offset),
      .partial_prefix = region<const int32_t>(plan, plan.partial_prefix_offset),
      .partial_out = region<float>(plan, plan.partial_out_offset),
      .partial_lse = region<float>(plan, plan.partial_lse_offset),
      .block_n = plan.block_n,
      .num_parts = plan.num_parts,
      .no_splits = no_splits(plan),  // the combine then launches nothing
  };
}

// q / out [b, s_q, h_q, d] and lse [b, h_q, s_q], as both decodes take them.
inline void attach_io(const TensorRef& q, const TensorRef& out, const TensorRef& lse, AttentionCore* p) {
  p->q = q.data;
  p->out = out.data;
  p->lse = static_cast<float*>(lse.data);
  p->q_stride_b = q.stride[0];
  p->q_stride_s = q.stride[1];
  p->q_stride_h = q.stride[2];
  p->out_stride_b = out.stride[0];
  p->out_stride_s = out.stride[1];
  p->out_stride_h = out.stride[2];
  p->lse_stride_b = lse.stride[0];
  p->lse_stride_h = lse.stride[1];
  p->lse_stride_s = lse.stride[2];
}

// A planned attention launch's result, then the combine of its split and empty sequences
// (stream order makes it read the attention kernel's partials; it launches nothing for a plan
// with no_splits). Used as with_combine<Elem>(launch_...(params, ...), params, stream), so the
// attention is launched first; its error, if any, is returned and the combine not launched.
template <typename Elem, typename PlannedParams, int kDv = 512>
cudaError_t with_combine(cudaError_t attention, const PlannedParams& params, cudaStream_t stream) {
  if (attention != cudaSuccess) return attention;
  return launch_mla_decode_combine<Elem, kDv>(CombineParams{params.core, params.schedule}, stream);
}

}  // namespace mlakit::detail
