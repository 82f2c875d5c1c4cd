// Parameters of the MHA prefill kernels (portable and Hopper), plain data filled by the
// dispatch from validated arguments (include/mlakit/mha_prefill.h). Strides are in elements;
// the last dimension of q, k, v and out is contiguous (validated).
#pragma once

#include <cstdint>

namespace mlakit::detail {

struct MhaPrefillParams {
  const void* q = nullptr;            // [total_q, h_q, d_qk]  Elem
  const void* k = nullptr;            // [total_k, h_kv, d_qk] Elem
  const void* v = nullptr;            // [total_k, h_kv, d_v]  Elem
  void* out = nullptr;                // [total_q, h_q, d_v]   Elem
  float* lse = nullptr;               // optional [h_q, total_q] float32, natural log
  const int32_t* cu_seqlens_q = nullptr;  // [b + 1]
  const int32_t* cu_seqlens_k = nullptr;  // [b + 1]
  int64_t q_stride_t = 0, q_stride_h = 0;
  int64_t k_stride_t = 0, k_stride_h = 0;
  int64_t v_stride_t = 0, v_stride_h = 0;
  int64_t out_stride_t = 0, out_stride_h = 0;
  int64_t lse_stride_h = 0, lse_stride_t = 0;
  int64_t total_q = 0, total_k = 0;
  int b = 0;
  int h_q = 0, h_kv = 1;
  int heads_per_kv = 1;  // h_q / h_kv: query head h reads kv head h / heads_per_kv
  int d_qk = 0, d_v = 0;
  int max_seqlen_q = 0, max_seqlen_k = 0;
  bool causal = false;  // bottom-right aligned: query t sees keys j <= t + Lk - Lq
  float softmax_scale = 0.f;
  float scale_log2 = 0.f;  // softmax_scale * log2(e): the kernels' exponentials are base 2
  // The Hopper kernel's tail split (common/mha_prefill_tiling.h; the portable kernel ignores
  // it): tiles past whole_tiles run in tail_pieces pieces that write their partial rows to the
  // workspace, merged by the combine kernel. tail_tiles 0: no split.
  int64_t whole_tiles = 0;
  int tail_tiles = 0, tail_pieces = 1;
  float* partial_out = nullptr;  // [tail_tiles * tail_pieces, block_m, d_v]
  float* partial_lse = nullptr;  // [tail_tiles * tail_pieces, block_m], base 2
};

}  // namespace mlakit::detail
