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

template <typename Elem>
Status run(const MhaPrefillParams& params, bool sm90_required, MlaKernel kernel, cudaStream_t stream) {
  constexpr const char* kOp = "mha_prefill";
  if (kernel == MlaKernel::kSm90) {
    MhaPrefillMaps maps;
    std::string why;
    if (make_mha_prefill_maps(params, std::is_same_v<Elem, __nv_bfloat16>, &maps, &why)) {
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
                            bool sm90_required, MlaKernel kernel, cudaStream_t stream) {
  const MhaPrefillParams params = mha_prefill_params(args, shape, softmax_scale);
  if (args.q.dtype == DType::kBF16) return run<__nv_bfloat16>(params, sm90_required, kernel, stream);
  return run<__half>(params, sm90_required, kernel, stream);
}

}  // namespace mlakit::detail
