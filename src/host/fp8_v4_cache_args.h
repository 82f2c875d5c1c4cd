// Validation of the DeepSeek V4 FP8 cache tools' arguments, shared by the GPU entry points and
// the CPU reference: bf16 tokens laid out like the cache, a cache by check_v4_cache, slots.
#pragma once

#include "common/fp8_v4_cache_tools.h"
#include "mlakit/status.h"
#include "mlakit/tensor.h"

namespace mlakit::detail {

// kQuantize: src bf16 [num_blocks, page_size, 1, 512] (or [num_blocks, page_size, 512]), dst a
// V4 cache of the same num_blocks and page_size. kDequantize: the reverse.
Status validate_v4_convert(const char* op, V4Convert direction, const TensorRef& src, const TensorRef& dst,
                           V4ConvertArgs* out);

// tokens [n, 512] bf16, slots [n] int32, cache a V4 cache (written in place).
Status validate_v4_append(const char* op, const TensorRef& tokens, const TensorRef& slots, const TensorRef& cache,
                          V4AppendArgs* out);

}  // namespace mlakit::detail
