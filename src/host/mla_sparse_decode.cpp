// Public entry points of the sparse FP8 MLA decode: validation, plan layout, dispatch. The
// schedule treats each (batch entry, query token) as one sequence of h_q rows and
// topk_length[b] (or topk) keys, plus extra_topk_length[b] (or extra_topk) of a second cache,
// so the dense decode's planner, workspace and combine serve.
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
  if (p.extra_topk < 0 || p.extra_topk > (1 << 20)) {
    return invalid(op, "problem.extra_topk: expected 0 (no second cache) <= extra_topk <= 2^20, got " +
                           std::to_string(p.extra_topk));
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
// topk_length (or topk for every row) per scheduled sequence, plus the second cache's
// extra_topk_length (or extra_topk), for the dispatch (CUDA builds only).
detail::SeqLengths sparse_lengths(const TensorRef& topk_length, int topk, const TensorRef& extra_topk_length,
                                  int extra_topk, int s_q) {
  auto data = [](const TensorRef& t) { return t.empty() ? nullptr : static_cast<const int32_t*>(t.data); };
  return detail::SeqLengths{.lengths = data(topk_length),
                            .fixed = topk,
                            .divisor = s_q,
                            .cap = topk,
                            .extra_lengths = data(extra_topk_length),
                            .extra_fixed = extra_topk,
                            .extra_cap = extra_topk};
}
#endif

// The problem's kernel request, named as the sparse API spells it (the dense layout code
// would report it as options.kernel).
Status check_kernel_request(const char* op, const detail::DeviceInfo& dev, MlaKernel request) {
  detail::DecodeKernelTraits traits;
  return detail::select_decode_kernel(op, dev, request, &traits, "problem.kernel");
}

Status check_lengths(const char* op, const char* name, const TensorRef& t, int64_t b, int device) {
  if (t.empty()) return Status::ok();
  using namespace detail;
  MLAKIT_RETURN_IF_ERROR(check_vector(op, name, t, DType::kInt32, "b", b));
  MLAKIT_RETURN_IF_ERROR(check_row_alignment(op, name, t, 4));
  if (has_no_elements(t)) return Status::ok();  // b = 0: possibly a null pointer, nothing is read
  return check_device_pointer(op, name, t.data, device);
}

// The plan's index lists must be the decode's: a plan for other lists walks positions the
// indices do not have, or follows lengths the decode does not get.
Status check_plan_lists(const char* op, const MlaDecodePlan& plan, const detail::SparseDecodeShape& shape,
                        const MlaSparseDecodeArgs& args) {
  if (plan.sparse_topk != shape.topk || plan.sparse_extra_topk != shape.extra.topk) {
    return invalid(op, "plan: expected a plan for topk = " + std::to_string(shape.topk) + ", extra_topk = " +
                           std::to_string(shape.extra.topk) + " (mla_sparse_decode_plan), got a plan for topk = " +
                           std::to_string(plan.sparse_topk) + ", extra_topk = " + std::to_string(plan.sparse_extra_topk));
  }
  const std::pair<const char*, bool> lengths[] = {{"topk_length", plan.sparse_topk_length},
                                                  {"extra_topk_length", plan.sparse_extra_topk_length}};
  const TensorRef* given[] = {&args.topk_length, &args.extra_topk_length};
  for (int i = 0; i < 2; ++i) {
    if (lengths[i].second != !given[i]->empty()) {
      return invalid(op, std::string(lengths[i].first) + ": expected " + (lengths[i].second ? "a tensor" : "none") +
                             " (as given to mla_sparse_decode_plan), got " + (given[i]->empty() ? "none" : "a tensor"));
    }
  }
  return Status::ok();
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

Status mla_sparse_decode_plan(const MlaSparseDecodeProblem& problem, const TensorRef& topk_length,
                              const TensorRef& extra_topk_length, void* workspace, std::size_t workspace_bytes,
                              cudaStream_t stream, MlaDecodePlan* plan) {
  constexpr const char* kOp = "mla_sparse_decode_plan";
  if (plan == nullptr) return invalid(kOp, "plan: expected a non-null pointer, got null");
  MlaDecodeProblem scheduled;
  MLAKIT_RETURN_IF_ERROR(scheduled_problem(kOp, problem, &scheduled));
  detail::DeviceInfo dev;
  MLAKIT_RETURN_IF_ERROR(detail::current_device_info(kOp, &dev));
  MLAKIT_RETURN_IF_ERROR(check_kernel_request(kOp, dev, problem.kernel));
  MLAKIT_RETURN_IF_ERROR(check_lengths(kOp, "topk_length", topk_length, problem.b, dev.ordinal));
  if (problem.extra_topk == 0 && !extra_topk_length.empty()) {
    return invalid(kOp, "extra_topk_length: expected none for problem.extra_topk = 0 (no second cache), got a tensor");
  }
  MLAKIT_RETURN_IF_ERROR(check_lengths(kOp, "extra_topk_length", extra_topk_length, problem.b, dev.ordinal));
  // Without length tensors every length is topk + extra_topk: the layout may cut the batch
  // into parts of whole sequences (no split, no combine). That only lowers num_parts, so the
  // workspace-size query (the default layout's) stays an upper bound.
  const detail::SparseKeyLists keys{.topk = problem.topk,
                                    .topk_length = !topk_length.empty(),
                                    .extra_topk = problem.extra_topk,
                                    .extra_topk_length = !extra_topk_length.empty()};
  MlaDecodePlan layout;
  MLAKIT_RETURN_IF_ERROR(detail::make_sparse_decode_layout(scheduled, keys, dev, problem.kernel, &layout));
  MLAKIT_RETURN_IF_ERROR(detail::attach_workspace(kOp, workspace, workspace_bytes, dev.ordinal, &layout));
  MLAKIT_RETURN_IF_ERROR(detail::check_disjoint(kOp, {detail::buffer_range("workspace", workspace, workspace_bytes)},
                                                {detail::tensor_range("topk_length", topk_length),
                                                 detail::tensor_range("extra_topk_length", extra_topk_length)}));
#if MLAKIT_WITH_CUDA
  if (!detail::is_empty_problem(scheduled)) {
    MLAKIT_RETURN_IF_ERROR(detail::dispatch_sparse_decode_plan(
        layout, sparse_lengths(topk_length, problem.topk, extra_topk_length, problem.extra_topk, problem.s_q),
        stream));
  }
#else
  (void)stream;
#endif
  *plan = layout;
  return Status::ok();
}

Status mla_sparse_decode_plan(const MlaSparseDecodeProblem& problem, const TensorRef& topk_length, void* workspace,
                              std::size_t workspace_bytes, cudaStream_t stream, MlaDecodePlan* plan) {
  return mla_sparse_decode_plan(problem, topk_length, TensorRef{}, workspace, workspace_bytes, stream, plan);
}

Status mla_sparse_decode_fp8(const MlaSparseDecodeArgs& args, const MlaDecodePlan& plan, cudaStream_t stream) {
  constexpr const char* kOp = "mla_sparse_decode_fp8";
  detail::SparseDecodeShape shape;
  MLAKIT_RETURN_IF_ERROR(detail::validate_mla_sparse_decode_args(kOp, args, /*allow_float_out=*/false, &shape));
  detail::DeviceInfo dev;
  MLAKIT_RETURN_IF_ERROR(detail::current_supported_device(kOp, &dev));
  MlaDecodeProblem scheduled;
  MLAKIT_RETURN_IF_ERROR(scheduled_problem(
      kOp,
      MlaSparseDecodeProblem{
          .b = shape.b, .s_q = shape.s_q, .h_q = shape.h_q, .topk = shape.topk, .extra_topk = shape.extra.topk},
      &scheduled));
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
  MLAKIT_RETURN_IF_ERROR(check_plan_lists(kOp, plan, shape, args));
  MLAKIT_RETURN_IF_ERROR(detail::check_row_alignment(kOp, "q", args.q, 16));
  if (shape.layout == detail::Fp8TokenLayout::kV32) {  // the V4 cache check has its own alignment rule
    MLAKIT_RETURN_IF_ERROR(detail::check_row_alignment(kOp, "kv_cache", args.kv_cache, 16));
    MLAKIT_RETURN_IF_ERROR(detail::check_row_alignment(kOp, "extra_kv_cache", args.extra_kv_cache, 16));
  }
  MLAKIT_RETURN_IF_ERROR(detail::check_row_alignment(kOp, "out", args.out, 4));
  const std::pair<const char*, const void*> pointers[] = {{"q", args.q.data},
                                                          {"kv_cache", args.kv_cache.data},
                                                          {"indices", args.indices.data},
                                                          {"extra_kv_cache", args.extra_kv_cache.data},
                                                          {"extra_indices", args.extra_indices.data},
                                                          {"extra_topk_length", args.extra_topk_length.data},
                                                          {"out", args.out.data},
                                                          {"lse", args.lse.data},
                                                          {"topk_length", args.topk_length.data},
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
       tensor_range("topk_length", args.topk_length), tensor_range("extra_kv_cache", args.extra_kv_cache),
       tensor_range("extra_indices", args.extra_indices), tensor_range("extra_topk_length", args.extra_topk_length),
       tensor_range("attn_sink", args.attn_sink)}));
  if (detail::is_empty_problem(scheduled)) return Status::ok();  // the empty result: nothing to write
#if MLAKIT_WITH_CUDA
  return detail::dispatch_mla_sparse_decode(
      args, plan,
      sparse_lengths(args.topk_length, shape.topk, args.extra_topk_length, shape.extra.topk, shape.s_q),
      shape.layout,
      detail::resolve_softmax_scale(args.softmax_scale, shape.d_qk), stream);
#else
  (void)stream;
  return detail::built_without_cuda(kOp);
#endif
}

}  // namespace mlakit
