// GPU entry points of the GQA cache tools (include/mlakit/gqa_cache.h) and the validation
// they share with the CPU tools (host/gqa_cache_validate.h): validate, check the device and
// the pointers, then one launch through the dispatch. Empty inputs are valid (nothing runs).
#include "mlakit/gqa_cache.h"

#include <cmath>
#include <initializer_list>
#include <string>
#include <utility>

#include "host/check.h"
#include "host/gqa_decode_validate.h"
#include "host/device.h"
#include "host/gqa_cache_validate.h"
#include "host/output_check.h"
#if MLAKIT_WITH_CUDA
#include "dispatch/gqa_cache_dispatch.h"
#endif

namespace mlakit {
namespace detail {
namespace {

std::string given(const TensorRef& t) { return t.empty() ? std::string("none") : "shape " + shape_string(t); }

// A rank-4 tensor [num_blocks | b, page_size | s_q, h_kv, d] in one of `dtypes`, last dimension
// contiguous, with `sizes` (negative: any) on each axis.
Status check_4d(const char* op, const char* name, const TensorRef& t, std::initializer_list<DType> dtypes,
                const char* const (&dims)[4], const int64_t (&sizes)[4]) {
  MLAKIT_RETURN_IF_ERROR(check_tensor_wellformed(op, name, t));
  MLAKIT_RETURN_IF_ERROR(check_dtype(op, name, t, dtypes));
  MLAKIT_RETURN_IF_ERROR(check_rank(op, name, t, 4));
  for (int axis = 0; axis < 4; ++axis) {
    if (sizes[axis] >= 0) MLAKIT_RETURN_IF_ERROR(check_dim(op, name, t, axis, dims[axis], sizes[axis]));
  }
  return check_last_dim_contiguous(op, name, t);
}

// The head dim of `name` (its last dimension): 64, 128 or 256, the GQA decode's.
Status check_head_dim(const char* op, const char* name, const TensorRef& t, int* d) {
  const int64_t v = t.shape[3];
  if (v != 64 && v != 128 && v != 256) {
    return unsupported(op, std::string(name) + ".shape[3] (d): expected 64, 128 or 256, got " + std::to_string(v));
  }
  *d = static_cast<int>(v);
  return Status::ok();
}

// [num_blocks, page_size, h_kv, d] of a paged cache tensor (bf16 | fp16 | int8 | fp8).
Status check_cache_dims(const char* op, const char* name, const TensorRef& t, std::initializer_list<DType> dtypes,
                        GqaCacheShape* s) {
  MLAKIT_RETURN_IF_ERROR(check_4d(op, name, t, dtypes, {"num_blocks", "page_size", "h_kv", "d"}, {-1, -1, -1, -1}));
  MLAKIT_RETURN_IF_ERROR(check_head_dim(op, name, t, &s->d));
  MLAKIT_RETURN_IF_ERROR(check_paged_cache_dims(op, name, t));
  MLAKIT_RETURN_IF_ERROR(int_dim(op, name, t, 2, "h_kv", &s->h_kv));
  s->num_blocks = t.shape[0];
  s->page_size = t.shape[1];
  return Status::ok();
}

// The scale tensor `name` of a cache holding `cache_dtype` (dims of `s`): none for the 16-bit
// dtype `dense_dtype`; else float32 [num_blocks, page_size, h_kv] (per token) or, fp8 only,
// [1] (per tensor). `v_of_k`: v's scale, which must have k's `*layout`.
Status check_cache_scale(const char* op, const char* name, const TensorRef& scale, DType cache_dtype, DType dense_dtype,
                         const GqaCacheShape& s, bool v_of_k, GqaScaleLayout* layout) {
  if (cache_dtype == dense_dtype) {
    if (!scale.empty()) {
      return invalid(op, std::string(name) + ": expected none (the cache holds " + dtype_name(dense_dtype) +
                             ", nothing to dequantize), got " + given(scale));
    }
    *layout = GqaScaleLayout::kNone;
    return Status::ok();
  }
  if (scale.empty()) {
    return invalid(op, std::string(name) + ": expected a float32 tensor (a " + dtype_name(cache_dtype) +
                           " cache needs dequantization scales), got none");
  }
  MLAKIT_RETURN_IF_ERROR(check_tensor_wellformed(op, name, scale));
  MLAKIT_RETURN_IF_ERROR(check_dtype(op, name, scale, {DType::kFP32}));
  const bool fp8 = cache_dtype == DType::kFP8E4M3;
  if (v_of_k) {
    const int rank = *layout == GqaScaleLayout::kPerTensor ? 1 : 3;
    if (scale.rank != rank) {
      return invalid(op, std::string(name) + ": expected rank " + std::to_string(rank) +
                             " (the layout of k_cache.scale), got rank " + std::to_string(scale.rank));
    }
  } else if (scale.rank != 3 && !(fp8 && scale.rank == 1)) {
    return invalid(op, std::string(name) + ": expected rank 3 ([num_blocks, page_size, h_kv]" +
                           (fp8 ? ") or rank 1 ([1], one scale per tensor)" : "; int8 has per-token scales only)") +
                           ", got rank " + std::to_string(scale.rank) + " (shape " + shape_string(scale) + ")");
  }
  if (scale.rank == 1) {
    *layout = GqaScaleLayout::kPerTensor;
    return check_dim(op, name, scale, 0, "one per tensor", 1);
  }
  *layout = GqaScaleLayout::kPerToken;
  MLAKIT_RETURN_IF_ERROR(check_dim(op, name, scale, 0, "num_blocks", s.num_blocks));
  MLAKIT_RETURN_IF_ERROR(check_dim(op, name, scale, 1, "page_size", s.page_size));
  MLAKIT_RETURN_IF_ERROR(check_dim(op, name, scale, 2, "h_kv", s.h_kv));
  return check_last_dim_contiguous(op, name, scale);
}

// quantize / dequantize: the input (the dense src of quantize, the quantized src of
// dequantize) fixes the shape, the output must have it; then the scales.
Status validate_convert(const char* op, const TensorRef& dense, const char* dense_name, const GqaPagedCache& cache,
                        const char* values_name, const char* scale_name, bool quantize, GqaCacheShape* s) {
  constexpr const char* kDims[4] = {"num_blocks", "page_size", "h_kv", "d"};
  const auto dense_dtypes = {DType::kBF16, DType::kFP16};
  const auto cache_dtypes = {DType::kInt8, DType::kFP8E4M3};
  if (quantize) {
    MLAKIT_RETURN_IF_ERROR(check_cache_dims(op, dense_name, dense, dense_dtypes, s));
    MLAKIT_RETURN_IF_ERROR(
        check_4d(op, values_name, cache.values, cache_dtypes, kDims, {s->num_blocks, s->page_size, s->h_kv, s->d}));
  } else {
    MLAKIT_RETURN_IF_ERROR(check_cache_dims(op, values_name, cache.values, cache_dtypes, s));
  }
  s->cache_dtype = cache.values.dtype;
  // The cache is int8 or fp8 here, never a 16-bit dtype: kBF16 only fills the argument.
  MLAKIT_RETURN_IF_ERROR(
      check_cache_scale(op, scale_name, cache.scale, s->cache_dtype, DType::kBF16, *s, false, &s->scale_layout));
  if (!quantize) {
    MLAKIT_RETURN_IF_ERROR(
        check_4d(op, dense_name, dense, dense_dtypes, kDims, {s->num_blocks, s->page_size, s->h_kv, s->d}));
  }
  s->dense_dtype = dense.dtype;
  return Status::ok();
}

}  // namespace

Status validate_quantize_gqa_cache(const char* op, const TensorRef& src, const GqaPagedCache& dst,
                                   GqaCacheShape* shape) {
  GqaCacheShape s;
  MLAKIT_RETURN_IF_ERROR(validate_convert(op, src, "src", dst, "dst.values", "dst.scale", true, &s));
  const bool per_token = s.scale_layout == GqaScaleLayout::kPerToken;
  const TensorRef none;
  MLAKIT_RETURN_IF_ERROR(check_outputs(op, {{"dst.values", dst.values}, {"dst.scale", per_token ? dst.scale : none}},
                                       {{"src", src}, {"dst.scale", per_token ? none : dst.scale}}));
  *shape = s;
  return Status::ok();
}

Status validate_dequantize_gqa_cache(const char* op, const GqaPagedCache& src, const TensorRef& dst,
                                     GqaCacheShape* shape) {
  GqaCacheShape s;
  MLAKIT_RETURN_IF_ERROR(validate_convert(op, dst, "dst", src, "src.values", "src.scale", false, &s));
  MLAKIT_RETURN_IF_ERROR(check_outputs(op, {{"dst", dst}}, {{"src.values", src.values}, {"src.scale", src.scale}}));
  *shape = s;
  return Status::ok();
}

Status validate_gqa_cache_append(const char* op, const GqaCacheAppendArgs& a, GqaAppendShape* shape) {
  GqaAppendShape p;
  MLAKIT_RETURN_IF_ERROR(
      check_4d(op, "k_new", a.k_new, {DType::kBF16, DType::kFP16}, {"b", "s_q", "h_kv", "d"}, {-1, -1, -1, -1}));
  MLAKIT_RETURN_IF_ERROR(check_head_dim(op, "k_new", a.k_new, &p.d));
  p.b = a.k_new.shape[0];
  p.new_dtype = a.k_new.dtype;
  MLAKIT_RETURN_IF_ERROR(int_dim(op, "k_new", a.k_new, 1, "s_q", &p.s_q));
  MLAKIT_RETURN_IF_ERROR(int_dim(op, "k_new", a.k_new, 2, "h_kv", &p.h_kv));
  if (p.b > (int64_t{1} << 30)) return invalid(op, "k_new.shape[0] (b): expected <= 2^30, got " + std::to_string(p.b));
  int64_t rows = 0;  // a broadcast k_new (stride 0) may claim any number
  if (!checked_mul(p.b, p.s_q, &rows) || !checked_mul(rows, p.h_kv, &rows) || rows > (int64_t{1} << 48)) {
    return invalid(op, "k_new: shape " + shape_string(a.k_new) + ": expected at most 2^48 rows (b * s_q * h_kv)");
  }
  MLAKIT_RETURN_IF_ERROR(check_tensor_wellformed(op, "v_new", a.v_new));
  MLAKIT_RETURN_IF_ERROR(check_same_dtype(op, "v_new", a.v_new, "k_new", p.new_dtype));
  MLAKIT_RETURN_IF_ERROR(
      check_4d(op, "v_new", a.v_new, {p.new_dtype}, {"b", "s_q", "h_kv", "d"}, {p.b, p.s_q, p.h_kv, p.d}));

  GqaCacheShape k;
  const auto cache_dtypes = {p.new_dtype, DType::kInt8, DType::kFP8E4M3};
  MLAKIT_RETURN_IF_ERROR(check_4d(op, "k_cache.values", a.k_cache.values, cache_dtypes,
                                  {"num_blocks", "page_size", "h_kv", "d"}, {-1, -1, p.h_kv, p.d}));
  MLAKIT_RETURN_IF_ERROR(check_cache_dims(op, "k_cache.values", a.k_cache.values, cache_dtypes, &k));
  p.num_blocks = k.num_blocks;
  p.page_size = k.page_size;
  p.cache_dtype = a.k_cache.values.dtype;
  MLAKIT_RETURN_IF_ERROR(check_tensor_wellformed(op, "v_cache.values", a.v_cache.values));
  MLAKIT_RETURN_IF_ERROR(check_same_dtype(op, "v_cache.values", a.v_cache.values, "k_cache.values", p.cache_dtype));
  MLAKIT_RETURN_IF_ERROR(check_4d(op, "v_cache.values", a.v_cache.values, {p.cache_dtype},
                                  {"num_blocks", "page_size", "h_kv", "d"}, {k.num_blocks, k.page_size, p.h_kv, p.d}));
  MLAKIT_RETURN_IF_ERROR(
      check_cache_scale(op, "k_cache.scale", a.k_cache.scale, p.cache_dtype, p.new_dtype, k, false, &p.scale_layout));
  MLAKIT_RETURN_IF_ERROR(
      check_cache_scale(op, "v_cache.scale", a.v_cache.scale, p.cache_dtype, p.new_dtype, k, true, &p.scale_layout));

  MLAKIT_RETURN_IF_ERROR(check_block_table(op, a.block_table, p.b));
  MLAKIT_RETURN_IF_ERROR(int_dim(op, "block_table", a.block_table, 1, "max_blocks_per_seq", &p.max_blocks_per_seq));
  MLAKIT_RETURN_IF_ERROR(check_vector(op, "cache_seqlens", a.cache_seqlens, DType::kInt32, "b", p.b));
  MLAKIT_RETURN_IF_ERROR(check_optional_vector(op, "finished", a.finished, DType::kUInt8, "b", p.b));
  MLAKIT_RETURN_IF_ERROR(check_rope(op, a.rope, p.d, &p.rotary_dim));

  // The caches and their per-token scales are written; a per-tensor scale is only read.
  const TensorRef none;
  const bool per_token = p.scale_layout == GqaScaleLayout::kPerToken;
  MLAKIT_RETURN_IF_ERROR(check_outputs(op,
                                       {{"k_cache.values", a.k_cache.values},
                                        {"v_cache.values", a.v_cache.values},
                                        {"k_cache.scale", per_token ? a.k_cache.scale : none},
                                        {"v_cache.scale", per_token ? a.v_cache.scale : none}},
                                       {{"k_new", a.k_new},
                                        {"v_new", a.v_new},
                                        {"block_table", a.block_table},
                                        {"cache_seqlens", a.cache_seqlens},
                                        {"finished", a.finished},
                                        {"k_cache.scale", per_token ? none : a.k_cache.scale},
                                        {"v_cache.scale", per_token ? none : a.v_cache.scale}}));
  *shape = p;
  return Status::ok();
}

}  // namespace detail

namespace {

#if MLAKIT_WITH_CUDA
// The current device runs mlakit's kernels and every given pointer is its memory.
Status device_and_pointers(const char* op, std::initializer_list<std::pair<const char*, const TensorRef*>> tensors) {
  detail::DeviceInfo dev;
  MLAKIT_RETURN_IF_ERROR(detail::current_supported_device(op, &dev));
  for (const auto& [name, t] : tensors) {
    if (t->data != nullptr) MLAKIT_RETURN_IF_ERROR(detail::check_device_pointer(op, name, t->data, dev.ordinal));
  }
  return Status::ok();
}
#endif

}  // namespace

Status quantize_gqa_cache(const TensorRef& src, const GqaPagedCache& dst, cudaStream_t stream) {
  constexpr const char* kOp = "quantize_gqa_cache";
  detail::GqaCacheShape shape;
  MLAKIT_RETURN_IF_ERROR(detail::validate_quantize_gqa_cache(kOp, src, dst, &shape));
#if MLAKIT_WITH_CUDA
  MLAKIT_RETURN_IF_ERROR(
      device_and_pointers(kOp, {{"src", &src}, {"dst.values", &dst.values}, {"dst.scale", &dst.scale}}));
  return detail::dispatch_quantize_gqa_cache(kOp, src, dst, stream);
#else
  (void)stream;
  return detail::built_without_cuda(kOp);
#endif
}

Status dequantize_gqa_cache(const GqaPagedCache& src, const TensorRef& dst, cudaStream_t stream) {
  constexpr const char* kOp = "dequantize_gqa_cache";
  detail::GqaCacheShape shape;
  MLAKIT_RETURN_IF_ERROR(detail::validate_dequantize_gqa_cache(kOp, src, dst, &shape));
#if MLAKIT_WITH_CUDA
  MLAKIT_RETURN_IF_ERROR(
      device_and_pointers(kOp, {{"src.values", &src.values}, {"src.scale", &src.scale}, {"dst", &dst}}));
  return detail::dispatch_dequantize_gqa_cache(kOp, src, dst, stream);
#else
  (void)stream;
  return detail::built_without_cuda(kOp);
#endif
}

Status gqa_cache_append(const GqaCacheAppendArgs& args, cudaStream_t stream) {
  constexpr const char* kOp = "gqa_cache_append";
  detail::GqaAppendShape shape;
  MLAKIT_RETURN_IF_ERROR(detail::validate_gqa_cache_append(kOp, args, &shape));
#if MLAKIT_WITH_CUDA
  MLAKIT_RETURN_IF_ERROR(device_and_pointers(kOp, {{"k_new", &args.k_new},
                                                   {"v_new", &args.v_new},
                                                   {"k_cache.values", &args.k_cache.values},
                                                   {"k_cache.scale", &args.k_cache.scale},
                                                   {"v_cache.values", &args.v_cache.values},
                                                   {"v_cache.scale", &args.v_cache.scale},
                                                   {"block_table", &args.block_table},
                                                   {"cache_seqlens", &args.cache_seqlens},
                                                   {"finished", &args.finished}}));
  return detail::dispatch_gqa_cache_append(kOp, args, shape.rotary_dim, stream);
#else
  (void)stream;
  return detail::built_without_cuda(kOp);
#endif
}

}  // namespace mlakit
