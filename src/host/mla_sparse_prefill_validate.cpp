#include "host/mla_sparse_prefill_validate.h"

#include <string>
#include <utility>

#include "host/check.h"
#include "host/output_check.h"

namespace mlakit::detail {
namespace {

Status check_stat(const char* op, const char* name, const TensorRef& t, int64_t s_q, int h_q) {
  MLAKIT_RETURN_IF_ERROR(check_tensor_wellformed(op, name, t));
  MLAKIT_RETURN_IF_ERROR(check_dtype(op, name, t, {DType::kFP32}));
  MLAKIT_RETURN_IF_ERROR(check_rank(op, name, t, 2));
  MLAKIT_RETURN_IF_ERROR(check_dim(op, name, t, 0, "s_q", s_q));
  MLAKIT_RETURN_IF_ERROR(check_dim(op, name, t, 1, "h_q", h_q));
  return check_last_dim_contiguous(op, name, t);
}

}  // namespace

Status validate_mla_sparse_prefill_args(const char* op, const MlaSparsePrefillArgs& a, bool allow_float_out,
                                        SparsePrefillShape* shape) {
  MLAKIT_RETURN_IF_ERROR(check_tensor_wellformed(op, "q", a.q));
  MLAKIT_RETURN_IF_ERROR(check_dtype(op, "q", a.q, {DType::kBF16}));
  MLAKIT_RETURN_IF_ERROR(check_rank(op, "q", a.q, 3));
  MLAKIT_RETURN_IF_ERROR(check_last_dim_contiguous(op, "q", a.q));
  SparsePrefillShape s;  // s_q or h_q of 0: the empty result
  s.s_q = a.q.shape[0];
  MLAKIT_RETURN_IF_ERROR(int_dim(op, "q", a.q, 1, "h_q", &s.h_q));
  MLAKIT_RETURN_IF_ERROR(int_dim(op, "q", a.q, 2, "d_qk", &s.d_qk));
  if (s.d_qk != 576 && s.d_qk != 512) {
    return unsupported(op, "q.shape[2] (d_qk): expected 576 or 512, got " + std::to_string(s.d_qk));
  }
  if (s.h_q > 65536) {
    return invalid(op, "q.shape[1] (h_q): expected 0 <= h_q <= 65536, got " + std::to_string(s.h_q));
  }
  if (a.d_v != 512) return unsupported(op, "d_v: expected 512, got " + std::to_string(a.d_v));

  MLAKIT_RETURN_IF_ERROR(check_tensor_wellformed(op, "kv", a.kv));
  MLAKIT_RETURN_IF_ERROR(check_dtype(op, "kv", a.kv, {DType::kBF16}));
  MLAKIT_RETURN_IF_ERROR(check_rank(op, "kv", a.kv, 3));
  MLAKIT_RETURN_IF_ERROR(check_dim(op, "kv", a.kv, 1, "h_kv", 1));
  MLAKIT_RETURN_IF_ERROR(check_dim(op, "kv", a.kv, 2, "d_qk", s.d_qk));
  MLAKIT_RETURN_IF_ERROR(check_last_dim_contiguous(op, "kv", a.kv));
  s.s_kv = a.kv.shape[0];

  MLAKIT_RETURN_IF_ERROR(check_tensor_wellformed(op, "indices", a.indices));
  MLAKIT_RETURN_IF_ERROR(check_dtype(op, "indices", a.indices, {DType::kInt32}));
  MLAKIT_RETURN_IF_ERROR(check_rank(op, "indices", a.indices, 3));
  MLAKIT_RETURN_IF_ERROR(check_dim(op, "indices", a.indices, 0, "s_q", s.s_q));
  MLAKIT_RETURN_IF_ERROR(check_dim(op, "indices", a.indices, 1, "h_kv", 1));
  MLAKIT_RETURN_IF_ERROR(check_last_dim_contiguous(op, "indices", a.indices));
  MLAKIT_RETURN_IF_ERROR(check_topk(op, a.indices, &s.topk));

  MLAKIT_RETURN_IF_ERROR(check_optional_vector(op, "topk_length", a.topk_length, DType::kInt32, "s_q", s.s_q));
  MLAKIT_RETURN_IF_ERROR(check_optional_vector(op, "attn_sink", a.attn_sink, DType::kFP32, "h_q", s.h_q));

  MLAKIT_RETURN_IF_ERROR(check_tensor_wellformed(op, "out", a.out));
  MLAKIT_RETURN_IF_ERROR(check_output_dtype(op, "out", a.out, DType::kBF16, allow_float_out));
  MLAKIT_RETURN_IF_ERROR(check_rank(op, "out", a.out, 3));
  MLAKIT_RETURN_IF_ERROR(check_dim(op, "out", a.out, 0, "s_q", s.s_q));
  MLAKIT_RETURN_IF_ERROR(check_dim(op, "out", a.out, 1, "h_q", s.h_q));
  MLAKIT_RETURN_IF_ERROR(check_dim(op, "out", a.out, 2, "d_v", a.d_v));
  MLAKIT_RETURN_IF_ERROR(check_last_dim_contiguous(op, "out", a.out));
  MLAKIT_RETURN_IF_ERROR(check_stat(op, "max_logits", a.max_logits, s.s_q, s.h_q));
  MLAKIT_RETURN_IF_ERROR(check_stat(op, "lse", a.lse, s.s_q, s.h_q));

  if (a.lse_base != LseBase::kBase2 && a.lse_base != LseBase::kNatural) {
    return invalid(op, "lse_base: expected kBase2 or kNatural, got " + std::to_string(static_cast<int>(a.lse_base)));
  }
  MLAKIT_RETURN_IF_ERROR(check_logit_scale(op, "sm_scale", a.sm_scale));
  MLAKIT_RETURN_IF_ERROR(check_outputs(op, {{"out", a.out}, {"max_logits", a.max_logits}, {"lse", a.lse}},
                                       {{"q", a.q}, {"kv", a.kv}, {"indices", a.indices},
                                        {"topk_length", a.topk_length}, {"attn_sink", a.attn_sink}}));
  *shape = s;
  return Status::ok();
}

Status validate_mla_sparse_prefill_kernel_args(const char* op, const MlaSparsePrefillArgs& a,
                                               const SparsePrefillShape& shape, int rows_per_cta) {
  MLAKIT_RETURN_IF_ERROR(check_row_alignment(op, "q", a.q, 16));
  MLAKIT_RETURN_IF_ERROR(check_row_alignment(op, "kv", a.kv, 16));
  MLAKIT_RETURN_IF_ERROR(check_row_alignment(op, "out", a.out, 4));
  const std::pair<const char*, const TensorRef*> four_byte[] = {
      {"indices", &a.indices}, {"topk_length", &a.topk_length}, {"attn_sink", &a.attn_sink},
      {"max_logits", &a.max_logits}, {"lse", &a.lse}};
  for (const auto& [name, t] : four_byte) {
    if (!t->empty()) MLAKIT_RETURN_IF_ERROR(check_row_alignment(op, name, *t, 4));
  }
  const int64_t row_tiles = (shape.h_q + rows_per_cta - 1) / rows_per_cta;  // 0 for h_q 0: nothing launched
  constexpr int64_t kMaxGridX = (int64_t{1} << 31) - 1;
  if (row_tiles > 0 && shape.s_q > kMaxGridX / row_tiles) {
    return unsupported(op, "q.shape[0] (s_q): expected s_q * ceil(h_q / " + std::to_string(rows_per_cta) +
                               ") <= 2^31 - 1 (one CTA per token and row tile), got s_q = " +
                               std::to_string(shape.s_q) + ", h_q = " + std::to_string(shape.h_q));
  }
  return Status::ok();
}

}  // namespace mlakit::detail
