#include "host/mha_prefill_validate.h"

#include <string>

#include "host/check.h"
#include "host/output_check.h"

namespace mlakit::detail {

bool is_supported_head_dims(int d_qk, int d_v) {
  return (d_qk == 64 && d_v == 64) || (d_qk == 128 && d_v == 128) || (d_qk == 192 && d_v == 128) ||
         (d_qk == 256 && d_v == 256);
}

namespace {

// [total, heads, d] in `dtype`, last dimension contiguous.
Status check_rows(const char* op, const char* name, const TensorRef& t, std::initializer_list<DType> dtypes) {
  MLAKIT_RETURN_IF_ERROR(check_tensor_wellformed(op, name, t));
  MLAKIT_RETURN_IF_ERROR(check_dtype(op, name, t, dtypes));
  MLAKIT_RETURN_IF_ERROR(check_rank(op, name, t, 3));
  MLAKIT_RETURN_IF_ERROR(check_last_dim_contiguous(op, name, t));
  return check_extent_fits(op, name, t);
}

Status check_max_seqlen(const char* op, const char* name, int value) {
  if (value < 0) return invalid(op, std::string(name) + ": expected >= 0, got " + std::to_string(value));
  return Status::ok();
}

}  // namespace

Status validate_mha_prefill_args(const char* op, const MhaPrefillArgs& a, bool allow_float_out,
                                 MhaPrefillShape* shape) {
  MhaPrefillShape s;
  MLAKIT_RETURN_IF_ERROR(check_rows(op, "q", a.q, {DType::kBF16, DType::kFP16}));
  s.total_q = a.q.shape[0];
  MLAKIT_RETURN_IF_ERROR(int_dim(op, "q", a.q, 1, "h_q", &s.h_q));
  MLAKIT_RETURN_IF_ERROR(int_dim(op, "q", a.q, 2, "d_qk", &s.d_qk));
  MLAKIT_RETURN_IF_ERROR(check_rows(op, "k", a.k, {a.q.dtype}));
  s.total_k = a.k.shape[0];
  MLAKIT_RETURN_IF_ERROR(int_dim(op, "k", a.k, 1, "h_kv", &s.h_kv));
  if (s.h_kv < 1 || s.h_q % s.h_kv != 0) {
    return invalid(op, "k.shape[1] (h_kv): expected >= 1 and a divisor of h_q = " + std::to_string(s.h_q) +
                           ", got " + std::to_string(s.h_kv));
  }
  MLAKIT_RETURN_IF_ERROR(check_dim(op, "k", a.k, 2, "d_qk", s.d_qk));
  MLAKIT_RETURN_IF_ERROR(check_rows(op, "v", a.v, {a.q.dtype}));
  MLAKIT_RETURN_IF_ERROR(check_dim(op, "v", a.v, 0, "total_k", s.total_k));
  MLAKIT_RETURN_IF_ERROR(check_dim(op, "v", a.v, 1, "h_kv", s.h_kv));
  MLAKIT_RETURN_IF_ERROR(int_dim(op, "v", a.v, 2, "d_v", &s.d_v));
  if (!is_supported_head_dims(s.d_qk, s.d_v)) {
    return unsupported(op, "q.shape[2], v.shape[2] (d_qk, d_v): expected (64, 64), (128, 128), (192, 128) or "
                           "(256, 256), got (" + std::to_string(s.d_qk) + ", " + std::to_string(s.d_v) + ")");
  }
  MLAKIT_RETURN_IF_ERROR(check_tensor_wellformed(op, "cu_seqlens_q", a.cu_seqlens_q));
  MLAKIT_RETURN_IF_ERROR(check_rank(op, "cu_seqlens_q", a.cu_seqlens_q, 1));
  if (a.cu_seqlens_q.shape[0] < 1) {
    return invalid(op, "cu_seqlens_q.shape[0] (b + 1): expected >= 1, got " +
                           std::to_string(a.cu_seqlens_q.shape[0]));
  }
  s.b = a.cu_seqlens_q.shape[0] - 1;
  MLAKIT_RETURN_IF_ERROR(check_vector(op, "cu_seqlens_q", a.cu_seqlens_q, DType::kInt32, "b + 1", s.b + 1));
  MLAKIT_RETURN_IF_ERROR(check_vector(op, "cu_seqlens_k", a.cu_seqlens_k, DType::kInt32, "b + 1", s.b + 1));
  MLAKIT_RETURN_IF_ERROR(check_max_seqlen(op, "max_seqlen_q", a.max_seqlen_q));
  MLAKIT_RETURN_IF_ERROR(check_max_seqlen(op, "max_seqlen_k", a.max_seqlen_k));
  MLAKIT_RETURN_IF_ERROR(check_logit_scale(op, "softmax_scale", a.softmax_scale));

  MLAKIT_RETURN_IF_ERROR(check_tensor_wellformed(op, "out", a.out));
  MLAKIT_RETURN_IF_ERROR(check_output_dtype(op, "out", a.out, a.q.dtype, allow_float_out));
  MLAKIT_RETURN_IF_ERROR(check_rank(op, "out", a.out, 3));
  MLAKIT_RETURN_IF_ERROR(check_dim(op, "out", a.out, 0, "total_q", s.total_q));
  MLAKIT_RETURN_IF_ERROR(check_dim(op, "out", a.out, 1, "h_q", s.h_q));
  MLAKIT_RETURN_IF_ERROR(check_dim(op, "out", a.out, 2, "d_v", s.d_v));
  MLAKIT_RETURN_IF_ERROR(check_last_dim_contiguous(op, "out", a.out));
  MLAKIT_RETURN_IF_ERROR(check_extent_fits(op, "out", a.out));
  if (!a.lse.empty()) {
    MLAKIT_RETURN_IF_ERROR(check_tensor_wellformed(op, "lse", a.lse));
    MLAKIT_RETURN_IF_ERROR(check_dtype(op, "lse", a.lse, {DType::kFP32}));
    MLAKIT_RETURN_IF_ERROR(check_rank(op, "lse", a.lse, 2));
    MLAKIT_RETURN_IF_ERROR(check_dim(op, "lse", a.lse, 0, "h_q", s.h_q));
    MLAKIT_RETURN_IF_ERROR(check_dim(op, "lse", a.lse, 1, "total_q", s.total_q));
    MLAKIT_RETURN_IF_ERROR(check_last_dim_contiguous(op, "lse", a.lse));
    MLAKIT_RETURN_IF_ERROR(check_extent_fits(op, "lse", a.lse));
  }
  MLAKIT_RETURN_IF_ERROR(check_outputs(op, {{"out", a.out}, {"lse", a.lse}},
                                       {{"q", a.q}, {"k", a.k}, {"v", a.v}, {"cu_seqlens_q", a.cu_seqlens_q},
                                        {"cu_seqlens_k", a.cu_seqlens_k}}));
  *shape = s;
  return Status::ok();
}

}  // namespace mlakit::detail
