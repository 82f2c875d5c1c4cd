// TensorRef: a non-owning view of a strided tensor (pointer, dtype, shape, strides).
//
// Strides and sizes are 64-bit and counted in elements (docs/contract.md); the last dimension
// must be contiguous for every operation, other strides are free so that views of larger
// tensors work. The library never owns or frees the memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>

namespace mlakit {

enum class DType {
  kBF16,
  kFP16,
  kFP32,
  kInt32,
  kFP8E4M3,
  kInt8,
  kUInt8,
};

const char* dtype_name(DType dtype);
std::size_t dtype_size(DType dtype);

inline constexpr int kMaxRank = 6;

struct TensorRef {
  void* data = nullptr;
  DType dtype = DType::kBF16;
  int rank = 0;
  int64_t shape[kMaxRank] = {};
  int64_t stride[kMaxRank] = {};  // in elements

  int64_t numel() const;  // product of the sizes (callers validate the extent first)
  bool empty() const { return data == nullptr && rank == 0; }
};

// A tensor with row-major (contiguous) strides.
TensorRef make_tensor(void* data, DType dtype, std::initializer_list<int64_t> shape);
// A tensor with explicit strides (in elements), e.g. a view of a larger buffer.
TensorRef make_tensor(void* data, DType dtype, std::initializer_list<int64_t> shape,
                      std::initializer_list<int64_t> stride);

}  // namespace mlakit
