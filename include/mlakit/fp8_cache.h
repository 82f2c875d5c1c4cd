// Tools for the FP8-with-scale MLA KV cache (docs/contract.md): 656 bytes per token.
//
//   bytes   0..511  512 float8 e4m3: the NoPE part, quantized in 4 tiles of 128 values
//   bytes 512..527  4 float32 scales, tile j covers values 128j .. 128j+127
//   bytes 528..655  64 bf16: the RoPE part, not quantized
//
// Quantization of a tile x: scale = max|x| / 448, stored = e4m3(x / scale) (round to nearest
// even, saturating); dequantized = float(stored) * scale. An all-zero tile stores scale 0
// and dequantizes to zeros. GPU and CPU versions are bit-identical.
#pragma once

#include <cstdint>

#include "mlakit/status.h"
#include "mlakit/stream.h"
#include "mlakit/tensor.h"

namespace mlakit {

inline constexpr int kMlaFp8TokenBytes = 656;
inline constexpr int kMlaFp8NopeDim = 512;
inline constexpr int kMlaFp8RopeDim = 64;
inline constexpr int kMlaFp8TileSize = 128;

// src: [..., 576] bf16 (device); dst: [..., 656] uint8 with the same leading shape (device).
// Leading dimensions must be collapsible into rows of one stride; rows 16-byte aligned.
Status quantize_mla_cache_fp8(const TensorRef& src, const TensorRef& dst, cudaStream_t stream);

// src: [..., 656] uint8; dst: [..., 576] bf16 (device).
Status dequantize_mla_cache_fp8(const TensorRef& src, const TensorRef& dst, cudaStream_t stream);

// Writes n new tokens into a paged FP8 cache: tokens [n, 576] bf16, slots [n] int32 (slot =
// block * page_size + offset; -1 and out-of-range slots are skipped), cache
// [num_blocks, page_size, 1, 656] uint8 (1 <= page_size <= 2^30, num_blocks <= 2^31 - 1, the
// bounds of the sparse decode's cache).
Status append_mla_cache_fp8(const TensorRef& tokens, const TensorRef& slots, const TensorRef& cache,
                            cudaStream_t stream);

namespace reference {
// The same three operations on host memory.
Status quantize_mla_cache_fp8(const TensorRef& src, const TensorRef& dst);
Status dequantize_mla_cache_fp8(const TensorRef& src, const TensorRef& dst);
Status append_mla_cache_fp8(const TensorRef& tokens, const TensorRef& slots, const TensorRef& cache);
}  // namespace reference

}  // namespace mlakit
