#include "dispatch/mla_sparse_decode_dispatch.h"

#include <cuda_bf16.h>

#include <string>

#include "common/fp8_v4_cache_row.h"
#include "common/math_constants.h"
#include "dispatch/cuda_status.h"
#include "dispatch/planned_decode.h"
#include "dispatch/tma_tensor.h"
#include "kernels/portable/launch.h"
#include "kernels/sm90/launch.h"

namespace mlakit::detail {

Status dispatch_sparse_decode_plan(const MlaDecodePlan& plan, const SeqLengths& lengths, cudaStream_t stream) {
  return cuda_status("mla_decode_plan", launch_plan(plan, lengths, stream));
}

namespace {

// One cache and its index list as the kernels read them (V4: pages step by records of 576
// bytes; the tensor's stride[1], 584, is the FlashMLA view's, not an address step).
ListedKeys listed_keys(const TensorRef& cache, const TensorRef& indices, Fp8TokenLayout layout) {
  if (cache.empty()) return ListedKeys{};
  const int page_size = static_cast<int>(cache.shape[1]);
  return ListedKeys{
      .kv = cache.data,
      .kv_stride_block = cache.stride[0],
      .kv_stride_page = layout == Fp8TokenLayout::kV4 ? int64_t{kV4RecordBytes} : cache.stride[1],
      .indices = static_cast<const int32_t*>(indices.data),
      .indices_stride_b = indices.stride[0],
      .indices_stride_s = indices.stride[1],
      .slot_limit = sparse_slot_limit(cache.shape[0], page_size),
      .page_divisor = FastDivisor(static_cast<uint32_t>(page_size)),
  };
}

}  // namespace

SparseDecodeParams make_sparse_decode_params(const MlaSparseDecodeArgs& a, const MlaDecodePlan& plan,
                                             const SeqLengths& lengths, Fp8TokenLayout layout, float softmax_scale) {
  // One scheduled sequence per (batch entry, query token): rows = the h_q heads of one token.
  const MlaDecodeProblem& pr = plan.problem;
  SparseDecodeParams params{
      .core =
          {
              .lengths = lengths,
              .b = pr.b,
              .s_q = 1,
              .h_q = pr.h_q,
              .h_kv = 1,
              .heads_per_kv = pr.h_q,
              .rows = pr.h_q,
              .scale_log2 = softmax_scale * static_cast<float>(kLog2e),
              .causal = false,
              .seq_divisor = static_cast<int>(a.q.shape[1]),
              .d_qk = static_cast<int>(a.q.shape[3]),  // V4: 512, the 576-wide tiles zero past it
              .attn_sink = a.attn_sink.empty() ? nullptr : static_cast<const float*>(a.attn_sink.data),
          },
      .keys = listed_keys(a.kv_cache, a.indices, layout),
      .extra_keys = listed_keys(a.extra_kv_cache, a.extra_indices, layout),
      .layout = layout,
      .schedule = plan_schedule(plan),
  };
  attach_io(a.q, a.out, a.lse, &params.core);
  return params;
}

Status dispatch_mla_sparse_decode(const MlaSparseDecodeArgs& a, const MlaDecodePlan& plan, const SeqLengths& lengths,
                                  Fp8TokenLayout layout, float softmax_scale, cudaStream_t stream) {
  const SparseDecodeParams params = make_sparse_decode_params(a, plan, lengths, layout, softmax_scale);
  // The plan's kernel: its layout (rows per tile, parts) was made for that kernel.
  if (plan.kernel == MlaKernel::kSm90) {
    CUtensorMap q_map;
    std::string why;  // no map (unaligned q): the consumers copy Q by cp.async
    const CUtensorMap* q_by_tma =
        make_q_tensor_map(tma_tensor(a.q), params.core.heads_per_kv, &q_map, &why) ? &q_map : nullptr;
    return cuda_status("mla_sparse_decode_fp8",
                       with_combine<__nv_bfloat16>(launch_mla_sparse_decode_sm90(params, q_by_tma, stream), params,
                                                   stream));
  }
  return cuda_status("mla_sparse_decode_fp8",
                     with_combine<__nv_bfloat16>(launch_mla_sparse_decode_portable(params, stream), params,
                                                 stream));
}

}  // namespace mlakit::detail
