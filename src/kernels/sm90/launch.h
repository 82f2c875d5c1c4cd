// Launchers of the Hopper (sm_90a) dense MLA decode (and the tensor map it reads the paged
// cache through), of the sparse FP8 decode and of the sparse prefill. Host code; one explicit instantiation per dtype in its own .cu file.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <string>

#include "common/mha_backward_tiling.h"
#include "common/mha_prefill_tiling.h"
#include "kernels/mha_backward_params.h"
#include "kernels/mha_prefill_params.h"
#include "kernels/mla_params.h"

namespace mlakit::detail {

// A bf16 / fp16 tensor (2-byte elements) as the tensor-map encoders below read it, in plain
// data: the dispatch builds it from the public TensorRef (dispatch/tma_tensor.h), so the
// kernel layer needs no public header. Sizes and strides (in elements) outermost first; a 3D
// tensor leaves index 3 unused.
struct TmaTensor {
  void* data = nullptr;
  bool bf16 = true;  // else fp16
  int64_t shape[4] = {};
  int64_t stride[4] = {};
};

// A 128-byte-swizzled tiled map over a 4D bf16/fp16 tensor with dims taken innermost first
// (shape[3] .. shape[0]) and the given box (innermost first). A dimension of size 1 gets the
// stride the dense layout would have (its stride never matters but must be valid). `what`
// names the tensor in the reason for a refusal (false, `why` set).
bool encode_tma_4d_map(const TmaTensor& t, const cuuint32_t (&box)[4], const char* what, CUtensorMap* map,
                       std::string* why);

// Rows per TMA box for a page size: 64-key tiles are loaded as whole 64-row boxes when the
// page is a multiple of 64, as 64 / page boxes when page is 16 or 32; 0 = not supported by
// the Hopper kernel (the portable kernel serves it).
int sm90_box_rows(int64_t page_size);

// 4D map {d_qk, h_kv, page, num_blocks} over the cache, box {64, 1, box_rows, 1}, 128-byte
// swizzle. False (with the driver's reason) when the driver rejects it.
bool make_kv_tensor_map(const TmaTensor& kv_cache, int box_rows, CUtensorMap* map, std::string* why);

// 4D map {d_qk, h_q, s_q, b} over q [b, s_q, h_q, d_qk], box {64, heads, tokens, 1} covering one
// 64-row tile of packed rows (heads = min(heads_per_kv, 64), tokens = 64 / heads), 128-byte
// swizzle. False (with the reason) when heads_per_kv is neither a multiple nor a divisor of
// 64 (a tile's rows are then no box) or the driver rejects the map (strides, alignment).
bool make_q_tensor_map(const TmaTensor& q, int heads_per_kv, CUtensorMap* map, std::string* why);

// The sparse prefill's q [s_q, h_q, d_qk] as make_q_tensor_map's 4D map {d_qk, h_q, 1, s_q}
// (token s_q of the map = batch entry of the kernel's scheduled sequences; columns past a
// d_qk of 512 are zero-filled).
bool make_sparse_prefill_q_tensor_map(const TmaTensor& q, CUtensorMap* map, std::string* why);

// A kernel's by-value tensor-map argument where the map is optional (the kernel also takes a
// flag saying whether it is set): the map, or an empty one that is never read.
inline CUtensorMap map_or_empty(const CUtensorMap* map) { return map != nullptr ? *map : CUtensorMap{}; }

// Attention alone (grid: 64-row tiles x h_kv x num_parts); the dispatch starts the combine
// after it. q_map: the Q tile by TMA; nullptr: by cp.async.
template <typename Elem>
cudaError_t launch_mla_decode_sm90(const DenseDecodeParams& params, const CUtensorMap& kv_map, int box_rows,
                                   const CUtensorMap* q_map, cudaStream_t stream);

// Sparse prefill (no plan): grid s_q * 64-row tiles, KV rows gathered by index. bf16. q_map
// (make_sparse_prefill_q_tensor_map): the Q tile by TMA; nullptr: by cp.async.
cudaError_t launch_mla_sparse_prefill_sm90(const SparsePrefillParams& params, const CUtensorMap* q_map,
                                           cudaStream_t stream);

// Sparse FP8 decode (grid: 64-row tiles x 1 x num_parts of the sparse plan): the tokens (of
// params.layout) listed by the index lists of params.keys and params.extra_keys, dequantized
// into bf16 tiles; the dispatch starts the combine after it.
// q_map (make_q_tensor_map with h_q heads per kv head): the Q tiles by TMA; nullptr: cp.async.
cudaError_t launch_mla_sparse_decode_sm90(const SparseDecodeParams& params, const CUtensorMap* q_map,
                                          cudaStream_t stream);

// ---- MHA prefill (mha_prefill/) ----

// Tile heights, key-tile widths and the tail split: common/mha_prefill_tiling.h.

// Its TMA maps: q, k and v as 4D maps {d, heads, tokens, 1} read in boxes of 64 columns x 1
// head x a tile of tokens, 128-byte swizzled.
struct MhaPrefillMaps {
  CUtensorMap q, k, v;
};

// Builds the maps for `params`. False with the driver's reason when a tensor cannot be
// described (unaligned base or strides, sizes past TMA's limits).
bool make_mha_prefill_maps(const MhaPrefillParams& params, bool bf16, MhaPrefillMaps* maps, std::string* why);

// Grid (query tiles of max_seqlen_q, h_q, b), the longest causal tiles first, or with a tail
// split (params.tail_tiles > 0, mha_prefill_tail_split) one dimension of its CTAs, the pieces
// last, and the combine of the pieces after it; one producer warp and two consumer
// warpgroups of 64 query rows each. Elem: __nv_bfloat16 or __half.
template <typename Elem>
cudaError_t launch_mha_prefill_sm90(const MhaPrefillParams& params, const MhaPrefillMaps& maps, cudaStream_t stream);

// ---- MHA prefill backward (mha_backward/) ----

// Problems the Hopper backward serves (the portable kernel serves every one): d (64, 64),
// (128, 128) and (192, 128), grids within CUDA's y / z limits.
constexpr bool mha_sm90_backward_supported(int d_qk, int d_v, int h_kv, int b) {
  return mha_backward_hopper_dims(d_qk, d_v) && h_kv <= 65535 && b <= 65535;
}
// Keys per CTA (its K / V maps' boxes): kMhaBackwardSm90KeyRows, common/mha_backward_tiling.h.

// Its TMA maps: q, k, v and dout as 4D maps {d, heads, tokens, 1} read in boxes of 64 columns
// x 1 head x a tile of tokens (query tiles of kMhaBackwardSm90QueryRows, 128 keys), 128-byte
// swizzled.
struct MhaBackwardMaps {
  CUtensorMap q, k, v, dout;
};
bool make_mha_backward_maps(const MhaBackwardParams& params, bool bf16, MhaBackwardMaps* maps, std::string* why);

// Grid (128-key tiles of max_seqlen_k, h_kv, b); a producer warp, a dQ writer lane and two
// consumer warpgroups of 64 keys each. Elem: __nv_bfloat16 or __half. Its dq_accum is in query-tile
// slots (params.dq_tiled), zeroed before it by the portable row kernel (beside D),
// converted after it by launch_mha_backward_sm90_dq_convert (dq in q's dtype).
template <typename Elem>
cudaError_t launch_mha_backward_sm90(const MhaBackwardParams& params, const MhaBackwardMaps& maps,
                                     cudaStream_t stream);
template <typename Elem>
cudaError_t launch_mha_backward_sm90_dq_convert(const MhaBackwardParams& params, cudaStream_t stream);

}  // namespace mlakit::detail
