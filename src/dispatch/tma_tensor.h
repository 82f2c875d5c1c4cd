// The public TensorRef as the kernel layer's TmaTensor (kernels/sm90/launch.h): the one place
// that translates, so the kernels see plain pointers, sizes and strides only.
#pragma once

#include "kernels/sm90/launch.h"
#include "mlakit/tensor.h"

namespace mlakit::detail {

// t: a validated bf16 or fp16 tensor of rank <= 4 (q, kv_cache).
inline TmaTensor tma_tensor(const TensorRef& t) {
  TmaTensor v;
  v.data = t.data;
  v.bf16 = t.dtype == DType::kBF16;
  for (int i = 0; i < t.rank && i < 4; ++i) {
    v.shape[i] = t.shape[i];
    v.stride[i] = t.stride[i];
  }
  return v;
}

}  // namespace mlakit::detail
