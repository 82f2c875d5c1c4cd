// Kernel-side parameters of the dense MLA decode: plain data filled by the dispatch layer
// with designated initializers. Strides are in elements.
#pragma once

#include <cstdint>

#include "common/decode_schedule.h"
#include "common/fast_divisor.h"

namespace mlakit::detail {

// How the sparse mode's listed keys are stored (read only when `indices` is set).
enum class SparseKeyFormat : int32_t {
  kFp8WithScale = 0,  // sparse decode: 656-byte FP8 tokens (docs/contract.md), dequantized into the K tile
  kElemRows = 1,      // sparse prefill: rows in q's dtype, copied as they are
};

struct MlaDecodeParams {
  const void* q;                 // [b, s_q, h_q, d_qk]
  const void* kv;                // [num_blocks, page_size, h_kv, d_qk]
  const int32_t* block_table;    // [b, max_blocks_per_seq]
  SeqLengths lengths;            // length of sequence i (dense: cache_seqlens[i])
  void* out;                     // [b, s_q, h_q, d_v]
  float* lse;                    // [b, h_q, s_q], natural log

  const PartRange* part_ranges;  // [num_parts]
  const int32_t* split_prefix;   // [b + 1]
  const int32_t* partial_prefix; // [b + 1]
  float* partial_out;            // [partial_slots, h_kv, rows, d_v]
  float* partial_lse;            // [partial_slots, h_kv, rows], log2 domain, -inf = empty

  int64_t q_stride_b, q_stride_s, q_stride_h;
  int64_t kv_stride_block, kv_stride_page, kv_stride_h;
  int64_t block_table_stride_b;
  int64_t out_stride_b, out_stride_s, out_stride_h;
  int64_t lse_stride_b, lse_stride_h, lse_stride_s;

  int64_t b;
  int s_q;
  int h_q;
  int h_kv;
  int heads_per_kv;   // h_q / h_kv
  int rows;           // s_q * heads_per_kv: query rows per kv head
  int page_size;
  int64_t num_blocks;
  int max_blocks_per_seq;
  int block_n;        // scheduling block, in keys
  int num_parts;
  float scale_log2;   // softmax_scale * log2(e)
  bool causal;        // already false when s_q == 1

  // Scheduled sequence i addresses q / out / lse at batch i / seq_divisor, token
  // i % seq_divisor (dense: 1; sparse: one sequence per (batch entry, query token)).
  int seq_divisor;
  // Sparse FP8 decode only (null for the dense decode): the cache holds 656-byte FP8 tokens,
  // key j of sequence i is cache slot indices[batch][token][j].
  const int32_t* indices;        // [b, s_q, topk]
  int64_t indices_stride_b, indices_stride_s;
  const float* attn_sink;        // [h_q] or null: out *= 1 / (1 + exp(sink - lse))

  // Sparse prefill additions; their defaults keep the decode's behaviour, so code that fills
  // only the fields above is unaffected. The portable kernel alone reads them.
  SparseKeyFormat sparse_key_format = SparseKeyFormat::kFp8WithScale;
  // Columns stored per q and kv row: 576, or 512 (the prefill's d_qk = 512); the kernels'
  // 576-wide tiles are zero-filled past it, which leaves q.k unchanged.
  int d_qk = 576;
  // Statistics in log2 units (the prefill's base-2 convention) instead of natural log.
  bool lse_base2 = false;
  // [b, h_q, s_q] addressed like lse, or null: the row's largest scaled logit in lse's base
  // (-inf for a row with no key). Written where final rows are written directly (unsplit
  // sequences): the combine has no max to merge, so callers that need it must not split.
  float* max_logits = nullptr;
  int64_t max_logits_stride_b = 0, max_logits_stride_h = 0, max_logits_stride_s = 0;

  // The plan's no_splits: every sequence has exactly one split, so the kernel writes all final
  // rows itself and launch_mla_decode_combine has nothing to merge or fill (it launches nothing).
  bool no_splits = false;
  // Sparse modes: slot s is valid iff unsigned(s) < slot_limit (sparse_slot_limit: one
  // compare that rejects negatives too), in page page_divisor.quotient(s).
  uint32_t slot_limit = 0;
  FastDivisor page_divisor;
};

// The sparse modes' slot_limit: min(num_blocks * page_size, 2^31), so that every int32 slot in
// [0, num_blocks * page_size) passes and nothing else does.
inline uint32_t sparse_slot_limit(int64_t num_blocks, int page_size) {
  const int64_t slots = num_blocks * page_size, int32_slots = int64_t{1} << 31;
  return static_cast<uint32_t>(slots < int32_slots ? slots : int32_slots);
}

}  // namespace mlakit::detail
