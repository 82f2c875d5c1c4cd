#include "host/mha_prefill_validate.h"

#include <cstdint>
#include <optional>
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

// What the forward and the backward read alike: q, k, v, the prefix sums, max_seqlen_*, the
// scale; fills every size of `s`.
Status validate_attention_inputs(const char* op, const TensorRef& q, const TensorRef& k, const TensorRef& v,
                                 const TensorRef& cu_seqlens_q, const TensorRef& cu_seqlens_k, int max_seqlen_q,
                                 int max_seqlen_k, std::optional<float> softmax_scale, MhaPrefillShape* shape) {
  MhaPrefillShape s;
  MLAKIT_RETURN_IF_ERROR(check_rows(op, "q", q, {DType::kBF16, DType::kFP16}));
  s.total_q = q.shape[0];
  MLAKIT_RETURN_IF_ERROR(int_dim(op, "q", q, 1, "h_q", &s.h_q));
  MLAKIT_RETURN_IF_ERROR(int_dim(op, "q", q, 2, "d_qk", &s.d_qk));
  MLAKIT_RETURN_IF_ERROR(check_rows(op, "k", k, {q.dtype}));
  s.total_k = k.shape[0];
  MLAKIT_RETURN_IF_ERROR(int_dim(op, "k", k, 1, "h_kv", &s.h_kv));
  if (s.h_kv < 1 || s.h_q % s.h_kv != 0) {
    return invalid(op, "k.shape[1] (h_kv): expected >= 1 and a divisor of h_q = " + std::to_string(s.h_q) +
                           ", got " + std::to_string(s.h_kv));
  }
  MLAKIT_RETURN_IF_ERROR(check_dim(op, "k", k, 2, "d_qk", s.d_qk));
  MLAKIT_RETURN_IF_ERROR(check_rows(op, "v", v, {q.dtype}));
  MLAKIT_RETURN_IF_ERROR(check_dim(op, "v", v, 0, "total_k", s.total_k));
  MLAKIT_RETURN_IF_ERROR(check_dim(op, "v", v, 1, "h_kv", s.h_kv));
  MLAKIT_RETURN_IF_ERROR(int_dim(op, "v", v, 2, "d_v", &s.d_v));
  if (!is_supported_head_dims(s.d_qk, s.d_v)) {
    return unsupported(op, "q.shape[2], v.shape[2] (d_qk, d_v): expected (64, 64), (128, 128), (192, 128) or "
                           "(256, 256), got (" + std::to_string(s.d_qk) + ", " + std::to_string(s.d_v) + ")");
  }
  MLAKIT_RETURN_IF_ERROR(check_tensor_wellformed(op, "cu_seqlens_q", cu_seqlens_q));
  MLAKIT_RETURN_IF_ERROR(check_rank(op, "cu_seqlens_q", cu_seqlens_q, 1));
  if (cu_seqlens_q.shape[0] < 1) {
    return invalid(op, "cu_seqlens_q.shape[0] (b + 1): expected >= 1, got " + std::to_string(cu_seqlens_q.shape[0]));
  }
  s.b = cu_seqlens_q.shape[0] - 1;
  MLAKIT_RETURN_IF_ERROR(check_vector(op, "cu_seqlens_q", cu_seqlens_q, DType::kInt32, "b + 1", s.b + 1));
  MLAKIT_RETURN_IF_ERROR(check_vector(op, "cu_seqlens_k", cu_seqlens_k, DType::kInt32, "b + 1", s.b + 1));
  MLAKIT_RETURN_IF_ERROR(check_max_seqlen(op, "max_seqlen_q", max_seqlen_q));
  MLAKIT_RETURN_IF_ERROR(check_max_seqlen(op, "max_seqlen_k", max_seqlen_k));
  MLAKIT_RETURN_IF_ERROR(check_logit_scale(op, "softmax_scale", softmax_scale));
  *shape = s;
  return Status::ok();
}

// One named dimension of a [rows, heads, d] tensor, for the messages ("total_q", "h_kv").
struct NamedDim {
  const char* name;
  int64_t size;
};

// A [rows, heads, d] tensor of exactly these sizes in `dtype` (or also float32 with
// `allow_float`: the references' unrounded results), last dimension contiguous.
Status check_sized_rows(const char* op, const char* name, const TensorRef& t, DType dtype, bool allow_float,
                        NamedDim rows, NamedDim heads, NamedDim d) {
  MLAKIT_RETURN_IF_ERROR(check_tensor_wellformed(op, name, t));
  MLAKIT_RETURN_IF_ERROR(check_output_dtype(op, name, t, dtype, allow_float));
  MLAKIT_RETURN_IF_ERROR(check_rank(op, name, t, 3));
  MLAKIT_RETURN_IF_ERROR(check_dim(op, name, t, 0, rows.name, rows.size));
  MLAKIT_RETURN_IF_ERROR(check_dim(op, name, t, 1, heads.name, heads.size));
  MLAKIT_RETURN_IF_ERROR(check_dim(op, name, t, 2, d.name, d.size));
  MLAKIT_RETURN_IF_ERROR(check_last_dim_contiguous(op, name, t));
  return check_extent_fits(op, name, t);
}

// lse [h_q, total_q] float32, last dimension contiguous (given: the caller checks presence).
Status check_lse(const char* op, const TensorRef& lse, const MhaPrefillShape& s) {
  MLAKIT_RETURN_IF_ERROR(check_tensor_wellformed(op, "lse", lse));
  MLAKIT_RETURN_IF_ERROR(check_dtype(op, "lse", lse, {DType::kFP32}));
  MLAKIT_RETURN_IF_ERROR(check_rank(op, "lse", lse, 2));
  MLAKIT_RETURN_IF_ERROR(check_dim(op, "lse", lse, 0, "h_q", s.h_q));
  MLAKIT_RETURN_IF_ERROR(check_dim(op, "lse", lse, 1, "total_q", s.total_q));
  MLAKIT_RETURN_IF_ERROR(check_last_dim_contiguous(op, "lse", lse));
  return check_extent_fits(op, "lse", lse);
}

}  // namespace

Status validate_mha_prefill_args(const char* op, const MhaPrefillArgs& a, bool allow_float_out,
                                 MhaPrefillShape* shape) {
  MhaPrefillShape s;
  MLAKIT_RETURN_IF_ERROR(validate_attention_inputs(op, a.q, a.k, a.v, a.cu_seqlens_q, a.cu_seqlens_k, a.max_seqlen_q,
                                                   a.max_seqlen_k, a.softmax_scale, &s));
  MLAKIT_RETURN_IF_ERROR(check_sized_rows(op, "out", a.out, a.q.dtype, allow_float_out, {"total_q", s.total_q},
                                          {"h_q", s.h_q}, {"d_v", s.d_v}));
  if (!a.lse.empty()) MLAKIT_RETURN_IF_ERROR(check_lse(op, a.lse, s));
  MLAKIT_RETURN_IF_ERROR(check_outputs(op, {{"out", a.out}, {"lse", a.lse}},
                                       {{"q", a.q}, {"k", a.k}, {"v", a.v}, {"cu_seqlens_q", a.cu_seqlens_q},
                                        {"cu_seqlens_k", a.cu_seqlens_k}}));
  *shape = s;
  return Status::ok();
}

Status validate_mha_prefill_backward_args(const char* op, const MhaPrefillBackwardArgs& a, bool allow_float,
                                          MhaPrefillShape* shape) {
  MhaPrefillShape s;
  MLAKIT_RETURN_IF_ERROR(validate_attention_inputs(op, a.q, a.k, a.v, a.cu_seqlens_q, a.cu_seqlens_k, a.max_seqlen_q,
                                                   a.max_seqlen_k, a.softmax_scale, &s));
  const DType dt = a.q.dtype;
  const NamedDim total_q{"total_q", s.total_q}, total_k{"total_k", s.total_k}, h_q{"h_q", s.h_q}, h_kv{"h_kv", s.h_kv},
      d_qk{"d_qk", s.d_qk}, d_v{"d_v", s.d_v};
  MLAKIT_RETURN_IF_ERROR(check_sized_rows(op, "dout", a.dout, dt, /*allow_float=*/false, total_q, h_q, d_v));
  MLAKIT_RETURN_IF_ERROR(check_sized_rows(op, "out", a.out, dt, allow_float, total_q, h_q, d_v));
  if (a.lse.empty()) {
    return invalid(op, "lse: expected a float32 tensor [h_q, total_q] (the forward's lse: the backward needs it), "
                       "got none");
  }
  MLAKIT_RETURN_IF_ERROR(check_lse(op, a.lse, s));
  MLAKIT_RETURN_IF_ERROR(check_sized_rows(op, "dq", a.dq, dt, allow_float, total_q, h_q, d_qk));
  MLAKIT_RETURN_IF_ERROR(check_sized_rows(op, "dk", a.dk, dt, allow_float, total_k, h_kv, d_qk));
  MLAKIT_RETURN_IF_ERROR(check_sized_rows(op, "dv", a.dv, dt, allow_float, total_k, h_kv, d_v));
  MLAKIT_RETURN_IF_ERROR(check_outputs(op, {{"dq", a.dq}, {"dk", a.dk}, {"dv", a.dv}},
                                       {{"dout", a.dout}, {"q", a.q}, {"k", a.k}, {"v", a.v}, {"out", a.out},
                                        {"lse", a.lse}, {"cu_seqlens_q", a.cu_seqlens_q},
                                        {"cu_seqlens_k", a.cu_seqlens_k}}));
  *shape = s;
  return Status::ok();
}

// Rows of `t` start at multiples of `bytes` (base pointer and the two outer strides): the
// kernels move two 16-bit values at a time at least (the Hopper kernel needs 16-byte rows of
// q, k and v; the dispatch falls back to the portable kernel without them). Unlike
// detail::check_row_alignment this checks strides of size-1 dimensions too: the Hopper
// kernel's tensor maps carry both strides whatever the extents. An empty tensor moves no row.
Status check_mha_row_alignment(const char* op, const char* name, const TensorRef& t, int64_t bytes) {
  if (has_no_elements(t)) return Status::ok();
  const auto elem = static_cast<int64_t>(dtype_size(t.dtype));
  const int64_t elems = bytes / elem;  // strides are in elements: no byte product to overflow
  const bool aligned = reinterpret_cast<std::uintptr_t>(t.data) % bytes == 0 && t.stride[0] % elems == 0 &&
                       t.stride[1] % elems == 0;
  if (aligned) return Status::ok();
  return invalid(op, std::string(name) + ": the kernel needs rows aligned to " + std::to_string(bytes) +
                                  " bytes (data pointer and strides[0..1] multiples of " + std::to_string(elems) +
                                  " elements), got strides (" + std::to_string(t.stride[0]) + ", " +
                                  std::to_string(t.stride[1]) + ")");
}

}  // namespace mlakit::detail
