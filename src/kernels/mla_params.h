// Kernel-side parameters of the MLA operations: plain data filled by the dispatch layer with
// designated initializers, one struct per operation, each made of the parts its kernels read:
//   AttentionCore  q / out / lse and the rows' shape, scale and statistics (every kernel);
//   a key source   PagedCache (dense decode) or ListedKeys (sparse decode and prefill), read by
//                  the producers (and the portable kernel's key loads) only;
//   SplitSchedule  the plan's schedule and partial results (the planned decodes only).
// What an operation is follows from its type, never from null pointers or flags. Strides are in
// elements.
#pragma once

#include <cstdint>

#include "common/decode_schedule.h"
#include "common/fast_divisor.h"
#include "common/fp8_token_layout.h"

namespace mlakit::detail {

struct AttentionCore {
  const void* q;       // [b, s_q, h_q, d_qk]
  void* out;           // [b, s_q, h_q, d_v]
  float* lse;          // [b, h_q, s_q]
  SeqLengths lengths;  // keys of scheduled sequence i
  int64_t q_stride_b, q_stride_s, q_stride_h;
  int64_t out_stride_b, out_stride_s, out_stride_h;
  int64_t lse_stride_b, lse_stride_h, lse_stride_s;
  int64_t b;
  int s_q;
  int h_q;
  int h_kv;
  int heads_per_kv;  // h_q / h_kv
  int rows;          // s_q * heads_per_kv: query rows per kv head
  float scale_log2;  // softmax_scale * log2(e)
  bool causal;       // already false when s_q == 1
  // Scheduled sequence i addresses q / out / lse at batch i / seq_divisor, token
  // i % seq_divisor (dense: 1; sparse decode: one sequence per (batch entry, query token)).
  int seq_divisor = 1;
  // Columns stored per q and kv row: 576, or 512 (the prefill's d_qk = 512); the kernels'
  // 576-wide tiles are zero-filled past it, which leaves q.k unchanged.
  int d_qk = 576;
  // Statistics in log2 units (the prefill's base-2 convention) instead of natural log.
  bool lse_base2 = false;
  const float* attn_sink = nullptr;  // [h_q], optional: out *= 1 / (1 + exp(sink - lse))
  // [b, h_q, s_q] addressed like lse, optional: the row's largest scaled logit in lse's base
  // (-inf for a row with no key). Written where final rows are written directly.
  float* max_logits = nullptr;
  int64_t max_logits_stride_b = 0, max_logits_stride_h = 0, max_logits_stride_s = 0;
  // [b], optional: batch entries whose byte is nonzero are skipped, their rows left as they
  // are (the GQA decode's `finished`); lse may be null (the GQA decode's optional lse).
  const uint8_t* skip = nullptr;
};

// The dense decode's keys: a paged cache through a block table.
struct PagedCache {
  const void* kv;               // [num_blocks, page_size, h_kv, d_qk]
  const int32_t* block_table;   // [b, max_blocks_per_seq]
  int64_t kv_stride_block, kv_stride_page, kv_stride_h;
  int64_t block_table_stride_b;
  int page_size;
  int64_t num_blocks;
  int max_blocks_per_seq;
};

// The sparse operations' keys: key j of scheduled sequence i is cache slot indices[..][j]
// (listed_slot), in page page_divisor.quotient(slot). The sparse decode's pages hold FP8
// tokens of either layout (kernels/fp8_tokens.cuh; V4: kv_stride_page is the 576-byte record
// stride); the prefill's kv is rows in q's dtype, pages of one row (slot = row).
struct ListedKeys {
  const void* kv;
  int64_t kv_stride_block, kv_stride_page;
  const int32_t* indices;  // [b, s_q, topk]
  int64_t indices_stride_b, indices_stride_s;
  // Slot s is valid iff unsigned(s) < slot_limit (sparse_slot_limit: one compare that rejects
  // negatives too).
  uint32_t slot_limit;
  FastDivisor page_divisor;
};

// A plan's schedule: each CTA's part of the (sequence, key block) walk, and where split
// sequences leave their partial results for the combine.
struct SplitSchedule {
  const PartRange* part_ranges;   // [num_parts]
  const int32_t* split_prefix;    // [b + 1]
  const int32_t* partial_prefix;  // [b + 1]
  float* partial_out;             // [partial_slots, h_kv, rows, d_v]
  float* partial_lse;             // [partial_slots, h_kv, rows], log2 domain, -inf = empty
  int block_n;                    // scheduling block, in keys
  int num_parts;
  // Every sequence has exactly one split: the attention kernel writes all final rows itself
  // and the combine has nothing to merge or fill (it launches nothing).
  bool no_splits;
};

struct DenseDecodeParams {
  static constexpr bool kPlanned = true;
  AttentionCore core;
  PagedCache cache;
  SplitSchedule schedule;
};

struct SparseDecodeParams {
  static constexpr bool kPlanned = true;
  AttentionCore core;
  ListedKeys keys;        // the first cache's FP8 tokens: key positions [0, lengths.first(seq))
  // The second cache (extra_keys.kv null: none), same layout: key positions
  // [lengths.first(seq), lengths(seq)) are its indices 0, 1, ...
  ListedKeys extra_keys;
  Fp8TokenLayout layout;  // V4: keys' kv_stride_page is the record stride (576)
  SplitSchedule schedule;
};

struct SparsePrefillParams {
  static constexpr bool kPlanned = false;  // every CTA runs whole sequences, writes final rows
  AttentionCore core;
  ListedKeys keys;  // rows in q's dtype, pages of one row
};

// What the combine of a planned decode reads.
struct CombineParams {
  AttentionCore core;
  SplitSchedule schedule;
};

// The sparse modes' slot_limit: min(num_blocks * page_size, 2^31), so that every int32 slot in
// [0, num_blocks * page_size) passes and nothing else does.
inline uint32_t sparse_slot_limit(int64_t num_blocks, int page_size) {
  const int64_t slots = num_blocks * page_size, int32_slots = int64_t{1} << 31;
  return static_cast<uint32_t>(slots < int32_slots ? slots : int32_slots);
}

}  // namespace mlakit::detail
