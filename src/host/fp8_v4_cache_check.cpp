#include "host/fp8_v4_cache_check.h"

#include <cstdint>
#include <string>

#include "common/fp8_v4_cache_row.h"
#include "host/check.h"

namespace mlakit::detail {

Status check_fp8_paged_cache(const char* op, const char* name, const TensorRef& cache, int64_t token_bytes) {
  MLAKIT_RETURN_IF_ERROR(check_tensor_wellformed(op, name, cache));
  MLAKIT_RETURN_IF_ERROR(check_dtype(op, name, cache, {DType::kUInt8, DType::kFP8E4M3, DType::kInt8}));
  MLAKIT_RETURN_IF_ERROR(check_rank(op, name, cache, 4));
  MLAKIT_RETURN_IF_ERROR(check_dim(op, name, cache, 2, "h_kv", 1));
  MLAKIT_RETURN_IF_ERROR(check_dim(op, name, cache, 3, "bytes per token", token_bytes));
  return check_paged_cache_dims(op, name, cache);
}

Status check_v4_cache(const char* op, const char* name, const TensorRef& cache) {
  MLAKIT_RETURN_IF_ERROR(check_fp8_paged_cache(op, name, cache, kV4TokenBytes));
  if (has_no_elements(cache)) return Status::ok();
  const std::string n(name);
  if (cache.stride[3] != 1) {
    return invalid(op, n + ".stride[3]: expected 1 (a token's bytes contiguous), got " + std::to_string(cache.stride[3]));
  }
  if (cache.stride[1] != kV4TokenBytes) {
    return invalid(op, n + ".stride[1]: expected 584 (the V4 cache's view: records and scales of a block are "
                           "separate arrays, docs/contract.md), got " + std::to_string(cache.stride[1]));
  }
  const int64_t block_bytes = cache.shape[1] * kV4TokenBytes;  // page_size <= 2^30: fits
  if (cache.shape[0] > 1 && cache.stride[0] < block_bytes) {
    return invalid(op, n + ".stride[0]: expected >= page_size * 584 = " + std::to_string(block_bytes) +
                           " (a block's records and scales), got " + std::to_string(cache.stride[0]));
  }
  // Records are read in 16-byte pieces: every block must start 16-byte aligned (stride[1], 584,
  // is no address step, so check_row_alignment's every-stride rule does not apply).
  const auto address = reinterpret_cast<std::uintptr_t>(cache.data);
  if (address % 16 != 0) {
    return invalid(op, n + ": expected a 16-byte aligned pointer, got an address = " + std::to_string(address % 16) +
                           " mod 16");
  }
  if (cache.shape[0] > 1 && cache.stride[0] % 16 != 0) {
    return invalid(op, n + ".stride[0]: expected a multiple of 16 bytes (blocks 16-byte aligned), got " +
                           std::to_string(cache.stride[0]));
  }
  return check_extent_fits(op, name, cache);
}

}  // namespace mlakit::detail
