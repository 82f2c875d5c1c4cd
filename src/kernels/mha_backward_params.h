// Parameters of the MHA prefill backward kernels (preprocess, main, postprocess), plain data
// filled by the dispatch from validated arguments (include/mlakit/mha_prefill.h) and the
// workspace layout (common/mha_backward_tiling.h). Strides are in elements; the last
// dimension of every [rows, heads, d] tensor is contiguous (validated).
#pragma once

#include <cstdint>

#include "kernels/mha_prefill_params.h"

namespace mlakit::detail {

// The forward's parameters (its inputs; out and lse are the forward's saved outputs, read
// here), then what only the backward has.
struct MhaBackwardParams : MhaPrefillParams {
  const void* dout = nullptr;  // [total_q, h_q, d_v]  Elem
  void* dq = nullptr;          // [total_q, h_q, d_qk] Elem
  void* dk = nullptr;          // [total_k, h_kv, d_qk] Elem
  void* dv = nullptr;          // [total_k, h_kv, d_v] Elem
  // Workspace (contiguous): dq / softmax_scale in float32, D = rowsum(dout * out), and the
  // deterministic mode's counters (null otherwise).
  float* dq_accum = nullptr;    // [total_q, h_q, d_qk], or in query-tile slots (dq_tiled)
  float* row_dot = nullptr;     // [h_q, total_q]
  int32_t* counters = nullptr;  // [b, h_q, query_tiles]
  int64_t num_counters = 0;
  int64_t query_tiles = 0;  // per (sequence, query head): tiles of max_seqlen_q
  int64_t dout_stride_t = 0, dout_stride_h = 0;
  int64_t dq_stride_t = 0, dq_stride_h = 0;
  int64_t dk_stride_t = 0, dk_stride_h = 0;
  int64_t dv_stride_t = 0, dv_stride_h = 0;
  bool deterministic = false;
  bool bulk_dq = false;  // sm90: dQ added by bulk reductions from shared memory (MhaBackwardConfig)
  // The Hopper main kernel's dq_accum: dq_slots query-tile slots (common/mha_backward_tiling.h),
  // zeroed by the preprocess (beside D) and converted after by its own kernel instead of the rows'.
  bool dq_tiled = false;
  int64_t dq_slots = 0;
  // The device's SMs: the Hopper main kernel's launch order (common/mha_backward_walk.h,
  // mha_backward_launch_group).
  int sm_count = 0;
  // The Hopper main kernel's tail split (common/mha_backward_tiling.h) in the base's
  // whole_tiles / tail_tiles / tail_pieces, counted in key tiles (CTAs) of the launch order;
  // the pieces' dK and dV here.
  float* partial_kv = nullptr;  // [tail_tiles * tail_pieces, kMhaBackwardSm90KeyRows, d_qk + d_v]
};

}  // namespace mlakit::detail
