// Kernel-side parameters of the GQA decode and its cache tools (include/mlakit/gqa_decode.h):
// plain data filled by the dispatch layer. Strides are in elements.
#pragma once

#include <cstdint>

#include "kernels/mla_params.h"

namespace mlakit::detail {

// The format of a GQA cache's values, fixed at compile time by the kernels' CacheT:
// q's dtype (bf16 / fp16), int8 or fp8 e4m3 (stored as uint8_t).
enum class GqaScaleKind : int {
  kNone = 0,      // values in q's dtype, no scale
  kPerToken = 1,  // scale[block][row][head]
  kPerTensor = 2  // scale[0]
};

// One of the two caches: [num_blocks, page_size, h_kv, d] values and their scales.
struct GqaCacheView {
  void* values;
  float* scale;  // null for kNone
  int64_t stride_block, stride_page, stride_h;
  int64_t scale_stride_block, scale_stride_page, scale_stride_h;  // kPerToken only
  GqaScaleKind scale_kind;

  MLAKIT_HD int64_t row(int64_t block, int64_t page_row, int hk) const {
    return block * stride_block + page_row * stride_page + hk * stride_h;
  }
  MLAKIT_HD int64_t scale_index(int64_t block, int64_t page_row, int hk) const {
    return block * scale_stride_block + page_row * scale_stride_page + hk * scale_stride_h;
  }
};

// The rotary embedding, resolved: style 0 none, 1 NeoX, 2 GPT-J (RopeStyle's values);
// log_theta = ln(theta), computed once on the host so that the CPU tools and the GPU use the
// same value (common/rotary.h).
struct GqaRope {
  int style;
  int rotary_dim;  // 0 without RoPE
  double log_theta;
};

// Where cache position pos of batch entry i lives: page block_table[i][pos / page_size], row
// pos % page_size. Positions at or past the table's capacity and block ids outside
// [0, num_blocks) are never dereferenced.
struct GqaPages {
  const int32_t* block_table;
  int64_t block_table_stride_b;
  int page_size;
  int max_blocks_per_seq;
  int64_t num_blocks;
  FastDivisor page_divisor;  // page_size
};

// This step's new rows, appended at positions [L - s_q, L) of entry i (L = cache_seqlens[i]).
struct GqaAppend {
  const void* k_new;  // [b, s_q, h_kv, d] q's dtype; null: nothing to append
  const void* v_new;
  int64_t k_stride_b, k_stride_s, k_stride_h;
  int64_t v_stride_b, v_stride_s, v_stride_h;
};

struct GqaDecodeParams {
  static constexpr bool kPlanned = true;
  AttentionCore core;  // d_qk = d; lengths: the scheduled keys per entry (window-capped)
  GqaCacheView k_cache, v_cache;
  GqaPages pages;
  GqaAppend append;
  GqaRope rope;
  const int32_t* cache_seqlens;  // [b] the true lengths L
  const float* alibi_slopes;     // [h_q] or null
  const uint8_t* finished;       // [b] or null
  int d;
  int window;       // 0: none
  float softcap;    // 0: none
  float scale;      // softmax scale (natural units)
  SplitSchedule schedule;
};

}  // namespace mlakit::detail
