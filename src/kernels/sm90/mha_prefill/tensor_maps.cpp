// The TMA maps of the Hopper MHA prefill (q, k, v) and backward (q, k, v, dout): [tokens,
// heads, d] as 4D maps {d, heads, tokens, 1} with boxes of 64 columns x 1 head x a tile of
// tokens, 128-byte swizzled.
#include "common/mha_backward_tiling.h"
#include "kernels/sm90/launch.h"

namespace mlakit::detail {
namespace {

// [tokens, heads, d] (strides in elements) as the encoder's 4D tensor [1, tokens, heads, d].
TmaTensor rows_tensor(const void* data, bool bf16, int64_t tokens, int heads, int d, int64_t stride_t,
                      int64_t stride_h) {
  TmaTensor t;
  t.data = const_cast<void*>(data);
  t.bf16 = bf16;
  t.shape[0] = 1;
  t.shape[1] = tokens;
  t.shape[2] = heads;
  t.shape[3] = d;
  t.stride[0] = tokens * stride_t;
  t.stride[1] = stride_t;
  t.stride[2] = stride_h;
  t.stride[3] = 1;
  return t;
}

}  // namespace

bool make_mha_prefill_maps(const MhaPrefillParams& p, bool bf16, MhaPrefillMaps* maps, std::string* why) {
  constexpr cuuint32_t kBoxCols = 64;
  const auto block_n = static_cast<cuuint32_t>(mha_sm90_block_n(p.d_qk, p.d_v, mha_sm90_wide_keys(p.d_qk, p.causal, p.max_seqlen_k)));
  const cuuint32_t q_box[4] = {kBoxCols, 1, static_cast<cuuint32_t>(mha_sm90_block_m(p.d_qk)), 1};
  const cuuint32_t kv_box[4] = {kBoxCols, 1, block_n, 1};
  *maps = MhaPrefillMaps{};
  if (!encode_tma_4d_map(rows_tensor(p.q, bf16, p.total_q, p.h_q, p.d_qk, p.q_stride_t, p.q_stride_h), q_box, "q",
                         &maps->q, why)) {
    return false;
  }
  if (p.total_k == 0) return true;  // no key anywhere: the kernel loads no K or V tile
  return encode_tma_4d_map(rows_tensor(p.k, bf16, p.total_k, p.h_kv, p.d_qk, p.k_stride_t, p.k_stride_h), kv_box, "k",
                           &maps->k, why) &&
         encode_tma_4d_map(rows_tensor(p.v, bf16, p.total_k, p.h_kv, p.d_v, p.v_stride_t, p.v_stride_h), kv_box, "v",
                           &maps->v, why);
}

bool make_mha_backward_maps(const MhaBackwardParams& p, bool bf16, MhaBackwardMaps* maps, std::string* why) {
  constexpr cuuint32_t kBoxCols = 64;
  const cuuint32_t q_box[4] = {kBoxCols, 1, static_cast<cuuint32_t>(kMhaBackwardSm90QueryRows), 1};
  const cuuint32_t kv_box[4] = {kBoxCols, 1, static_cast<cuuint32_t>(kMhaBackwardSm90KeyRows), 1};
  *maps = MhaBackwardMaps{};
  // No query row, no query head or no key: the kernel loads nothing (it zeroes dk and dv), and
  // a map with an extent of 0 is not encodable.
  if (p.total_q == 0 || p.total_k == 0 || p.h_q == 0) return true;
  return encode_tma_4d_map(rows_tensor(p.q, bf16, p.total_q, p.h_q, p.d_qk, p.q_stride_t, p.q_stride_h), q_box, "q",
                           &maps->q, why) &&
         encode_tma_4d_map(rows_tensor(p.dout, bf16, p.total_q, p.h_q, p.d_v, p.dout_stride_t, p.dout_stride_h),
                           q_box, "dout", &maps->dout, why) &&
         encode_tma_4d_map(rows_tensor(p.k, bf16, p.total_k, p.h_kv, p.d_qk, p.k_stride_t, p.k_stride_h), kv_box, "k",
                           &maps->k, why) &&
         encode_tma_4d_map(rows_tensor(p.v, bf16, p.total_k, p.h_kv, p.d_v, p.v_stride_t, p.v_stride_h), kv_box, "v",
                           &maps->v, why);
}

}  // namespace mlakit::detail
