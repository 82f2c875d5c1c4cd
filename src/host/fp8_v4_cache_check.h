// The shape and stride rules of a DeepSeek V4 FP8 cache tensor (common/fp8_v4_cache_row.h),
// shared by the V4 cache tools and the sparse decode.
#pragma once

#include <cstdint>

#include "mlakit/status.h"
#include "mlakit/tensor.h"

namespace mlakit::detail {

// A V4 cache as FlashMLA's quantizer views it: [num_blocks, page_size, 1, 584] bytes (uint8,
// float8_e4m3 or int8), strides [block, 584, any, 1] with the block stride >= page_size * 584
// (the block's records and scales fit) and a multiple of 16, the data 16-byte aligned (records
// are read in 16-byte pieces); page_size and num_blocks within the paged-cache bounds. A tensor
// without elements passes (nothing is read).
Status check_v4_cache(const char* op, const char* name, const TensorRef& cache);

// What both FP8 cache layouts share: [num_blocks, page_size, 1, token_bytes] of a byte dtype
// (uint8, float8_e4m3, int8), page_size and num_blocks within the paged-cache bounds.
Status check_fp8_paged_cache(const char* op, const char* name, const TensorRef& cache, int64_t token_bytes);

}  // namespace mlakit::detail
