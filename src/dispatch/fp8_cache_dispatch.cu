#include "dispatch/fp8_cache_dispatch.h"

#include "dispatch/cuda_status.h"
#include "kernels/portable/fp8_cache_launch.h"

namespace mlakit::detail {

Status dispatch_quantize_mla_fp8(const char* op, const TensorRows& src, const TensorRows& dst, cudaStream_t stream) {
  return cuda_status(op, launch_quantize_mla_fp8(static_cast<const uint16_t*>(src.data), src.stride,
                                                 static_cast<uint8_t*>(dst.data), dst.stride, src.rows, stream));
}

Status dispatch_dequantize_mla_fp8(const char* op, const TensorRows& src, const TensorRows& dst, cudaStream_t stream) {
  return cuda_status(op, launch_dequantize_mla_fp8(static_cast<const uint8_t*>(src.data), src.stride,
                                                   static_cast<uint16_t*>(dst.data), dst.stride, src.rows, stream));
}

Status dispatch_append_mla_fp8(const char* op, const Fp8AppendArgs& a, cudaStream_t stream) {
  return cuda_status(op, launch_append_mla_fp8(static_cast<const uint16_t*>(a.tokens.data), a.tokens.stride, a.slots,
                                               a.tokens.rows, a.cache, a.block_stride, a.page_stride, a.page_size,
                                               a.num_blocks, stream));
}

}  // namespace mlakit::detail
