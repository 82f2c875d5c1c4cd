// Validated arguments of the DeepSeek V4 FP8 cache tools (quantize, dequantize, paged append)
// as plain data: made by host validation (host/fp8_v4_cache_args.h), read by the dispatch, the
// kernels and the CPU reference. The token layout is common/fp8_v4_cache_row.h.
#pragma once

#include <cstdint>

#include "common/fp8_cache_rows.h"
#include "common/fp8_v4_cache_row.h"
#include "common/host_device.h"

namespace mlakit::detail {

// A V4 cache: num_blocks page blocks of page_size tokens, block_stride bytes apart; block b
// holds the records (v4_record_offset) and scale records (v4_scale_offset) of its tokens.
struct V4CacheBlocks {
  uint8_t* data = nullptr;  // [num_blocks, page_size, 584] bytes (records, then scale records)
  int64_t num_blocks = 0;
  int64_t page_size = 0;
  int64_t block_stride = 0;  // bytes, a multiple of 16
};

// bf16 tokens laid out like the cache: token (block, offset) at
// data + block * block_stride + offset * token_stride (elements), rows 16-byte aligned.
struct V4TokenRows {
  void* data = nullptr;  // [num_blocks, page_size, 512] bf16
  int64_t block_stride = 0;
  int64_t token_stride = 0;
};

// Which way a conversion goes: bf16 tokens -> cache, or cache -> bf16 tokens.
enum class V4Convert { kQuantize, kDequantize };

// Token (block, offset)'s record and scale record.
struct V4CacheToken {
  uint8_t* record;
  uint8_t* scales;
};
MLAKIT_HD V4CacheToken v4_cache_token(const V4CacheBlocks& c, int64_t block, int64_t offset) {
  uint8_t* b = c.data + block * c.block_stride;
  return {b + v4_record_offset(offset), b + v4_scale_offset(c.page_size, offset)};
}

MLAKIT_HD uint16_t* v4_token_row(const V4TokenRows& rows, int64_t block, int64_t offset) {
  return static_cast<uint16_t*>(rows.data) + block * rows.block_stride + offset * rows.token_stride;
}

// quantize and dequantize: tokens and cache of the same num_blocks and page_size.
struct V4ConvertArgs {
  V4TokenRows rows;
  V4CacheBlocks cache;
};

// append: token i goes to slot slots[i] = block * page_size + offset of the cache; slots
// outside [0, num_blocks * page_size) are skipped.
struct V4AppendArgs {
  TensorRows tokens;  // [n, 512] bf16, n = tokens.rows
  const int32_t* slots = nullptr;  // [n]
  V4CacheBlocks cache;
};

}  // namespace mlakit::detail
