#include "dispatch/mha_backward_dispatch.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/math_constants.h"
#include "dispatch/cuda_status.h"
#include "kernels/portable/launch.h"

namespace mlakit::detail {
namespace {

constexpr const char* kOp = "mha_prefill_backward";

MhaBackwardParams mha_backward_params(const MhaPrefillBackwardArgs& a, const MhaPrefillShape& s, float scale,
                                      const MhaBackwardWorkspace& layout, bool bulk_dq, void* workspace) {
  auto* base = static_cast<unsigned char*>(workspace);  // null only when layout.bytes is 0 (offsets 0)
  return MhaBackwardParams{
      .dout = a.dout.data,
      .q = a.q.data,
      .k = a.k.data,
      .v = a.v.data,
      .out = a.out.data,
      .lse = static_cast<const float*>(a.lse.data),
      .cu_seqlens_q = static_cast<const int32_t*>(a.cu_seqlens_q.data),
      .cu_seqlens_k = static_cast<const int32_t*>(a.cu_seqlens_k.data),
      .dq = a.dq.data,
      .dk = a.dk.data,
      .dv = a.dv.data,
      .dq_accum = reinterpret_cast<float*>(base + layout.dq_accum_offset),
      .row_dot = reinterpret_cast<float*>(base + layout.row_dot_offset),
      .counters = layout.counters > 0 ? reinterpret_cast<int32_t*>(base + layout.counters_offset) : nullptr,
      .num_counters = layout.counters,
      .query_tiles = mha_backward_query_tiles(a.max_seqlen_q, s.d_qk),
      .dout_stride_t = a.dout.stride[0],
      .dout_stride_h = a.dout.stride[1],
      .q_stride_t = a.q.stride[0],
      .q_stride_h = a.q.stride[1],
      .k_stride_t = a.k.stride[0],
      .k_stride_h = a.k.stride[1],
      .v_stride_t = a.v.stride[0],
      .v_stride_h = a.v.stride[1],
      .out_stride_t = a.out.stride[0],
      .out_stride_h = a.out.stride[1],
      .lse_stride_h = a.lse.stride[0],
      .lse_stride_t = a.lse.stride[1],
      .dq_stride_t = a.dq.stride[0],
      .dq_stride_h = a.dq.stride[1],
      .dk_stride_t = a.dk.stride[0],
      .dk_stride_h = a.dk.stride[1],
      .dv_stride_t = a.dv.stride[0],
      .dv_stride_h = a.dv.stride[1],
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
      .deterministic = a.deterministic,
      .bulk_dq = bulk_dq,
      .softmax_scale = scale,
      .scale_log2 = scale * static_cast<float>(kLog2e),
  };
}

template <typename Elem>
Status run(const MhaBackwardParams& params, cudaStream_t stream) {
  MLAKIT_RETURN_IF_ERROR(cuda_status(kOp, launch_mha_backward_preprocess<Elem>(params, stream)));
  MLAKIT_RETURN_IF_ERROR(cuda_status(kOp, launch_mha_backward_main_portable<Elem>(params, stream)));
  return cuda_status(kOp, launch_mha_backward_postprocess<Elem>(params, stream));
}

}  // namespace

Status dispatch_mha_backward(const MhaPrefillBackwardArgs& args, const MhaPrefillShape& shape, float softmax_scale,
                             const MhaBackwardWorkspace& layout, bool bulk_dq, void* workspace,
                             cudaStream_t stream) {
  const MhaBackwardParams params = mha_backward_params(args, shape, softmax_scale, layout, bulk_dq, workspace);
  if (args.q.dtype == DType::kBF16) return run<__nv_bfloat16>(params, stream);
  return run<__half>(params, stream);
}

}  // namespace mlakit::detail
