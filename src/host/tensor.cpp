#include "mlakit/tensor.h"

#include <algorithm>
#include <limits>

namespace mlakit {

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kBF16: return "bf16";
    case DType::kFP16: return "fp16";
    case DType::kFP32: return "float32";
    case DType::kInt32: return "int32";
    case DType::kFP8E4M3: return "fp8_e4m3";
    case DType::kInt8: return "int8";
    case DType::kUInt8: return "uint8";
  }
  return "unknown";
}

std::size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kBF16:
    case DType::kFP16: return 2;
    case DType::kFP32:
    case DType::kInt32: return 4;
    case DType::kFP8E4M3:
    case DType::kInt8:
    case DType::kUInt8: return 1;
  }
  return 0;
}

int64_t TensorRef::numel() const {
  int64_t n = 1;
  for (int i = 0; i < rank; ++i) {
    if (__builtin_mul_overflow(n, shape[i], &n)) return std::numeric_limits<int64_t>::max();  // not a real tensor
  }
  return n;
}

namespace {

// Pointer, dtype, rank and sizes; no strides. A rank above kMaxRank keeps no sizes: validation
// reports the rank.
TensorRef shaped_tensor(void* data, DType dtype, std::initializer_list<int64_t> shape) {
  TensorRef t;
  t.data = data;
  t.dtype = dtype;
  t.rank = static_cast<int>(shape.size());
  if (t.rank > kMaxRank) return t;
  int i = 0;
  for (int64_t s : shape) t.shape[i++] = s;
  return t;
}

// Row-major strides. A stride whose product overflows saturates at INT64_MAX: it can only
// matter for a dimension of size > 1, and then the tensor's extent does not fit in 64 bits,
// which validation (check_extent_fits) reports. Negative sizes, also reported by validation,
// count as 0 here.
void set_row_major_strides(TensorRef* t) {
  int64_t step = 1;
  for (int d = t->rank - 1; d >= 0; --d) {
    t->stride[d] = step;
    if (__builtin_mul_overflow(step, std::max<int64_t>(t->shape[d], 0), &step)) {
      step = std::numeric_limits<int64_t>::max();
    }
  }
}

}  // namespace

TensorRef make_tensor(void* data, DType dtype, std::initializer_list<int64_t> shape) {
  TensorRef t = shaped_tensor(data, dtype, shape);
  if (t.rank <= kMaxRank) set_row_major_strides(&t);
  return t;
}

TensorRef make_tensor(void* data, DType dtype, std::initializer_list<int64_t> shape,
                      std::initializer_list<int64_t> stride) {
  TensorRef t = shaped_tensor(data, dtype, shape);
  if (t.rank > kMaxRank) return t;
  if (stride.size() != shape.size()) {
    t.rank = -1;  // reported by validation as a malformed tensor
    return t;
  }
  int i = 0;
  for (int64_t s : stride) t.stride[i++] = s;
  return t;
}

}  // namespace mlakit
