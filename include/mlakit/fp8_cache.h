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

// ---------------------------------------------------------------------------------------------
// DeepSeek V4's FP8 MLA cache (docs/contract.md, "DeepSeek V4 FP8 cache"): 584 bytes per token,
// kept per page block. A block of page_size tokens holds page_size records of 576 bytes (448
// float8 e4m3 NoPE values in 7 tiles of 64, then 64 bf16 RoPE values), then page_size scale
// records of 8 bytes (7 UE8M0 tile scales, 2^(byte - 127), and one unused byte written 0).
// Blocks lie stride[0] bytes apart (FlashMLA pads a block to a multiple of 576 bytes); the
// tools never write the padding.
//
// A tile's scale is 2^ceil(log2(max(max|x| / 448, 1e-4))) (NaN values ignored; an infinite
// value gives 2^127); stored = e4m3(x / scale); dequantized = float(stored) * scale.
// GPU and CPU versions are bit-identical.
//
// A cache tensor is [num_blocks, page_size, 1, 584] of uint8 (or float8_e4m3 / int8) with
// stride[1] == 584 (a view, not an address step: records and scale records are separate
// arrays of the block), stride[0] >= page_size * 584 and a multiple of 16, 16-byte aligned.

inline constexpr int kMlaFp8V4TokenBytes = 584;
inline constexpr int kMlaFp8V4Dqk = 512;  // 448 NoPE + 64 RoPE values of a token

// src: bf16 [num_blocks, page_size, 1, 512] or [num_blocks, page_size, 512] (device; any block
// and token strides, last dimension contiguous, rows 16-byte aligned); dst: a V4 cache of the
// same num_blocks and page_size (device).
Status quantize_mla_cache_fp8_v4(const TensorRef& src, const TensorRef& dst, cudaStream_t stream);

// src: a V4 cache; dst: bf16 [num_blocks, page_size, 1, 512] or [num_blocks, page_size, 512].
Status dequantize_mla_cache_fp8_v4(const TensorRef& src, const TensorRef& dst, cudaStream_t stream);

// Writes n new tokens into a V4 cache: tokens [n, 512] bf16, slots [n] int32 (slot = block *
// page_size + offset; -1 and out-of-range slots are skipped). Only the tokens' records and
// scale records are written.
Status append_mla_cache_fp8_v4(const TensorRef& tokens, const TensorRef& slots, const TensorRef& cache,
                               cudaStream_t stream);

namespace reference {
// The same three operations on host memory.
Status quantize_mla_cache_fp8_v4(const TensorRef& src, const TensorRef& dst);
Status dequantize_mla_cache_fp8_v4(const TensorRef& src, const TensorRef& dst);
Status append_mla_cache_fp8_v4(const TensorRef& tokens, const TensorRef& slots, const TensorRef& cache);
}  // namespace reference

}  // namespace mlakit
