#include "host/mla_sparse_decode_validate.h"

#include <string>

#include "common/fp8_cache_row.h"
#include "common/fp8_v4_cache_row.h"
#include "host/check.h"
#include "host/fp8_v4_cache_check.h"
#include "host/output_check.h"

namespace mlakit::detail {
namespace {

// A cache of the layout q's d_qk names: [num_blocks, page_size, 1, 656] (V3.2) or the V4 view.
Status check_cache(const char* op, const char* name, const TensorRef& cache, Fp8TokenLayout layout,
                   SparseCacheShape* shape) {
  if (layout == Fp8TokenLayout::kV4) {
    MLAKIT_RETURN_IF_ERROR(check_v4_cache(op, name, cache));
  } else {
    MLAKIT_RETURN_IF_ERROR(check_fp8_paged_cache(op, name, cache, kFp8TokenBytes));
    MLAKIT_RETURN_IF_ERROR(check_last_dim_contiguous(op, name, cache));
  }
  shape->num_blocks = cache.shape[0];
  shape->page_size = cache.shape[1];
  return Status::ok();
}

// An index list [b, s_q, topk] int32, last dimension contiguous.
Status check_indices(const char* op, const char* name, const char* dim_name, const TensorRef& indices,
                     const SparseDecodeShape& s, int* topk) {
  MLAKIT_RETURN_IF_ERROR(check_tensor_wellformed(op, name, indices));
  MLAKIT_RETURN_IF_ERROR(check_dtype(op, name, indices, {DType::kInt32}));
  MLAKIT_RETURN_IF_ERROR(check_rank(op, name, indices, 3));
  MLAKIT_RETURN_IF_ERROR(check_dim(op, name, indices, 0, "b", s.b));
  MLAKIT_RETURN_IF_ERROR(check_dim(op, name, indices, 1, "s_q", s.s_q));
  MLAKIT_RETURN_IF_ERROR(check_last_dim_contiguous(op, name, indices));
  return check_topk(op, name, dim_name, indices, topk);
}

// The second cache: extra_kv_cache and extra_indices together, extra_topk_length only with them.
Status check_extra_cache(const char* op, const MlaSparseDecodeArgs& a, SparseDecodeShape* s) {
  const bool cache = !a.extra_kv_cache.empty(), indices = !a.extra_indices.empty();
  if (cache != indices) {
    return invalid(op, std::string(cache ? "extra_indices" : "extra_kv_cache") +
                           ": expected a tensor (extra_kv_cache and extra_indices come together), got none");
  }
  if (!cache) {
    if (!a.extra_topk_length.empty()) {
      return invalid(op, "extra_topk_length: expected none without extra_kv_cache and extra_indices, got a tensor");
    }
    return Status::ok();
  }
  MLAKIT_RETURN_IF_ERROR(check_cache(op, "extra_kv_cache", a.extra_kv_cache, s->layout, &s->extra));
  MLAKIT_RETURN_IF_ERROR(check_indices(op, "extra_indices", "extra_topk", a.extra_indices, *s, &s->extra.topk));
  return check_optional_vector(op, "extra_topk_length", a.extra_topk_length, DType::kInt32, "b", s->b);
}

}  // namespace

Status validate_mla_sparse_decode_args(const char* op, const MlaSparseDecodeArgs& a, bool allow_float_out,
                                       SparseDecodeShape* shape) {
  MLAKIT_RETURN_IF_ERROR(check_tensor_wellformed(op, "q", a.q));
  MLAKIT_RETURN_IF_ERROR(check_dtype(op, "q", a.q, {DType::kBF16}));
  MLAKIT_RETURN_IF_ERROR(check_rank(op, "q", a.q, 4));
  SparseDecodeShape s;  // b, s_q or h_q of 0: the empty result
  if (a.q.shape[3] == kV4Dqk) {
    s.layout = Fp8TokenLayout::kV4;
    s.d_qk = kV4Dqk;
  } else if (a.q.shape[3] != kFp8NopeDim + kFp8RopeDim) {
    return invalid(op, "q.shape[3] (d_qk): expected 576 (DeepSeek V3.2, 656-byte cache) or 512 (DeepSeek V4, "
                       "584-byte cache), got " + std::to_string(a.q.shape[3]));
  }
  MLAKIT_RETURN_IF_ERROR(check_last_dim_contiguous(op, "q", a.q));
  s.b = a.q.shape[0];
  MLAKIT_RETURN_IF_ERROR(int_dim(op, "q", a.q, 1, "s_q", &s.s_q));
  MLAKIT_RETURN_IF_ERROR(int_dim(op, "q", a.q, 2, "h_q", &s.h_q));

  SparseCacheShape main;
  MLAKIT_RETURN_IF_ERROR(check_cache(op, "kv_cache", a.kv_cache, s.layout, &main));
  s.num_blocks = main.num_blocks;
  s.page_size = main.page_size;
  MLAKIT_RETURN_IF_ERROR(check_indices(op, "indices", "topk", a.indices, s, &s.topk));
  MLAKIT_RETURN_IF_ERROR(check_optional_vector(op, "topk_length", a.topk_length, DType::kInt32, "b", s.b));
  MLAKIT_RETURN_IF_ERROR(check_extra_cache(op, a, &s));
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
                                       {{"q", a.q},
                                        {"kv_cache", a.kv_cache},
                                        {"indices", a.indices},
                                        {"topk_length", a.topk_length},
                                        {"extra_kv_cache", a.extra_kv_cache},
                                        {"extra_indices", a.extra_indices},
                                        {"extra_topk_length", a.extra_topk_length},
                                        {"attn_sink", a.attn_sink}}));
  *shape = s;
  return Status::ok();
}

}  // namespace mlakit::detail
