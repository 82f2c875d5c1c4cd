// Launchers of the FP8 MLA cache kernels (any CUDA GPU): one warp per token row.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace mlakit::detail {

// rows of 576 bf16 (stride src_stride elements) -> rows of 656 bytes (stride dst_stride).
cudaError_t launch_quantize_mla_fp8(const uint16_t* src, int64_t src_stride, uint8_t* dst, int64_t dst_stride,
                                    int64_t rows, cudaStream_t stream);
cudaError_t launch_dequantize_mla_fp8(const uint8_t* src, int64_t src_stride, uint16_t* dst, int64_t dst_stride,
                                      int64_t rows, cudaStream_t stream);
// Token i goes to cache row (slot / page_size, slot % page_size); slots outside
// [0, num_blocks * page_size) are skipped.
cudaError_t launch_append_mla_fp8(const uint16_t* tokens, int64_t token_stride, const int32_t* slots, int64_t n,
                                  uint8_t* cache, int64_t block_stride, int64_t page_stride, int64_t page_size,
                                  int64_t num_blocks, cudaStream_t stream);

}  // namespace mlakit::detail
