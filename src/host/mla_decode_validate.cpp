#include "host/mla_decode_validate.h"

#include <cmath>
#include <string>

#include "host/check.h"
#include "host/decode_layout.h"
#include "host/device.h"
#include "host/output_check.h"

namespace mlakit::detail {
namespace {

constexpr int kMlaDqk = 576;
constexpr int kMlaDv = 512;

// The kernels copy q and cache rows in 16-byte pieces.
constexpr int kRowAlignmentBytes = 16;

Status check_plan_matches(const char* op, const MlaDecodeProblem& args_problem,
                          const MlaDecodePlan& plan) {
  const MlaDecodeProblem& p = plan.problem;
  if (plan.sparse_topk != 0) {
    return invalid(op, "plan: expected a plan made by mla_decode_plan, got a sparse decode plan (topk = " +
                           std::to_string(plan.sparse_topk) + ")");
  }
  auto mismatch = [op](const char* what, int64_t plan_value, int64_t arg_value) {
    return invalid(op, std::string(what) + ": expected " + std::to_string(plan_value) +
                           " (the plan's), got " + std::to_string(arg_value) +
                           " (from the arguments): make a plan for this problem");
  };
  if (p.b != args_problem.b) return mismatch("b", p.b, args_problem.b);
  if (p.s_q != args_problem.s_q) return mismatch("s_q", p.s_q, args_problem.s_q);
  if (p.h_q != args_problem.h_q) return mismatch("h_q", p.h_q, args_problem.h_q);
  if (p.h_kv != args_problem.h_kv) return mismatch("h_kv", p.h_kv, args_problem.h_kv);
  if (p.d_qk != args_problem.d_qk) return mismatch("d_qk", p.d_qk, args_problem.d_qk);
  if (p.d_v != args_problem.d_v) return mismatch("d_v", p.d_v, args_problem.d_v);
  return Status::ok();
}

}  // namespace

float resolve_softmax_scale(std::optional<float> scale, int d_qk) {
  return scale ? *scale : 1.0f / std::sqrt(static_cast<float>(d_qk));
}

Status validate_mla_decode_args(const char* op, const MlaDecodeArgs& a, MlaDecodeProblem* problem,
                                bool allow_float_out) {
  MLAKIT_RETURN_IF_ERROR(check_tensor_wellformed(op, "q", a.q));
  MLAKIT_RETURN_IF_ERROR(check_dtype(op, "q", a.q, {DType::kBF16, DType::kFP16}));
  MLAKIT_RETURN_IF_ERROR(check_rank(op, "q", a.q, 4));
  MLAKIT_RETURN_IF_ERROR(check_last_dim_contiguous(op, "q", a.q));

  MLAKIT_RETURN_IF_ERROR(check_tensor_wellformed(op, "kv_cache", a.kv_cache));
  MLAKIT_RETURN_IF_ERROR(check_same_dtype(op, "kv_cache", a.kv_cache, "q", a.q.dtype));
  MLAKIT_RETURN_IF_ERROR(check_rank(op, "kv_cache", a.kv_cache, 4));
  MLAKIT_RETURN_IF_ERROR(check_last_dim_contiguous(op, "kv_cache", a.kv_cache));

  MlaDecodeProblem p;
  p.b = a.q.shape[0];
  MLAKIT_RETURN_IF_ERROR(int_dim(op, "q", a.q, 1, "s_q", &p.s_q));
  MLAKIT_RETURN_IF_ERROR(int_dim(op, "q", a.q, 2, "h_q", &p.h_q));
  MLAKIT_RETURN_IF_ERROR(int_dim(op, "q", a.q, 3, "d_qk", &p.d_qk));
  MLAKIT_RETURN_IF_ERROR(int_dim(op, "kv_cache", a.kv_cache, 2, "h_kv", &p.h_kv));
  if (p.d_qk != kMlaDqk) {
    return unsupported(op, "q.shape[3] (d_qk): expected " + std::to_string(kMlaDqk) +
                               " (512 NoPE + 64 RoPE), got " + std::to_string(p.d_qk));
  }
  MLAKIT_RETURN_IF_ERROR(check_dim(op, "kv_cache", a.kv_cache, 3, "d_qk", p.d_qk));
  MLAKIT_RETURN_IF_ERROR(check_paged_cache_dims(op, "kv_cache", a.kv_cache));

  MLAKIT_RETURN_IF_ERROR(check_block_table(op, a.block_table, p.b));
  if (a.block_table.shape[1] > INT32_MAX) {
    return invalid(op, "block_table.shape[1] (max_blocks_per_seq): expected <= 2^31 - 1, got " +
                           std::to_string(a.block_table.shape[1]));
  }

  MLAKIT_RETURN_IF_ERROR(check_tensor_wellformed(op, "cache_seqlens", a.cache_seqlens));
  MLAKIT_RETURN_IF_ERROR(check_dtype(op, "cache_seqlens", a.cache_seqlens, {DType::kInt32}));
  MLAKIT_RETURN_IF_ERROR(check_rank(op, "cache_seqlens", a.cache_seqlens, 1));
  MLAKIT_RETURN_IF_ERROR(check_dim(op, "cache_seqlens", a.cache_seqlens, 0, "b", p.b));
  MLAKIT_RETURN_IF_ERROR(check_last_dim_contiguous(op, "cache_seqlens", a.cache_seqlens));

  MLAKIT_RETURN_IF_ERROR(check_tensor_wellformed(op, "out", a.out));
  if (allow_float_out) {
    MLAKIT_RETURN_IF_ERROR(check_output_dtype(op, "out", a.out, a.q.dtype, true));
  } else {
    MLAKIT_RETURN_IF_ERROR(check_same_dtype(op, "out", a.out, "q", a.q.dtype));
  }
  MLAKIT_RETURN_IF_ERROR(check_rank(op, "out", a.out, 4));
  MLAKIT_RETURN_IF_ERROR(check_dim(op, "out", a.out, 0, "b", p.b));
  MLAKIT_RETURN_IF_ERROR(check_dim(op, "out", a.out, 1, "s_q", p.s_q));
  MLAKIT_RETURN_IF_ERROR(check_dim(op, "out", a.out, 2, "h_q", p.h_q));
  if (a.out.shape[3] != kMlaDv) {
    return unsupported(op, "out.shape[3] (d_v): expected " + std::to_string(kMlaDv) + ", got " +
                               std::to_string(a.out.shape[3]));
  }
  p.d_v = kMlaDv;
  MLAKIT_RETURN_IF_ERROR(check_last_dim_contiguous(op, "out", a.out));

  MLAKIT_RETURN_IF_ERROR(check_tensor_wellformed(op, "lse", a.lse));
  MLAKIT_RETURN_IF_ERROR(check_dtype(op, "lse", a.lse, {DType::kFP32}));
  MLAKIT_RETURN_IF_ERROR(check_rank(op, "lse", a.lse, 3));
  MLAKIT_RETURN_IF_ERROR(check_dim(op, "lse", a.lse, 0, "b", p.b));
  MLAKIT_RETURN_IF_ERROR(check_dim(op, "lse", a.lse, 1, "h_q", p.h_q));
  MLAKIT_RETURN_IF_ERROR(check_dim(op, "lse", a.lse, 2, "s_q", p.s_q));
  MLAKIT_RETURN_IF_ERROR(check_last_dim_contiguous(op, "lse", a.lse));

  MLAKIT_RETURN_IF_ERROR(check_logit_scale(op, "softmax_scale", a.softmax_scale));
  MLAKIT_RETURN_IF_ERROR(validate_decode_problem(op, p));
  MLAKIT_RETURN_IF_ERROR(check_outputs(op, {{"out", a.out}, {"lse", a.lse}},
                                       {{"q", a.q}, {"kv_cache", a.kv_cache}, {"block_table", a.block_table},
                                        {"cache_seqlens", a.cache_seqlens}}));
  *problem = p;
  return Status::ok();
}

Status validate_mla_decode_device_args(const char* op, const MlaDecodeArgs& a,
                                       const MlaDecodeProblem& problem,
                                       const MlaDecodePlan& plan, int device) {
  MLAKIT_RETURN_IF_ERROR(check_row_alignment(op, "q", a.q, kRowAlignmentBytes));
  MLAKIT_RETURN_IF_ERROR(check_row_alignment(op, "kv_cache", a.kv_cache, kRowAlignmentBytes));
  MLAKIT_RETURN_IF_ERROR(check_row_alignment(op, "out", a.out, 4));
  MLAKIT_RETURN_IF_ERROR(check_row_alignment(op, "lse", a.lse, 4));
  MLAKIT_RETURN_IF_ERROR(check_row_alignment(op, "block_table", a.block_table, 4));
  MLAKIT_RETURN_IF_ERROR(check_row_alignment(op, "cache_seqlens", a.cache_seqlens, 4));

  if (plan.workspace == nullptr || plan.num_parts < 1) {
    return invalid(op, "plan: expected a plan filled by mla_decode_plan, got an empty plan");
  }
  if (plan.device != device) {
    return invalid(op, "plan.device: expected " + std::to_string(device) +
                           " (the current device), got " + std::to_string(plan.device));
  }
  MLAKIT_RETURN_IF_ERROR(check_plan_matches(op, problem, plan));
  // The decode writes partial results into the workspace.
  MLAKIT_RETURN_IF_ERROR(check_disjoint(op, {buffer_range("plan.workspace", plan.workspace, plan.workspace_bytes)},
                                        {tensor_range("out", a.out), tensor_range("lse", a.lse), tensor_range("q", a.q),
                                         tensor_range("kv_cache", a.kv_cache), tensor_range("block_table", a.block_table),
                                         tensor_range("cache_seqlens", a.cache_seqlens)}));

  const struct {
    const char* name;
    const void* ptr;
  } pointers[] = {{"q", a.q.data},
                  {"kv_cache", a.kv_cache.data},
                  {"block_table", a.block_table.data},
                  {"cache_seqlens", a.cache_seqlens.data},
                  {"out", a.out.data},
                  {"lse", a.lse.data},
                  {"plan.workspace", plan.workspace}};
  for (const auto& p : pointers) {
    if (p.ptr != nullptr) MLAKIT_RETURN_IF_ERROR(check_device_pointer(op, p.name, p.ptr, device));
  }
  return Status::ok();
}

}  // namespace mlakit::detail
