// Validation of the GQA cache tools' arguments (include/mlakit/gqa_cache.h), shared by the
// GPU entry points (src/host/gqa_cache.cpp) and the CPU tools (reference/gqa_cache_ref.cpp),
// so both accept and reject the same inputs with the same messages. Only what the host can
// see is checked (dtypes, ranks, shapes, strides, options, memory overlap); lengths and block
// ids live in device memory and are the kernels' business (skipped where out of range).
#pragma once

#include <cstdint>

#include "host/gqa_decode_validate.h"
#include "mlakit/gqa_cache.h"

namespace mlakit::detail {

// A paged cache [num_blocks, page_size, h_kv, d] as the tools see it.
struct GqaCacheShape {
  int64_t num_blocks = 0;
  int64_t page_size = 0;
  int h_kv = 0;
  int d = 0;
  DType dense_dtype = DType::kBF16;  // the bf16 / fp16 side (src of quantize, dst of dequantize)
  DType cache_dtype = DType::kInt8;  // the quantized side: int8 or fp8
  GqaScaleLayout scale_layout = GqaScaleLayout::kPerToken;
};

// quantize_gqa_cache: src [num_blocks, page_size, h_kv, d] bf16 | fp16, d 64 | 128 | 256, any
// leading strides, last dimension contiguous; dst.values the same shape in int8 or fp8;
// dst.scale float32 [num_blocks, page_size, h_kv] (written) or, fp8 only, [1] (read); dst's
// written elements disjoint from each other and from what is read.
Status validate_quantize_gqa_cache(const char* op, const TensorRef& src, const GqaPagedCache& dst,
                                   GqaCacheShape* shape);

// dequantize_gqa_cache: the same tensors the other way round (src read, dst written).
Status validate_dequantize_gqa_cache(const char* op, const GqaPagedCache& src, const TensorRef& dst,
                                     GqaCacheShape* shape);

// gqa_cache_append's arguments, resolved.
struct GqaAppendShape {
  int64_t b = 0;
  int s_q = 0;
  int h_kv = 0;
  int d = 0;
  int64_t num_blocks = 0;
  int64_t page_size = 0;
  int max_blocks_per_seq = 0;
  DType new_dtype = DType::kBF16;    // k_new / v_new: bf16 | fp16
  DType cache_dtype = DType::kBF16;  // new_dtype, int8 or fp8
  GqaScaleLayout scale_layout = GqaScaleLayout::kNone;
  int rotary_dim = 0;  // resolved: 0 without RoPE, else rope.rotary_dim or d
};

// gqa_cache_append: k_new, v_new [b, s_q, h_kv, d] bf16 | fp16 (d 64 | 128 | 256); both
// caches [num_blocks, page_size, h_kv, d] in k_new's dtype, int8 or fp8 with the scale
// layouts of GqaPagedCache (alike for k and v); block_table [b, width] int32; cache_seqlens
// [b] int32; finished optional [b] uint8; rope as the decode's (style, theta > 0, rotary_dim
// 0 or even <= d). The caches and per-token scales are written: disjoint from every input.
Status validate_gqa_cache_append(const char* op, const GqaCacheAppendArgs& args, GqaAppendShape* shape);

}  // namespace mlakit::detail
