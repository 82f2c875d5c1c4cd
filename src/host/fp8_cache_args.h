// Validation of the FP8 MLA cache tools' arguments, shared by the GPU entry points and the
// CPU reference: tensors as rows of one stride (common/fp8_cache_rows.h).
#pragma once

#include <cstdint>

#include "common/fp8_cache_rows.h"
#include "mlakit/status.h"
#include "mlakit/tensor.h"

namespace mlakit::detail {

Status tensor_rows(const char* op, const char* name, const TensorRef& t, DType dtype, int64_t row_len,
                   TensorRows* out);

// quantize / dequantize: the same leading rows on both sides.
Status validate_fp8_convert(const char* op, const TensorRef& src, DType src_dtype, int64_t src_len,
                            const TensorRef& dst, DType dst_dtype, int64_t dst_len, TensorRows* src_rows,
                            TensorRows* dst_rows);

// The tokens [n, row_len] bf16 (rows 16-byte aligned) and slots [n] int32 of a paged append
// (the V3.2 and V4 caches' appends).
Status validate_append_tokens(const char* op, const TensorRef& tokens, const TensorRef& slots, int64_t row_len,
                              TensorRows* rows);

Status validate_fp8_append(const char* op, const TensorRef& tokens, const TensorRef& slots, const TensorRef& cache,
                           Fp8AppendArgs* out);

}  // namespace mlakit::detail
