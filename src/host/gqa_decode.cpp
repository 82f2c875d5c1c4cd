// Public entry points of the GQA decode: validation, plan layout, dispatch.
#include <string>

#include "host/check.h"
#include "host/decode_layout.h"
#include "host/device.h"
#include "host/gqa_decode_layout.h"
#include "host/gqa_decode_validate.h"
#include "host/mla_decode_validate.h"
#include "host/output_check.h"
#include "mlakit/gqa_decode.h"
#if MLAKIT_WITH_CUDA
#include "dispatch/gqa_decode_dispatch.h"
#endif

namespace mlakit {
namespace {

using detail::invalid;

// What the kernels read with 16-byte copies (cache rows, the appended rows) must be 16-byte
// aligned; rows written in 32-bit pairs or single floats 4-byte aligned.
Status check_alignment(const char* op, const GqaDecodeArgs& a) {
  using detail::check_row_alignment;
  MLAKIT_RETURN_IF_ERROR(check_row_alignment(op, "k_cache.values", a.k_cache.values, 16));
  MLAKIT_RETURN_IF_ERROR(check_row_alignment(op, "v_cache.values", a.v_cache.values, 16));
  MLAKIT_RETURN_IF_ERROR(check_row_alignment(op, "k_cache.scale", a.k_cache.scale, 4));
  MLAKIT_RETURN_IF_ERROR(check_row_alignment(op, "v_cache.scale", a.v_cache.scale, 4));
  MLAKIT_RETURN_IF_ERROR(check_row_alignment(op, "k_new", a.k_new, 16));
  MLAKIT_RETURN_IF_ERROR(check_row_alignment(op, "v_new", a.v_new, 16));
  MLAKIT_RETURN_IF_ERROR(check_row_alignment(op, "q", a.q, 4));
  MLAKIT_RETURN_IF_ERROR(check_row_alignment(op, "out", a.out, 4));
  MLAKIT_RETURN_IF_ERROR(check_row_alignment(op, "lse", a.lse, 4));
  MLAKIT_RETURN_IF_ERROR(check_row_alignment(op, "block_table", a.block_table, 4));
  return check_row_alignment(op, "cache_seqlens", a.cache_seqlens, 4);
}

Status check_plan_matches(const char* op, const detail::GqaDecodeShape& shape, const GqaDecodeArgs& a,
                          const GqaDecodePlan& plan, int device) {
  if (plan.workspace == nullptr || plan.num_parts < 1) {
    return invalid(op, "plan: expected a plan filled by gqa_decode_plan, got an empty plan");
  }
  if (plan.device != device) {
    return invalid(op, "plan.device: expected " + std::to_string(device) + " (the current device), got " +
                           std::to_string(plan.device));
  }
  const GqaDecodeProblem& p = plan.problem;
  auto mismatch = [op](const char* what, int64_t plan_value, int64_t arg_value) {
    return invalid(op, std::string(what) + ": expected " + std::to_string(plan_value) + " (the plan's), got " +
                           std::to_string(arg_value) + " (from the arguments): make a plan for this problem");
  };
  if (p.b != shape.b) return mismatch("b", p.b, shape.b);
  if (p.s_q != shape.s_q) return mismatch("s_q", p.s_q, shape.s_q);
  if (p.h_q != shape.h_q) return mismatch("h_q", p.h_q, shape.h_q);
  if (p.h_kv != shape.h_kv) return mismatch("h_kv", p.h_kv, shape.h_kv);
  if (p.d != shape.d) return mismatch("d", p.d, shape.d);
  if (p.causal != a.causal) return mismatch("causal", p.causal, a.causal);
  if (p.window != a.window) return mismatch("window", p.window, a.window);
  return Status::ok();
}

Status check_device_args(const char* op, const GqaDecodeArgs& a, const detail::GqaDecodeShape& shape,
                         const GqaDecodePlan& plan, int device) {
  MLAKIT_RETURN_IF_ERROR(check_alignment(op, a));
  MLAKIT_RETURN_IF_ERROR(check_plan_matches(op, shape, a, plan, device));
  using detail::tensor_range;
  // The decode writes partial results into the workspace.
  MLAKIT_RETURN_IF_ERROR(detail::check_disjoint(
      op, {detail::buffer_range("plan.workspace", plan.workspace, plan.workspace_bytes)},
      {tensor_range("out", a.out), tensor_range("lse", a.lse), tensor_range("q", a.q),
       tensor_range("k_cache.values", a.k_cache.values), tensor_range("v_cache.values", a.v_cache.values),
       tensor_range("k_cache.scale", a.k_cache.scale), tensor_range("v_cache.scale", a.v_cache.scale),
       tensor_range("k_new", a.k_new), tensor_range("v_new", a.v_new), tensor_range("block_table", a.block_table),
       tensor_range("cache_seqlens", a.cache_seqlens), tensor_range("alibi_slopes", a.alibi_slopes),
       tensor_range("finished", a.finished)}));
  const struct {
    const char* name;
    const void* ptr;
  } pointers[] = {{"q", a.q.data},
                  {"k_cache.values", a.k_cache.values.data},
                  {"v_cache.values", a.v_cache.values.data},
                  {"k_cache.scale", a.k_cache.scale.data},
                  {"v_cache.scale", a.v_cache.scale.data},
                  {"block_table", a.block_table.data},
                  {"cache_seqlens", a.cache_seqlens.data},
                  {"k_new", a.k_new.data},
                  {"v_new", a.v_new.data},
                  {"alibi_slopes", a.alibi_slopes.data},
                  {"finished", a.finished.data},
                  {"out", a.out.data},
                  {"lse", a.lse.data},
                  {"plan.workspace", plan.workspace}};
  for (const auto& p : pointers) {
    if (p.ptr != nullptr) MLAKIT_RETURN_IF_ERROR(detail::check_device_pointer(op, p.name, p.ptr, device));
  }
  return Status::ok();
}

}  // namespace

Status gqa_decode_workspace_size(const GqaDecodeProblem& problem, std::size_t* bytes) {
  constexpr const char* kOp = "gqa_decode_workspace_size";
  if (bytes == nullptr) return invalid(kOp, "bytes: expected a non-null pointer, got null");
  MLAKIT_RETURN_IF_ERROR(detail::validate_gqa_decode_problem(kOp, problem));  // bad input before a missing GPU
  detail::DeviceInfo dev;
  MLAKIT_RETURN_IF_ERROR(detail::current_supported_device(kOp, &dev));
  GqaDecodePlan layout;
  MLAKIT_RETURN_IF_ERROR(detail::make_gqa_decode_layout(kOp, problem, dev, &layout));
  *bytes = layout.workspace_bytes;
  return Status::ok();
}

Status gqa_decode_plan(const GqaDecodeProblem& problem, const TensorRef& cache_seqlens, void* workspace,
                       std::size_t workspace_bytes, cudaStream_t stream, GqaDecodePlan* plan) {
  constexpr const char* kOp = "gqa_decode_plan";
  if (plan == nullptr) return invalid(kOp, "plan: expected a non-null pointer, got null");
  MLAKIT_RETURN_IF_ERROR(detail::validate_gqa_decode_problem(kOp, problem));
  detail::DeviceInfo dev;
  MLAKIT_RETURN_IF_ERROR(detail::current_supported_device(kOp, &dev));
  MLAKIT_RETURN_IF_ERROR(
      detail::check_vector(kOp, "cache_seqlens", cache_seqlens, DType::kInt32, "problem.b", problem.b));
  MLAKIT_RETURN_IF_ERROR(detail::check_row_alignment(kOp, "cache_seqlens", cache_seqlens, 4));
  if (!detail::has_no_elements(cache_seqlens)) {
    MLAKIT_RETURN_IF_ERROR(detail::check_device_pointer(kOp, "cache_seqlens", cache_seqlens.data, dev.ordinal));
  }
  GqaDecodePlan layout;
  MLAKIT_RETURN_IF_ERROR(detail::make_gqa_decode_layout(kOp, problem, dev, &layout));
  MLAKIT_RETURN_IF_ERROR(detail::check_workspace(kOp, workspace, workspace_bytes, layout.workspace_bytes, dev.ordinal));
  layout.workspace = workspace;
  layout.workspace_bytes = workspace_bytes;
  MLAKIT_RETURN_IF_ERROR(detail::check_disjoint(kOp, {detail::buffer_range("workspace", workspace, workspace_bytes)},
                                                {detail::tensor_range("cache_seqlens", cache_seqlens)}));
#if MLAKIT_WITH_CUDA
  if (!detail::is_empty_problem(problem)) {
    MLAKIT_RETURN_IF_ERROR(
        detail::dispatch_gqa_decode_plan(layout, static_cast<const int32_t*>(cache_seqlens.data), stream));
  }
#else
  (void)stream;
#endif
  *plan = layout;
  return Status::ok();
}

Status gqa_decode(const GqaDecodeArgs& args, const GqaDecodePlan& plan, cudaStream_t stream) {
  constexpr const char* kOp = "gqa_decode";
  detail::GqaDecodeShape shape;
  MLAKIT_RETURN_IF_ERROR(detail::validate_gqa_decode_args(kOp, args, &shape));
  detail::DeviceInfo dev;
  MLAKIT_RETURN_IF_ERROR(detail::current_supported_device(kOp, &dev));
  MLAKIT_RETURN_IF_ERROR(check_device_args(kOp, args, shape, plan, dev.ordinal));
  if (detail::is_empty_problem(shape)) return Status::ok();  // nothing to append or compute
#if MLAKIT_WITH_CUDA
  return detail::dispatch_gqa_decode(args, shape, plan, detail::resolve_softmax_scale(args.softmax_scale, shape.d),
                                     stream);
#else
  (void)stream;
  return detail::built_without_cuda(kOp);
#endif
}

}  // namespace mlakit
