// Launchers of the GQA cache tools' kernels (gqa_cache_tools.cu; any sm80+ GPU): one warp per
// (block, page row, kv head) cache row, rows walked grid-stride. Instantiated for Elem
// __nv_bfloat16 | __half and CacheT int8_t | __nv_fp8_e4m3 (and CacheT = Elem for the append).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/gqa/gqa_params.h"

namespace mlakit::detail {

// quantize / dequantize: a dense [num_blocks, page_size, h_kv, d] tensor (bf16 | fp16) and a
// quantized cache of the same shape.
struct GqaCacheConvertParams {
  void* dense;  // [num_blocks, page_size, h_kv, d] Elem: read by quantize, written by dequantize
  int64_t dense_stride_block, dense_stride_page, dense_stride_h;
  GqaCacheView cache;  // written by quantize (values, per-token scales), read by dequantize
  int64_t num_blocks;
  int64_t page_size;
  int h_kv;
  int d;  // 64, 128 or 256
};

// gqa_cache_append: row (i, t, hk) of k_new / v_new goes to position L - s_q + t of entry i.
struct GqaCacheAppendParams {
  GqaAppend rows;  // k_new / v_new [b, s_q, h_kv, d] Elem
  GqaCacheView k_cache, v_cache;
  GqaPages pages;
  GqaRope rope;                  // applied to k only
  const int32_t* cache_seqlens;  // [b]
  const uint8_t* finished;       // [b] or null
  int64_t b;
  int s_q;
  int h_kv;
  int d;  // 64, 128 or 256
};

template <typename Elem, typename CacheT>
cudaError_t launch_quantize_gqa_cache(const GqaCacheConvertParams& params, cudaStream_t stream);
template <typename Elem, typename CacheT>
cudaError_t launch_dequantize_gqa_cache(const GqaCacheConvertParams& params, cudaStream_t stream);
template <typename Elem, typename CacheT>
cudaError_t launch_gqa_cache_append(const GqaCacheAppendParams& params, cudaStream_t stream);

}  // namespace mlakit::detail
