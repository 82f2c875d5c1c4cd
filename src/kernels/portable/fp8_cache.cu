// FP8 MLA cache kernels. A warp owns one 656-byte token: lane l quantizes 16 values of tile
// l / 8 (eight lanes per 128-value tile reduce its max with shuffles), lanes 0-7 move the
// 128-byte RoPE part. The arithmetic is common/fp8_cache_row.h, shared with the CPU.
#include <cmath>

#include "common/fp8_cache_row.h"
#include "kernels/portable/fp8_cache_launch.h"

namespace mlakit::detail {
namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kValuesPerLane = kFp8NopeDim / 32;  // 16

__device__ void quantize_row(const uint16_t* src, uint8_t* dst, int lane) {
  const int tile = lane / 8;
  const int first = tile * kFp8Tile + (lane % 8) * kValuesPerLane;
  alignas(16) uint16_t v[kValuesPerLane];
  *reinterpret_cast<uint4*>(&v[0]) = *reinterpret_cast<const uint4*>(src + first);
  *reinterpret_cast<uint4*>(&v[8]) = *reinterpret_cast<const uint4*>(src + first + 8);
  float amax = 0.f;
#pragma unroll
  for (int i = 0; i < kValuesPerLane; ++i) amax = fmaxf(amax, fabsf(bf16_bits_to_float(v[i])));
#pragma unroll
  for (int x = 1; x < 8; x *= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, x));
  const float scale = fp8_tile_scale(amax);
  alignas(16) uint8_t q[kValuesPerLane];
#pragma unroll
  for (int i = 0; i < kValuesPerLane; ++i) q[i] = fp8_quantize(bf16_bits_to_float(v[i]), scale);
  *reinterpret_cast<uint4*>(dst + first) = *reinterpret_cast<const uint4*>(q);
  if (lane % 8 == 0) *reinterpret_cast<float*>(dst + kFp8ScaleOffset + 4 * tile) = scale;
  if (lane < 8) {
    *reinterpret_cast<uint4*>(dst + kFp8RopeOffset + 16 * lane) =
        *reinterpret_cast<const uint4*>(src + kFp8NopeDim + 8 * lane);
  }
}

__global__ void quantize_kernel(const uint16_t* src, int64_t src_stride, uint8_t* dst, int64_t dst_stride,
                                int64_t rows) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (row < rows) quantize_row(src + row * src_stride, dst + row * dst_stride, threadIdx.x % 32);
}

__global__ void dequantize_kernel(const uint8_t* src, int64_t src_stride, uint16_t* dst, int64_t dst_stride,
                                  int64_t rows) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (row >= rows) return;
  const int lane = threadIdx.x % 32;
  const uint8_t* s = src + row * src_stride;
  uint16_t* d = dst + row * dst_stride;
  const int tile = lane / 8;
  const int first = tile * kFp8Tile + (lane % 8) * kValuesPerLane;
  const float scale = *reinterpret_cast<const float*>(s + kFp8ScaleOffset + 4 * tile);
  alignas(16) uint8_t q[kValuesPerLane];
  *reinterpret_cast<uint4*>(q) = *reinterpret_cast<const uint4*>(s + first);
  alignas(16) uint16_t v[kValuesPerLane];
#pragma unroll
  for (int i = 0; i < kValuesPerLane; ++i) v[i] = fp8_dequantize(q[i], scale);
  *reinterpret_cast<uint4*>(d + first) = *reinterpret_cast<const uint4*>(&v[0]);
  *reinterpret_cast<uint4*>(d + first + 8) = *reinterpret_cast<const uint4*>(&v[8]);
  if (lane < 8) {
    *reinterpret_cast<uint4*>(d + kFp8NopeDim + 8 * lane) =
        *reinterpret_cast<const uint4*>(s + kFp8RopeOffset + 16 * lane);
  }
}

__global__ void append_kernel(const uint16_t* tokens, int64_t token_stride, const int32_t* slots, int64_t n,
                              uint8_t* cache, int64_t block_stride, int64_t page_stride, int64_t page_size,
                              int64_t num_blocks) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (i >= n) return;
  const int64_t slot = slots[i];
  if (slot < 0 || slot >= num_blocks * page_size) return;  // -1 and invalid slots: skipped
  quantize_row(tokens + i * token_stride, cache + (slot / page_size) * block_stride + (slot % page_size) * page_stride,
               threadIdx.x % 32);
}

unsigned blocks_for(int64_t rows) { return static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock); }

}  // namespace

cudaError_t launch_quantize_mla_fp8(const uint16_t* src, int64_t src_stride, uint8_t* dst, int64_t dst_stride,
                                    int64_t rows, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  quantize_kernel<<<blocks_for(rows), kWarpsPerBlock * 32, 0, stream>>>(src, src_stride, dst, dst_stride, rows);
  return cudaGetLastError();
}

cudaError_t launch_dequantize_mla_fp8(const uint8_t* src, int64_t src_stride, uint16_t* dst, int64_t dst_stride,
                                      int64_t rows, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  dequantize_kernel<<<blocks_for(rows), kWarpsPerBlock * 32, 0, stream>>>(src, src_stride, dst, dst_stride, rows);
  return cudaGetLastError();
}

cudaError_t launch_append_mla_fp8(const uint16_t* tokens, int64_t token_stride, const int32_t* slots, int64_t n,
                                  uint8_t* cache, int64_t block_stride, int64_t page_stride, int64_t page_size,
                                  int64_t num_blocks, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  append_kernel<<<blocks_for(n), kWarpsPerBlock * 32, 0, stream>>>(tokens, token_stride, slots, n, cache,
                                                                     block_stride, page_stride, page_size, num_blocks);
  return cudaGetLastError();
}

}  // namespace mlakit::detail
