// A decode plan as a tuple of integers and back, for callers that can pass only tensors and
// integers: PyTorch custom ops (python/mlakit/_torch_ops.py) take the plan's workspace as a
// tensor and the rest of the plan as an int list, and rebuild the plan in the op. The fields
// are listed once per plan type (visit_fields); the tuple starts with a tag naming the type
// and the number of fields, so a tuple of another plan type or version is rejected.
//
// The workspace pointer is not a field: from_fields takes the workspace array and checks its
// size against the plan's and its device against the plan's device, so a copy of the
// workspace (CUDA-graph input buffers) serves as well as the original.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <string>
#include <vector>

#include "arrays.h"
#include "mlakit/gqa_decode.h"
#include "mlakit/mla_decode.h"

namespace mlakit::python {

template <typename F>
void visit_fields(MlaDecodePlan& p, F&& f) {
  f(p.problem.b), f(p.problem.s_q), f(p.problem.h_q), f(p.problem.h_kv), f(p.problem.d_qk), f(p.problem.d_v);
  f(p.kernel), f(p.device), f(p.num_parts), f(p.block_n), f(p.overhead_blocks), f(p.rows_per_tile);
  f(p.workspace_bytes), f(p.part_ranges_offset), f(p.split_prefix_offset), f(p.partial_prefix_offset);
  f(p.cost_prefix_offset), f(p.partial_out_offset), f(p.partial_lse_offset), f(p.partial_slots);
  f(p.sparse_topk), f(p.sparse_topk_length), f(p.sparse_extra_topk), f(p.sparse_extra_topk_length), f(p.no_splits);
}

template <typename F>
void visit_fields(GqaDecodePlan& p, F&& f) {
  f(p.problem.b), f(p.problem.s_q), f(p.problem.h_q), f(p.problem.h_kv), f(p.problem.d), f(p.problem.causal);
  f(p.problem.window), f(p.device), f(p.num_parts), f(p.block_n), f(p.overhead_blocks), f(p.rows_per_tile);
  f(p.workspace_bytes), f(p.part_ranges_offset), f(p.split_prefix_offset), f(p.partial_prefix_offset);
  f(p.cost_prefix_offset), f(p.partial_out_offset), f(p.partial_lse_offset), f(p.partial_slots);
}

template <typename Plan>
struct PlanTag;
template <>
struct PlanTag<MlaDecodePlan> {
  static constexpr int64_t kValue = 0x4d4c4102;  // "MLA" v2 (the second cache's topk)
  static constexpr const char* kName = "MlaDecodePlan";
};
template <>
struct PlanTag<GqaDecodePlan> {
  static constexpr int64_t kValue = 0x47514101;  // "GQA" v1
  static constexpr const char* kName = "GqaDecodePlan";
};

template <typename Plan>
int64_t field_count() {
  Plan p;
  int64_t n = 0;
  visit_fields(p, [&n](auto&) { ++n; });
  return n;
}

template <typename Plan>
std::vector<int64_t> plan_fields(const Plan& plan) {
  Plan p = plan;
  std::vector<int64_t> out{PlanTag<Plan>::kValue, field_count<Plan>()};
  visit_fields(p, [&out](auto& field) { out.push_back(static_cast<int64_t>(field)); });
  return out;
}

template <typename Plan>
Plan plan_from_fields(const std::vector<int64_t>& fields, const MutArray& workspace) {
  const std::string what = std::string("plan fields: expected the fields() of a ") + PlanTag<Plan>::kName;
  const int64_t n = field_count<Plan>();
  if (fields.size() != static_cast<std::size_t>(n + 2) || fields[0] != PlanTag<Plan>::kValue || fields[1] != n) {
    throw nanobind::value_error((what + " (" + std::to_string(n + 2) + " integers starting with " +
                                 std::to_string(PlanTag<Plan>::kValue) + "), got " + std::to_string(fields.size()) +
                                 " integers")
                                    .c_str());
  }
  Plan p;
  std::size_t i = 2;
  visit_fields(p, [&](auto& field) { field = static_cast<std::remove_reference_t<decltype(field)>>(fields[i++]); });
  const TensorRef ws = to_ref(workspace, "workspace");
  const std::size_t bytes = ws.numel() * dtype_size(ws.dtype);
  const bool on_device = workspace.device_type() == nanobind::device::cuda::value;
  if ((p.device >= 0) != on_device || (on_device && workspace.device_id() != p.device) || bytes < p.workspace_bytes) {
    throw nanobind::value_error(("workspace: expected " + std::to_string(p.workspace_bytes) + " bytes on " +
                                 (p.device >= 0 ? "CUDA device " + std::to_string(p.device) : std::string("the host")) +
                                 " (the plan's), got " + std::to_string(bytes) + " bytes on " +
                                 (on_device ? "CUDA device " + std::to_string(workspace.device_id())
                                            : std::string("the host")))
                                    .c_str());
  }
  p.workspace = p.workspace_bytes > 0 ? ws.data : nullptr;
  return p;
}

}  // namespace mlakit::python
