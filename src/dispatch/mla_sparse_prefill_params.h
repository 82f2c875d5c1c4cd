// The sparse prefill's kernel parameters (SparsePrefillParams), shared by the
// dispatch and the timeline tool (bench/timeline.cu), which builds its own traced kernel.
#pragma once

#include "common/math_constants.h"
#include "common/sparse_prefill_shape.h"
#include "kernels/mla_params.h"
#include "mlakit/mla_sparse_prefill.h"

namespace mlakit::detail {

// The prefill as the decode kernel sees it: s_q sequences (one per query token) of
// topk_length[i] (clamped to topk) or topk keys, whose rows are the h_q heads of that token
// (h_kv = 1, token coordinate always 0, so the _s strides are unused); kv is s_kv pages of
// one row, so an index is a cache slot and [0, s_kv) its valid range.
inline SparsePrefillParams sparse_prefill_params(const MlaSparsePrefillArgs& a, const SparsePrefillShape& shape,
                                                 float sm_scale) {
  return SparsePrefillParams{
      .core =
          {
              .q = a.q.data,
              .out = a.out.data,
              .lse = static_cast<float*>(a.lse.data),
              .lengths = SeqLengths{a.topk_length.empty() ? nullptr : static_cast<const int32_t*>(a.topk_length.data),
                                    shape.topk, 1, shape.topk},
              .q_stride_b = a.q.stride[0],
              .q_stride_s = 0,
              .q_stride_h = a.q.stride[1],
              .out_stride_b = a.out.stride[0],
              .out_stride_s = 0,
              .out_stride_h = a.out.stride[1],
              .lse_stride_b = a.lse.stride[0],
              .lse_stride_h = a.lse.stride[1],
              .lse_stride_s = 0,
              .b = shape.s_q,
              .s_q = 1,
              .h_q = shape.h_q,
              .h_kv = 1,
              .heads_per_kv = shape.h_q,
              .rows = shape.h_q,
              .scale_log2 = sm_scale * static_cast<float>(kLog2e),
              .causal = false,
              .seq_divisor = 1,
              .d_qk = shape.d_qk,
              .lse_base2 = a.lse_base == LseBase::kBase2,
              .attn_sink = a.attn_sink.empty() ? nullptr : static_cast<const float*>(a.attn_sink.data),
              .max_logits = static_cast<float*>(a.max_logits.data),
              .max_logits_stride_b = a.max_logits.stride[0],
              .max_logits_stride_h = a.max_logits.stride[1],
              .max_logits_stride_s = 0,
          },
      .keys =
          {
              .kv = a.kv.data,
              .kv_stride_block = a.kv.stride[0],
              .kv_stride_page = 0,
              .indices = static_cast<const int32_t*>(a.indices.data),
              .indices_stride_b = a.indices.stride[0],
              .indices_stride_s = 0,
              .slot_limit = sparse_slot_limit(shape.s_kv, 1),
              .page_divisor = FastDivisor(1),
          },
  };
}

}  // namespace mlakit::detail
