#include "mlakit/tensor.h"

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
  for (int i = 0; i < rank; ++i) n *= shape[i];
  return n;
}

TensorRef make_tensor(void* data, DType dtype, std::initializer_list<int64_t> shape) {
  TensorRef t;
  t.data = data;
  t.dtype = dtype;
  if (shape.size() > static_cast<std::size_t>(kMaxRank)) {
    t.rank = static_cast<int>(shape.size());  // validation reports the rank; sizes not stored
    return t;
  }
  t.rank = static_cast<int>(shape.size());
  int i = 0;
  for (int64_t s : shape) t.shape[i++] = s;
  int64_t step = 1;
  for (int d = t.rank - 1; d >= 0; --d) {
    t.stride[d] = step;
    step *= t.shape[d];
  }
  return t;
}

TensorRef make_tensor(void* data, DType dtype, std::initializer_list<int64_t> shape,
                      std::initializer_list<int64_t> stride) {
  TensorRef t = make_tensor(data, dtype, shape);
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
