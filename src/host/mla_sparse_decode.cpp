// Public entry points of the sparse FP8 MLA decode: validation, plan layout, dispatch. The
// schedule treats each (batch entry, query token) as one sequence of h_q rows and
// topk_length[b] (or topk) keys, so the dense decode's planner, workspace and combine serve.
#include "mlakit/mla_sparse_decode.h"

#include <string>

#include "common/decode_schedule.h"
#include "host/check.h"
#include "host/decode_layout.h"
#include "host/device.h"
#include "host/mla_decode_validate.h"
#include "host/mla_sparse_decode_validate.h"
#include "host/output_check.h"
#if MLAKIT_WITH_CUDA
#include "dispatch/mla_sparse_decode_dispatch.h"
#endif

namespace mlakit {
namespace {

using detail::invalid;

// The dense problem whose plan serves the sparse decode (empty when b, s_q or h_q is 0).
Status scheduled_problem(const char* op, const MlaSparseDecodeProblem& p, MlaDecodeProblem* out) {
  if (p.b < 0 || p.s_q < 0 || p.h_q < 0) {
    return invalid(op, "problem: expected b, s_q, h_q >= 0, got b = " + std::to_string(p.b) +
                           ", s_q = " + std::to_string(p.s_q) + ", h_q = " + std::to_string(p.h_q));
  }
  if (p.topk < 1 || p.topk > (1 << 20)) {
    return invalid(op, "problem.topk: expected 1 <= topk <= 2^20, got " + std::to_string(p.topk));
  }
  // b is bounded before the product, so b * s_q (s_q an int) cannot overflow int64.
  if (p.b > (int64_t{1} << 30) || p.b * p.s_q > (int64_t{1} << 30)) {
    return invalid(op, "problem: expected b * s_q <= 2^30, got b = " + std::to_string(p.b) +
                           ", s_q = " + std::to_string(p.s_q));
  }
  *out = MlaDecodeProblem{.b = p.b * p.s_q, .s_q = 1, .h_q = p.h_q, .h_kv = 1, .d_qk = 576, .d_v = 512};
  return Status::ok();
}

#if MLAKIT_WITH_CUDA
// topk_length (or topk for every row) per scheduled sequence, for the dispatch (CUDA builds only).
detail::SeqLengths sparse_lengths(const TensorRef& topk_length, int topk, int s_q) {
  return detail::SeqLengths{topk_length.empty() ? nullptr : static_cast<const int32_t*>(topk_length.data), topk, s_q, topk};
}
#endif

// The problem's kernel request, named as the sparse API spells it (the dense layout code
// would report it as options.kernel).
Status check_kernel_request(const char* op, const detail::DeviceInfo& dev, MlaKernel request) {
  detail::DecodeKernelTraits traits;
  return detail::select_decode_kernel(op, dev, request, &traits, "problem.kernel");
}

Status check_topk_length(const char* op, const TensorRef& t, int64_t b, int device) {
  if (t.empty()) return Status::ok();
  using namespace detail;
  MLAKIT_RETURN_IF_ERROR(check_vector(op, "topk_length", t, DType::kInt32, "b", b));
  MLAKIT_RETURN_IF_ERROR(check_row_alignment(op, "topk_length", t, 4));
  if (has_no_elements(t)) return Status::ok();  // b = 0: possibly a null pointer, nothing is read
  return check_device_pointer(op, "topk_length", t.data, device);
}

}  // namespace

// The default layout's size: a plan of whole sequences per part (mla_sparse_decode_plan
// without topk_length) has fewer parts, so it needs no more.
Status mla_sparse_decode_workspace_size(const MlaSparseDecodeProblem& problem, std::size_t* bytes) {
  constexpr const char* kOp = "mla_sparse_decode_workspace_size";
  if (bytes == nullptr) return invalid(kOp, "bytes: expected a non-null pointer, got null");
  MlaDecodeProblem scheduled;
  MLAKIT_RETURN_IF_ERROR(scheduled_problem(kOp, problem, &scheduled));
  detail::DeviceInfo dev;
  MLAKIT_RETURN_IF_ERROR(detail::current_supported_device(kOp, &dev));
  MLAKIT_RETURN_IF_ERROR(check_kernel_request(kOp, dev, problem.kernel));
  return mla_decode_workspace_size(scheduled, bytes, MlaDecodeOptions{.kernel = problem.kernel});
}

Status mla_sparse_decode_plan(const MlaSparseDecodeProblem& problem, const TensorRef& topk_length, void* workspace,
                              std::size_t workspace_bytes, cudaStream_t stream, MlaDecodePlan* plan) {
  constexpr const char* kOp = "mla_sparse_decode_plan";
  if (plan == nullptr) return invalid(kOp, "plan: expected a non-null pointer, got null");
  MlaDecodeProblem scheduled;
  MLAKIT_RETURN_IF_ERROR(scheduled_problem(kOp, problem, &scheduled));
  detail::DeviceInfo dev;
  MLAKIT_RETURN_IF_ERROR(detail::current_device_info(kOp, &dev));
  MLAKIT_RETURN_IF_ERROR(check_kernel_request(kOp, dev, problem.kernel));
  MLAKIT_RETURN_IF_ERROR(check_topk_length(kOp, topk_length, problem.b, dev.ordinal));
  // Without topk_length every length is topk: the layout may cut the batch into parts of
  // whole sequences (no split, no combine). That only lowers num_parts, so the workspace-size
  // query (the default layout's) stays an upper bound.
  MlaDecodePlan layout;
  MLAKIT_RETURN_IF_ERROR(
      detail::make_sparse_decode_layout(scheduled, problem.topk, !topk_length.empty(), dev, problem.kernel, &layout));
  MLAKIT_RETURN_IF_ERROR(detail::attach_workspace(kOp, workspace, workspace_bytes, dev.ordinal, &layout));
  MLAKIT_RETURN_IF_ERROR(detail::check_disjoint(kOp, {detail::buffer_range("workspace", workspace, workspace_bytes)},
                                                {detail::tensor_range("topk_length", topk_length)}));
#if MLAKIT_WITH_CUDA
  if (!detail::is_empty_problem(scheduled)) {
    MLAKIT_RETURN_IF_ERROR(
        detail::dispatch_sparse_decode_plan(layout, sparse_lengths(topk_length, problem.topk, problem.s_q), stream));
  }
#else
  (void)stream;
#endif
  *plan = layout;
  return Status::ok();
}

Status mla_sparse_decode_fp8(const MlaSparseDecodeArgs& args, const MlaDecodePlan& plan, cudaStream_t stream) {
  constexpr const char* kOp = "mla_sparse_decode_fp8";
  detail::SparseDecodeShape shape;
  MLAKIT_RETURN_IF_ERROR(detail::validate_mla_sparse_decode_args(kOp, args, /*allow_float_out=*/false, &shape));
  detail::DeviceInfo dev;
  MLAKIT_RETURN_IF_ERROR(detail::current_supported_device(kOp, &dev));
  MlaDecodeProblem scheduled;
  MLAKIT_RETURN_IF_ERROR(scheduled_problem(
      kOp, MlaSparseDecodeProblem{.b = shape.b, .s_q = shape.s_q, .h_q = shape.h_q, .topk = shape.topk}, &scheduled));
  if (plan.workspace == nullptr || plan.num_parts < 1) {
    return invalid(kOp, "plan: expected a plan filled by mla_sparse_decode_plan, got an empty plan");
  }
  if (plan.device != dev.ordinal) {
    return invalid(kOp, "plan.device: expected " + std::to_string(dev.ordinal) + " (the current device), got " +
                            std::to_string(plan.device));
  }
  if (plan.problem.b != scheduled.b || plan.problem.h_q != scheduled.h_q || plan.problem.s_q != 1 ||
      plan.problem.h_kv != 1) {
    return invalid(kOp, "plan: expected a plan for b * s_q = " + std::to_string(scheduled.b) + ", h_q = " +
                            std::to_string(scheduled.h_q) + " (mla_sparse_decode_plan), got b = " +
                            std::to_string(plan.problem.b) + ", h_q = " + std::to_string(plan.problem.h_q));
  }
  // A plan for another topk would walk index positions the indices tensor does not have.
  if (plan.sparse_topk != shape.topk) {
    return invalid(kOp, "plan: expected a plan for topk = " + std::to_string(shape.topk) +
                            " (mla_sparse_decode_plan), got a plan for topk = " + std::to_string(plan.sparse_topk));
  }
  // The schedule follows the lengths the plan saw: topk_length's, or topk for every row.
  if (plan.sparse_topk_length != !args.topk_length.empty()) {
    return invalid(kOp, std::string("topk_length: expected ") + (plan.sparse_topk_length ? "a tensor" : "none") +
                            " (as given to mla_sparse_decode_plan), got " +
                            (args.topk_length.empty() ? "none" : "a tensor"));
  }
  MLAKIT_RETURN_IF_ERROR(detail::check_row_alignment(kOp, "q", args.q, 16));
  MLAKIT_RETURN_IF_ERROR(detail::check_row_alignment(kOp, "kv_cache", args.kv_cache, 16));
  MLAKIT_RETURN_IF_ERROR(detail::check_row_alignment(kOp, "out", args.out, 4));
  const std::pair<const char*, const void*> pointers[] = {
      {"q", args.q.data},       {"kv_cache", args.kv_cache.data},       {"indices", args.indices.data},
      {"out", args.out.data},   {"lse", args.lse.data},                 {"topk_length", args.topk_length.data},
      {"attn_sink", args.attn_sink.data}};
  for (const auto& [name, ptr] : pointers) {
    if (ptr != nullptr) MLAKIT_RETURN_IF_ERROR(detail::check_device_pointer(kOp, name, ptr, dev.ordinal));
  }
  // The decode writes partial results into the workspace.
  using detail::tensor_range;
  MLAKIT_RETURN_IF_ERROR(detail::check_disjoint(
      kOp, {detail::buffer_range("plan.workspace", plan.workspace, plan.workspace_bytes)},
      {tensor_range("out", args.out), tensor_range("lse", args.lse), tensor_range("q", args.q),
       tensor_range("kv_cache", args.kv_cache), tensor_range("indices", args.indices),
       tensor_range("topk_length", args.topk_length), tensor_range("attn_sink", args.attn_sink)}));
  if (detail::is_empty_problem(scheduled)) return Status::ok();  // the empty result: nothing to write
#if MLAKIT_WITH_CUDA
  return detail::dispatch_mla_sparse_decode(args, plan, sparse_lengths(args.topk_length, shape.topk, shape.s_q),
                                            detail::resolve_softmax_scale(args.softmax_scale, 576), stream);
#else
  (void)stream;
  return detail::built_without_cuda(kOp);
#endif
}

}  // namespace mlakit
