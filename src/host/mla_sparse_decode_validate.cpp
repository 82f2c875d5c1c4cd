#include "host/mla_sparse_decode_validate.h"

#include <string>

#include "common/fp8_cache_row.h"
#include "host/check.h"
#include "host/output_check.h"

namespace mlakit::detail {

Status validate_mla_sparse_decode_args(const char* op, const MlaSparseDecodeArgs& a, bool allow_float_out,
                                       SparseDecodeShape* shape) {
  MLAKIT_RETURN_IF_ERROR(check_tensor_wellformed(op, "q", a.q));
  MLAKIT_RETURN_IF_ERROR(check_dtype(op, "q", a.q, {DType::kBF16}));
  MLAKIT_RETURN_IF_ERROR(check_rank(op, "q", a.q, 4));
  MLAKIT_RETURN_IF_ERROR(check_dim(op, "q", a.q, 3, "d_qk", kFp8NopeDim + kFp8RopeDim));
  MLAKIT_RETURN_IF_ERROR(check_last_dim_contiguous(op, "q", a.q));
  SparseDecodeShape s;  // b, s_q or h_q of 0: the empty result
  s.b = a.q.shape[0];
  MLAKIT_RETURN_IF_ERROR(int_dim(op, "q", a.q, 1, "s_q", &s.s_q));
  MLAKIT_RETURN_IF_ERROR(int_dim(op, "q", a.q, 2, "h_q", &s.h_q));

  MLAKIT_RETURN_IF_ERROR(check_tensor_wellformed(op, "kv_cache", a.kv_cache));
  MLAKIT_RETURN_IF_ERROR(check_dtype(op, "kv_cache", a.kv_cache, {DType::kUInt8, DType::kFP8E4M3, DType::kInt8}));
  MLAKIT_RETURN_IF_ERROR(check_rank(op, "kv_cache", a.kv_cache, 4));
  MLAKIT_RETURN_IF_ERROR(check_dim(op, "kv_cache", a.kv_cache, 2, "h_kv", 1));
  MLAKIT_RETURN_IF_ERROR(check_dim(op, "kv_cache", a.kv_cache, 3, "bytes per token", kFp8TokenBytes));
  MLAKIT_RETURN_IF_ERROR(check_last_dim_contiguous(op, "kv_cache", a.kv_cache));
  MLAKIT_RETURN_IF_ERROR(check_paged_cache_dims(op, "kv_cache", a.kv_cache));
  s.num_blocks = a.kv_cache.shape[0];
  s.page_size = a.kv_cache.shape[1];

  MLAKIT_RETURN_IF_ERROR(check_tensor_wellformed(op, "indices", a.indices));
  MLAKIT_RETURN_IF_ERROR(check_dtype(op, "indices", a.indices, {DType::kInt32}));
  MLAKIT_RETURN_IF_ERROR(check_rank(op, "indices", a.indices, 3));
  MLAKIT_RETURN_IF_ERROR(check_dim(op, "indices", a.indices, 0, "b", s.b));
  MLAKIT_RETURN_IF_ERROR(check_dim(op, "indices", a.indices, 1, "s_q", s.s_q));
  MLAKIT_RETURN_IF_ERROR(check_last_dim_contiguous(op, "indices", a.indices));
  MLAKIT_RETURN_IF_ERROR(check_topk(op, a.indices, &s.topk));

  MLAKIT_RETURN_IF_ERROR(check_optional_vector(op, "topk_length", a.topk_length, DType::kInt32, "b", s.b));
  MLAKIT_RETURN_IF_ERROR(check_optional_vector(op, "attn_sink", a.attn_sink, DType::kFP32, "h_q", s.h_q));

  MLAKIT_RETURN_IF_ERROR(check_tensor_wellformed(op, "out", a.out));
  MLAKIT_RETURN_IF_ERROR(check_output_dtype(op, "out", a.out, DType::kBF16, allow_float_out));
  MLAKIT_RETURN_IF_ERROR(check_rank(op, "out", a.out, 4));
  MLAKIT_RETURN_IF_ERROR(check_dim(op, "out", a.out, 0, "b", s.b));
  MLAKIT_RETURN_IF_ERROR(check_dim(op, "out", a.out, 1, "s_q", s.s_q));
  MLAKIT_RETURN_IF_ERROR(check_dim(op, "out", a.out, 2, "h_q", s.h_q));
  MLAKIT_RETURN_IF_ERROR(check_dim(op, "out", a.out, 3, "d_v", kFp8NopeDim));
  MLAKIT_RETURN_IF_ERROR(check_last_dim_contiguous(op, "out", a.out));

  MLAKIT_RETURN_IF_ERROR(check_tensor_wellformed(op, "lse", a.lse));
  MLAKIT_RETURN_IF_ERROR(check_dtype(op, "lse", a.lse, {DType::kFP32}));
  MLAKIT_RETURN_IF_ERROR(check_rank(op, "lse", a.lse, 3));
  MLAKIT_RETURN_IF_ERROR(check_dim(op, "lse", a.lse, 0, "b", s.b));
  MLAKIT_RETURN_IF_ERROR(check_dim(op, "lse", a.lse, 1, "h_q", s.h_q));
  MLAKIT_RETURN_IF_ERROR(check_dim(op, "lse", a.lse, 2, "s_q", s.s_q));
  MLAKIT_RETURN_IF_ERROR(check_last_dim_contiguous(op, "lse", a.lse));

  if (a.causal) {
    return invalid(op, "causal: expected false (sparse attention attends exactly the listed indices), got true");
  }
  MLAKIT_RETURN_IF_ERROR(check_logit_scale(op, "softmax_scale", a.softmax_scale));
  MLAKIT_RETURN_IF_ERROR(check_outputs(op, {{"out", a.out}, {"lse", a.lse}},
                                       {{"q", a.q}, {"kv_cache", a.kv_cache}, {"indices", a.indices},
                                        {"topk_length", a.topk_length}, {"attn_sink", a.attn_sink}}));
  *shape = s;
  return Status::ok();
}

}  // namespace mlakit::detail
