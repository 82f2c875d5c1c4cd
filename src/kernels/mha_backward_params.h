// Parameters of the MHA prefill backward kernels (preprocess, main, postprocess), plain data
// filled by the dispatch from validated arguments (include/mlakit/mha_prefill.h) and the
// workspace layout (common/mha_backward_tiling.h). Strides are in elements; the last
// dimension of every [rows, heads, d] tensor is contiguous (validated).
#pragma once

#include <cstdint>

namespace mlakit::detail {

struct MhaBackwardParams {
  const void* dout = nullptr;             // [total_q, h_q, d_v]  Elem
  const void* q = nullptr;                // [total_q, h_q, d_qk] Elem
  const void* k = nullptr;                // [total_k, h_kv, d_qk] Elem
  const void* v = nullptr;                // [total_k, h_kv, d_v] Elem
  const void* out = nullptr;              // [total_q, h_q, d_v]  Elem
  const float* lse = nullptr;             // [h_q, total_q] natural log
  const int32_t* cu_seqlens_q = nullptr;  // [b + 1]
  const int32_t* cu_seqlens_k = nullptr;  // [b + 1]
  void* dq = nullptr;                     // [total_q, h_q, d_qk] Elem
  void* dk = nullptr;                     // [total_k, h_kv, d_qk] Elem
  void* dv = nullptr;                     // [total_k, h_kv, d_v] Elem
  // Workspace (contiguous): dq / softmax_scale in float32, D = rowsum(dout * out), and the
  // deterministic mode's counters (null otherwise).
  float* dq_accum = nullptr;   // [total_q, h_q, d_qk]
  float* row_dot = nullptr;    // [h_q, total_q]
  int32_t* counters = nullptr;  // [b, h_q, query_tiles]
  int64_t num_counters = 0;
  int64_t query_tiles = 0;  // per (sequence, query head): tiles of max_seqlen_q
  int64_t dout_stride_t = 0, dout_stride_h = 0;
  int64_t q_stride_t = 0, q_stride_h = 0;
  int64_t k_stride_t = 0, k_stride_h = 0;
  int64_t v_stride_t = 0, v_stride_h = 0;
  int64_t out_stride_t = 0, out_stride_h = 0;
  int64_t lse_stride_h = 0, lse_stride_t = 0;
  int64_t dq_stride_t = 0, dq_stride_h = 0;
  int64_t dk_stride_t = 0, dk_stride_h = 0;
  int64_t dv_stride_t = 0, dv_stride_h = 0;
  int64_t total_q = 0, total_k = 0;
  int b = 0;
  int h_q = 0, h_kv = 1;
  int heads_per_kv = 1;  // h_q / h_kv: query head h reads kv head h / heads_per_kv
  int d_qk = 0, d_v = 0;
  int max_seqlen_q = 0, max_seqlen_k = 0;
  bool causal = false;  // bottom-right aligned: query t sees keys j <= t + Lk - Lq
  bool deterministic = false;
  bool bulk_dq = false;  // sm90: dQ added by bulk reductions from shared memory (MhaBackwardConfig)
  float softmax_scale = 0.f;
  float scale_log2 = 0.f;  // softmax_scale * log2(e)
};

}  // namespace mlakit::detail
