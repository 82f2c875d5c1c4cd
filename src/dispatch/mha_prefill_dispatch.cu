#include "dispatch/mha_prefill_dispatch.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <string>
#include <type_traits>

#include "common/math_constants.h"
#include "dispatch/cuda_status.h"
#include "kernels/portable/launch.h"
#include "kernels/sm90/launch.h"

namespace mlakit::detail {

MhaPrefillParams mha_prefill_params(const MhaPrefillArgs& a, const MhaPrefillShape& s, float scale) {
  return MhaPrefillParams{
      .q = a.q.data,
      .k = a.k.data,
      .v = a.v.data,
      .out = a.out.data,
      .lse = static_cast<float*>(a.lse.data),
      .cu_seqlens_q = static_cast<const int32_t*>(a.cu_seqlens_q.data),
      .cu_seqlens_k = static_cast<const int32_t*>(a.cu_seqlens_k.data),
      .q_stride_t = a.q.stride[0],
      .q_stride_h = a.q.stride[1],
      .k_stride_t = a.k.stride[0],
      .k_stride_h = a.k.stride[1],
      .v_stride_t = a.v.stride[0],
      .v_stride_h = a.v.stride[1],
      .out_stride_t = a.out.stride[0],
      .out_stride_h = a.out.stride[1],
      .lse_stride_h = a.lse.empty() ? 0 : a.lse.stride[0],
      .lse_stride_t = a.lse.empty() ? 0 : a.lse.stride[1],
      .total_q = s.total_q,
      .total_k = s.total_k,
      .b = static_cast<int>(s.b),
      .h_q = s.h_q,
      .h_kv = s.h_kv,
      .heads_per_kv = s.h_q / s.h_kv,
      .d_qk = s.d_qk,
      .d_v = s.d_v,
      .max_seqlen_q = a.max_seqlen_q,
      .max_seqlen_k = a.max_seqlen_k,
      .causal = a.causal,
      .softmax_scale = scale,
      .scale_log2 = scale * static_cast<float>(kLog2e),
  };
}

namespace {

// The Hopper kernel's tail split of `params`' tiles (common/mha_prefill_tiling.h), its
// partial rows in `workspace`; no split where the workspace has no room for one.
void plan_tail_split(MhaPrefillParams* params, int sm_count, void* workspace) {
  const MhaPrefillParams& p = *params;
  const int64_t tiles = mha_prefill_sm90_tiles(p.max_seqlen_q, p.h_q, p.b, p.d_qk);
  const int block_n = mha_sm90_block_n(p.d_qk, p.d_v, mha_sm90_wide_keys(p.d_qk, p.causal, p.max_seqlen_k));
  const int64_t key_tiles = (static_cast<int64_t>(p.max_seqlen_k) + block_n - 1) / block_n;
  const bool room = workspace != nullptr && mha_prefill_workspace_bytes(p.max_seqlen_q, p.max_seqlen_k, p.h_q, p.b,
                                                                        p.d_qk, p.d_v, p.causal) > 0;
  const MhaPrefillTailSplit split =
      room ? mha_prefill_tail_split(tiles, key_tiles, p.causal, sm_count) : MhaPrefillTailSplit{tiles, 0, 1};
  params->whole_tiles = split.whole_tiles;
  params->tail_tiles = split.tail_tiles;
  params->tail_pieces = split.pieces;
  if (split.tail_tiles == 0) return;
  const int block_m = mha_sm90_block_m(p.d_qk);
  auto* base = static_cast<unsigned char*>(workspace);
  params->partial_out = reinterpret_cast<float*>(base);
  params->partial_lse =
      reinterpret_cast<float*>(base + mha_prefill_partial_out_bytes(kMhaPrefillTailSlots, block_m, p.d_v));
}

template <typename Elem>
Status run(MhaPrefillParams params, bool sm90_required, MlaKernel kernel, int sm_count, void* workspace,
           cudaStream_t stream) {
  constexpr const char* kOp = "mha_prefill";
  if (kernel == MlaKernel::kSm90) {
    MhaPrefillMaps maps;
    std::string why;
    if (make_mha_prefill_maps(params, std::is_same_v<Elem, __nv_bfloat16>, &maps, &why)) {
      plan_tail_split(&params, sm_count, workspace);
      return cuda_status(kOp, launch_mha_prefill_sm90<Elem>(params, maps, stream));
    }
    if (sm90_required) {
      return Status(StatusCode::kInvalidArgument, std::string(kOp) + ": kernel: kSm90 cannot take this layout: " + why);
    }
  }
  return cuda_status(kOp, launch_mha_prefill_portable<Elem>(params, stream));
}

}  // namespace

Status dispatch_mha_prefill(const MhaPrefillArgs& args, const MhaPrefillShape& shape, float softmax_scale,
                            bool sm90_required, MlaKernel kernel, int sm_count, void* workspace, cudaStream_t stream) {
  const MhaPrefillParams params = mha_prefill_params(args, shape, softmax_scale);
  if (args.q.dtype == DType::kBF16) {
    return run<__nv_bfloat16>(params, sm90_required, kernel, sm_count, workspace, stream);
  }
  return run<__half>(params, sm90_required, kernel, sm_count, workspace, stream);
}

}  // namespace mlakit::detail
