#include "common/math_constants.h"
#include "dispatch/mla_decode_dispatch.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <string>

#include "dispatch/cuda_status.h"
#include "dispatch/planned_decode.h"
#include "dispatch/tma_tensor.h"
#include "kernels/combine/mla_decode_combine_launch.h"
#include "kernels/portable/launch.h"
#include "kernels/sm90/launch.h"

namespace mlakit::detail {

Status dispatch_decode_plan(const MlaDecodePlan& plan, const int32_t* cache_seqlens,
                            cudaStream_t stream) {
  return cuda_status("mla_decode_plan", launch_plan(plan, dense_lengths(cache_seqlens), stream));
}

DenseDecodeParams make_decode_params(const MlaDecodeArgs& a, const MlaDecodePlan& plan, float softmax_scale) {
  const MlaDecodeProblem& pr = plan.problem;
  const int heads_per_kv = pr.h_q / pr.h_kv;
  DenseDecodeParams p{
      .core =
          {
              .lengths = dense_lengths(static_cast<const int32_t*>(a.cache_seqlens.data)),
              .b = pr.b,
              .s_q = pr.s_q,
              .h_q = pr.h_q,
              .h_kv = pr.h_kv,
              .heads_per_kv = heads_per_kv,
              .rows = pr.s_q * heads_per_kv,
              .scale_log2 = softmax_scale * static_cast<float>(kLog2e),
              .causal = a.causal && pr.s_q > 1,
          },
      .cache =
          {
              .kv = a.kv_cache.data,
              .block_table = static_cast<const int32_t*>(a.block_table.data),
              .kv_stride_block = a.kv_cache.stride[0],
              .kv_stride_page = a.kv_cache.stride[1],
              .kv_stride_h = a.kv_cache.stride[2],
              .block_table_stride_b = a.block_table.stride[0],
              .page_size = static_cast<int>(a.kv_cache.shape[1]),
              .num_blocks = a.kv_cache.shape[0],
              .max_blocks_per_seq = static_cast<int>(a.block_table.shape[1]),
          },
      .schedule = plan_schedule(plan),
  };
  attach_io(a.q, a.out, a.lse, &p.core);
  return p;
}

namespace {

// Attention by the plan's kernel, then the combine. The Hopper kernel tiles pages that are
// multiples of 64, or 16 / 32; the portable kernel runs any page size with the same plan (the
// schedule does not depend on the tiling).
template <typename Elem>
cudaError_t launch_decode(const MlaDecodeArgs& a, const MlaDecodePlan& plan, const DenseDecodeParams& params,
                          cudaStream_t stream) {
  if (plan.kernel == MlaKernel::kSm90) {
    const int box_rows = sm90_box_rows(params.cache.page_size);
    CUtensorMap kv_map;
    std::string why;
    if (box_rows > 0 && make_kv_tensor_map(tma_tensor(a.kv_cache), box_rows, &kv_map, &why)) {
      CUtensorMap q_map;
      const CUtensorMap* q_by_tma =
          make_q_tensor_map(tma_tensor(a.q), params.core.heads_per_kv, &q_map, &why) ? &q_map : nullptr;
      return with_combine<Elem>(launch_mla_decode_sm90<Elem>(params, kv_map, box_rows, q_by_tma, stream), params,
                                stream);
    }
  }
  return with_combine<Elem>(launch_mla_decode_portable<Elem>(params, stream), params, stream);
}

}  // namespace

Status dispatch_mla_decode(const MlaDecodeArgs& a, const MlaDecodePlan& plan, float softmax_scale,
                           cudaStream_t stream) {
  if (a.q.dtype != DType::kBF16 && a.q.dtype != DType::kFP16) {
    return Status(StatusCode::kUnsupported, "mla_decode: q.dtype: expected bf16 or fp16");
  }
  const DenseDecodeParams params = make_decode_params(a, plan, softmax_scale);
  return cuda_status("mla_decode", a.q.dtype == DType::kBF16 ? launch_decode<__nv_bfloat16>(a, plan, params, stream)
                                                             : launch_decode<__half>(a, plan, params, stream));
}

Status dispatch_mla_decode_combine(const MlaDecodeArgs& a, const MlaDecodePlan& plan, cudaStream_t stream) {
  const DenseDecodeParams params = make_decode_params(a, plan, 1.0f);
  const CombineParams combine{params.core, params.schedule};
  return cuda_status("mla_decode_combine", a.q.dtype == DType::kBF16
                                               ? launch_mla_decode_combine<__nv_bfloat16>(combine, stream)
                                               : launch_mla_decode_combine<__half>(combine, stream));
}

}  // namespace mlakit::detail
