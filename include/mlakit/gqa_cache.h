// Tools for the GQA decode's paged caches (include/mlakit/gqa_decode.h, GqaPagedCache):
// quantize a cache held in bf16 / fp16 to int8 or fp8 with scales, dequantize it back, and
// append a step's new rows (rotated, quantized) outside the decode. The GPU and CPU
// versions store identical bytes and scales, and gqa_cache_append stores exactly what
// gqa_decode's fused append stores (one per-row routine and one rotary-angle definition,
// src/common/rotary.h and src/common/gqa_cache_quant.h).
#pragma once

#include "mlakit/gqa_decode.h"
#include "mlakit/status.h"
#include "mlakit/stream.h"
#include "mlakit/tensor.h"

namespace mlakit {

// src [num_blocks, page_size, h_kv, d] bf16 | fp16 -> dst (same shape): int8 or fp8 values
// with per-(token, head) scales computed per row, or fp8 with the given per-tensor scale
// (dst.scale [1], read). d 64, 128 or 256; any leading strides (last dimension contiguous).
// Each row is stored as gqa_cache_append stores an unrotated row.
Status quantize_gqa_cache(const TensorRef& src, const GqaPagedCache& dst, cudaStream_t stream);

// src (int8 / fp8 with scales) -> dst [num_blocks, page_size, h_kv, d] bf16 | fp16:
// float(stored) * scale as one float32 product, then rounded to nearest even to dst's dtype.
Status dequantize_gqa_cache(const GqaPagedCache& src, const TensorRef& dst, cudaStream_t stream);

// The append half of gqa_decode alone: k_new / v_new [b, s_q, h_kv, d] (bf16 | fp16) written
// at positions [L - s_q, L) of each entry (L = cache_seqlens[i]), k rotated by `rope` at its
// position, both stored in the caches' format (q's dtype, int8 or fp8 as in GqaPagedCache).
// finished[i] nonzero (optional [b] uint8) skips entry i. Block ids outside [0, num_blocks)
// and positions outside [0, table width * page_size) are skipped (never dereferenced). Two
// appended rows on one cache slot race on the GPU (the CPU version writes them in (entry,
// token) order). The rotation is computed in float from the shared float64 angle
// (src/common/rotary.h); bytes are identical for finite inputs (a NaN input stores a NaN whose
// payload may differ).
struct GqaCacheAppendArgs {
  TensorRef k_new;
  TensorRef v_new;
  GqaPagedCache k_cache;
  GqaPagedCache v_cache;
  TensorRef block_table;    // [b, max_blocks_per_seq] int32
  TensorRef cache_seqlens;  // [b] int32, lengths after the append
  RotaryEmbedding rope;
  TensorRef finished;       // optional [b] uint8
};
Status gqa_cache_append(const GqaCacheAppendArgs& args, cudaStream_t stream);

namespace reference {
// The same three operations on host memory (bit-identical to the GPU's).
Status quantize_gqa_cache(const TensorRef& src, const GqaPagedCache& dst);
Status dequantize_gqa_cache(const GqaPagedCache& src, const TensorRef& dst);
Status gqa_cache_append(const GqaCacheAppendArgs& args);
}  // namespace reference

}  // namespace mlakit
