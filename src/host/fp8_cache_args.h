// Validation of the FP8 MLA cache tools' arguments, shared by the GPU entry points and the
// CPU reference: tensors as rows of one stride.
#pragma once

#include <cstdint>

#include "mlakit/status.h"
#include "mlakit/tensor.h"

namespace mlakit::detail {

// A tensor [..., row_len] whose leading dimensions collapse into `rows` rows `stride`
// elements apart.
struct TensorRows {
  void* data = nullptr;
  int64_t rows = 0;
  int64_t stride = 0;  // elements
};

Status tensor_rows(const char* op, const char* name, const TensorRef& t, DType dtype, int64_t row_len,
                   TensorRows* out);

// quantize / dequantize: the same leading rows on both sides.
Status validate_fp8_convert(const char* op, const TensorRef& src, DType src_dtype, int64_t src_len,
                            const TensorRef& dst, DType dst_dtype, int64_t dst_len, TensorRows* src_rows,
                            TensorRows* dst_rows);

struct Fp8AppendArgs {
  TensorRows tokens;
  const int32_t* slots = nullptr;
  uint8_t* cache = nullptr;
  int64_t block_stride = 0, page_stride = 0, page_size = 0, num_blocks = 0;
};
Status validate_fp8_append(const char* op, const TensorRef& tokens, const TensorRef& slots, const TensorRef& cache,
                           Fp8AppendArgs* out);

}  // namespace mlakit::detail
