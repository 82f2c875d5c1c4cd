#include "host/fp8_v4_cache_args.h"

#include <string>

#include "common/fp8_v4_cache_row.h"
#include "host/check.h"
#include "host/fp8_cache_args.h"
#include "host/fp8_v4_cache_check.h"
#include "host/output_check.h"
#include "mlakit/fp8_cache.h"

namespace mlakit::detail {

static_assert(kMlaFp8V4TokenBytes == kV4TokenBytes && kMlaFp8V4Dqk == kV4Dqk, "the public constants of fp8_cache.h");

namespace {

// bf16 tokens [num_blocks, page_size, (1,) 512]: any block and token strides, the last
// dimension contiguous, rows 16-byte aligned (16-byte loads and stores).
Status check_token_rows(const char* op, const char* name, const TensorRef& t) {
  MLAKIT_RETURN_IF_ERROR(check_tensor_wellformed(op, name, t));
  MLAKIT_RETURN_IF_ERROR(check_dtype(op, name, t, {DType::kBF16}));
  if (t.rank != 3 && t.rank != 4) {
    return invalid(op, std::string(name) + ": expected rank 4 [num_blocks, page_size, 1, 512] or 3 [num_blocks, "
                                           "page_size, 512], got rank " + std::to_string(t.rank) + " (shape " +
                           shape_string(t) + ")");
  }
  if (t.rank == 4) MLAKIT_RETURN_IF_ERROR(check_dim(op, name, t, 2, "h_kv", 1));
  MLAKIT_RETURN_IF_ERROR(check_dim(op, name, t, t.rank - 1, "d_qk", kV4Dqk));
  MLAKIT_RETURN_IF_ERROR(check_last_dim_contiguous(op, name, t));
  return check_row_alignment(op, name, t, 16);
}

// The tokens' num_blocks and page_size are the cache's; `dst` names whichever is the output.
Status check_same_blocks(const char* op, const char* dst_name, const TensorRef& dst, const char* src_name,
                         const TensorRef& src) {
  static constexpr const char* kDims[] = {"num_blocks", "page_size"};
  for (int i = 0; i < 2; ++i) {
    if (dst.shape[i] != src.shape[i]) {
      return invalid(op, std::string(dst_name) + ".shape[" + std::to_string(i) + "] (" + kDims[i] + "): expected " +
                             std::to_string(src.shape[i]) + " (" + src_name + "'s), got " +
                             std::to_string(dst.shape[i]));
    }
  }
  return Status::ok();
}

V4CacheBlocks cache_blocks(const TensorRef& cache) {
  return {.data = static_cast<uint8_t*>(cache.data),
          .num_blocks = cache.shape[0],
          .page_size = cache.shape[1],
          .block_stride = cache.stride[0]};
}

}  // namespace

Status validate_v4_convert(const char* op, V4Convert direction, const TensorRef& src, const TensorRef& dst,
                           V4ConvertArgs* out) {
  const bool quantize = direction == V4Convert::kQuantize;
  MLAKIT_RETURN_IF_ERROR(quantize ? check_token_rows(op, "src", src) : check_v4_cache(op, "src", src));
  MLAKIT_RETURN_IF_ERROR(quantize ? check_v4_cache(op, "dst", dst) : check_token_rows(op, "dst", dst));
  MLAKIT_RETURN_IF_ERROR(check_same_blocks(op, "dst", dst, "src", src));
  MLAKIT_RETURN_IF_ERROR(check_outputs(op, {{"dst", dst}}, {{"src", src}}));
  const TensorRef& rows = quantize ? src : dst;
  *out = {.rows = {.data = rows.data, .block_stride = rows.stride[0], .token_stride = rows.stride[1]},
          .cache = cache_blocks(quantize ? dst : src)};
  return Status::ok();
}

Status validate_v4_append(const char* op, const TensorRef& tokens, const TensorRef& slots, const TensorRef& cache,
                          V4AppendArgs* out) {
  MLAKIT_RETURN_IF_ERROR(validate_append_tokens(op, tokens, slots, kV4Dqk, &out->tokens));
  MLAKIT_RETURN_IF_ERROR(check_v4_cache(op, "cache", cache));
  // Written in place at the slots: apart from the tokens and slots. (Two tokens with one slot
  // race; slots live on the device, unchecked.)
  MLAKIT_RETURN_IF_ERROR(check_outputs(op, {{"cache", cache}}, {{"tokens", tokens}, {"slots", slots}}));
  out->slots = static_cast<const int32_t*>(slots.data);
  out->cache = cache_blocks(cache);
  return Status::ok();
}

}  // namespace mlakit::detail
