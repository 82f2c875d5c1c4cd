#include "host/fp8_cache_args.h"

#include <string>

#include "common/fp8_cache_row.h"
#include "host/check.h"
#include "host/output_check.h"

namespace mlakit::detail {

Status tensor_rows(const char* op, const char* name, const TensorRef& t, DType dtype, int64_t row_len,
                   TensorRows* out) {
  MLAKIT_RETURN_IF_ERROR(check_tensor_wellformed(op, name, t));
  MLAKIT_RETURN_IF_ERROR(check_dtype(op, name, t, {dtype}));
  const int last = t.rank - 1;
  MLAKIT_RETURN_IF_ERROR(check_dim(op, name, t, last, "row", row_len));
  MLAKIT_RETURN_IF_ERROR(check_last_dim_contiguous(op, name, t));
  // The rows' count: a broadcast input (stride 0) may claim more than int64 holds; a size of 0
  // anywhere makes it 0 whatever the others are.
  int64_t rows = has_no_elements(t) ? 0 : 1;
  for (int i = 0; i < last && rows > 0; ++i) {
    if (!checked_mul(rows, t.shape[i], &rows)) {
      return invalid(op, std::string(name) + ": shape " + shape_string(t) + ": expected at most 2^63 - 1 rows (" +
                             "the product of the leading dimensions)");
    }
  }
  // Leading dimensions must collapse: stride[i] = stride[i+1] * shape[i+1] above the rows (no
  // row at all: nothing to address).
  for (int i = 0; i + 1 < last && rows > 0; ++i) {
    if (t.shape[i] > 1 && t.stride[i] != t.stride[i + 1] * t.shape[i + 1]) {
      return invalid(op, std::string(name) + ".stride[" + std::to_string(i) + "]: expected " +
                             std::to_string(t.stride[i + 1] * t.shape[i + 1]) +
                             " (leading dimensions collapsible into rows), got " + std::to_string(t.stride[i]));
    }
  }
  out->data = t.data;
  out->rows = rows;
  out->stride = last > 0 ? t.stride[last - 1] : row_len;
  return Status::ok();
}

Status validate_fp8_convert(const char* op, const TensorRef& src, DType src_dtype, int64_t src_len,
                            const TensorRef& dst, DType dst_dtype, int64_t dst_len, TensorRows* src_rows,
                            TensorRows* dst_rows) {
  MLAKIT_RETURN_IF_ERROR(tensor_rows(op, "src", src, src_dtype, src_len, src_rows));
  MLAKIT_RETURN_IF_ERROR(tensor_rows(op, "dst", dst, dst_dtype, dst_len, dst_rows));
  if (src.rank != dst.rank) {
    return invalid(op, "dst: expected rank " + std::to_string(src.rank) + " (src's), got rank " +
                           std::to_string(dst.rank));
  }
  for (int i = 0; i + 1 < src.rank; ++i) {
    MLAKIT_RETURN_IF_ERROR(check_dim(op, "dst", dst, i, "leading", src.shape[i]));
  }
  // 16-byte vector accesses per row.
  MLAKIT_RETURN_IF_ERROR(check_row_alignment(op, "src", src, 16));
  MLAKIT_RETURN_IF_ERROR(check_row_alignment(op, "dst", dst, 16));
  return check_outputs(op, {{"dst", dst}}, {{"src", src}});
}

Status validate_append_tokens(const char* op, const TensorRef& tokens, const TensorRef& slots, int64_t row_len,
                              TensorRows* rows) {
  MLAKIT_RETURN_IF_ERROR(check_tensor_wellformed(op, "tokens", tokens));
  MLAKIT_RETURN_IF_ERROR(check_rank(op, "tokens", tokens, 2));
  MLAKIT_RETURN_IF_ERROR(tensor_rows(op, "tokens", tokens, DType::kBF16, row_len, rows));
  MLAKIT_RETURN_IF_ERROR(check_row_alignment(op, "tokens", tokens, 16));
  MLAKIT_RETURN_IF_ERROR(check_tensor_wellformed(op, "slots", slots));
  MLAKIT_RETURN_IF_ERROR(check_dtype(op, "slots", slots, {DType::kInt32}));
  MLAKIT_RETURN_IF_ERROR(check_rank(op, "slots", slots, 1));
  MLAKIT_RETURN_IF_ERROR(check_dim(op, "slots", slots, 0, "n", tokens.shape[0]));
  return check_last_dim_contiguous(op, "slots", slots);
}

Status validate_fp8_append(const char* op, const TensorRef& tokens, const TensorRef& slots, const TensorRef& cache,
                           Fp8AppendArgs* out) {
  MLAKIT_RETURN_IF_ERROR(validate_append_tokens(op, tokens, slots, kFp8NopeDim + kFp8RopeDim, &out->tokens));
  MLAKIT_RETURN_IF_ERROR(check_tensor_wellformed(op, "cache", cache));
  MLAKIT_RETURN_IF_ERROR(check_dtype(op, "cache", cache, {DType::kUInt8, DType::kFP8E4M3, DType::kInt8}));
  MLAKIT_RETURN_IF_ERROR(check_rank(op, "cache", cache, 4));
  MLAKIT_RETURN_IF_ERROR(check_dim(op, "cache", cache, 2, "h_kv", 1));
  MLAKIT_RETURN_IF_ERROR(check_dim(op, "cache", cache, 3, "bytes per token", kFp8TokenBytes));
  MLAKIT_RETURN_IF_ERROR(check_last_dim_contiguous(op, "cache", cache));
  MLAKIT_RETURN_IF_ERROR(check_row_alignment(op, "cache", cache, 16));
  // The bounds the sparse decode puts on the cache it reads, so slot / page_size and the block
  // offsets stay far from int64 overflow whatever the strides.
  MLAKIT_RETURN_IF_ERROR(check_paged_cache_dims(op, "cache", cache));
  // The cache is written in place at the slots: its rows must be distinct and apart from the
  // tokens and slots. (Two tokens with one slot also race; slots live on the device, unchecked.)
  MLAKIT_RETURN_IF_ERROR(check_outputs(op, {{"cache", cache}}, {{"tokens", tokens}, {"slots", slots}}));
  out->slots = static_cast<const int32_t*>(slots.data);
  out->cache = static_cast<uint8_t*>(cache.data);
  out->block_stride = cache.stride[0];
  out->page_stride = cache.stride[1];
  out->page_size = cache.shape[1];
  out->num_blocks = cache.shape[0];
  return Status::ok();
}

}  // namespace mlakit::detail
