#include "dispatch/mla_decode_dispatch.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <string>

#include "common/math_constants.h"
#include "dispatch/cuda_status.h"
#include "kernels/portable/launch.h"
#include "kernels/sm90/launch.h"

namespace mlakit::detail {
namespace {

template <typename T>
T* region(const MlaDecodePlan& plan, std::size_t offset) {
  return reinterpret_cast<T*>(static_cast<char*>(plan.workspace) + offset);
}

ScheduleConfig plan_schedule_config(const MlaDecodePlan& plan) {
  return ScheduleConfig{
      .num_parts = plan.num_parts,
      .block_n = plan.block_n,
      .overhead_blocks = plan.overhead_blocks,
  };
}

}  // namespace

Status dispatch_decode_plan(const MlaDecodePlan& plan, const int32_t* cache_seqlens,
                            cudaStream_t stream) {
  return dispatch_sparse_decode_plan(plan, dense_lengths(cache_seqlens), stream);
}

Status dispatch_sparse_decode_plan(const MlaDecodePlan& plan, const SeqLengths& lengths, cudaStream_t stream) {
  return cuda_status(
      "mla_decode_plan",
      launch_decode_plan(lengths, plan.problem.b, plan_schedule_config(plan),
                         region<int64_t>(plan, plan.cost_prefix_offset),
                         region<int32_t>(plan, plan.split_prefix_offset),
                         region<int32_t>(plan, plan.partial_prefix_offset),
                         region<PartRange>(plan, plan.part_ranges_offset), stream));
}

// What every planned launch takes from its plan: the workspace regions (schedule, partial
// results) and the schedule's shape.
static void attach_plan(const MlaDecodePlan& plan, MlaDecodeParams* p) {
  p->part_ranges = region<const PartRange>(plan, plan.part_ranges_offset);
  p->split_prefix = region<const int32_t>(plan, plan.split_prefix_offset);
  p->partial_prefix = region<const int32_t>(plan, plan.partial_prefix_offset);
  p->partial_out = region<float>(plan, plan.partial_out_offset);
  p->partial_lse = region<float>(plan, plan.partial_lse_offset);
  p->block_n = plan.block_n;
  p->num_parts = plan.num_parts;
  p->no_splits = plan.no_splits;  // the attention launchers then skip the combine
}

// q / out [b, s_q, h_q, d] and lse [b, h_q, s_q], as both decodes take them.
static void attach_io(const TensorRef& q, const TensorRef& out, const TensorRef& lse, MlaDecodeParams* p) {
  p->q = q.data;
  p->out = out.data;
  p->lse = static_cast<float*>(lse.data);
  p->q_stride_b = q.stride[0];
  p->q_stride_s = q.stride[1];
  p->q_stride_h = q.stride[2];
  p->out_stride_b = out.stride[0];
  p->out_stride_s = out.stride[1];
  p->out_stride_h = out.stride[2];
  p->lse_stride_b = lse.stride[0];
  p->lse_stride_h = lse.stride[1];
  p->lse_stride_s = lse.stride[2];
}

MlaDecodeParams make_decode_params(const MlaDecodeArgs& a, const MlaDecodePlan& plan, float softmax_scale) {
  const MlaDecodeProblem& pr = plan.problem;
  const int heads_per_kv = pr.h_q / pr.h_kv;
  MlaDecodeParams p{
      .kv = a.kv_cache.data,
      .block_table = static_cast<const int32_t*>(a.block_table.data),
      .lengths = dense_lengths(static_cast<const int32_t*>(a.cache_seqlens.data)),
      .kv_stride_block = a.kv_cache.stride[0],
      .kv_stride_page = a.kv_cache.stride[1],
      .kv_stride_h = a.kv_cache.stride[2],
      .block_table_stride_b = a.block_table.stride[0],
      .b = pr.b,
      .s_q = pr.s_q,
      .h_q = pr.h_q,
      .h_kv = pr.h_kv,
      .heads_per_kv = heads_per_kv,
      .rows = pr.s_q * heads_per_kv,
      .page_size = static_cast<int>(a.kv_cache.shape[1]),
      .num_blocks = a.kv_cache.shape[0],
      .max_blocks_per_seq = static_cast<int>(a.block_table.shape[1]),
      .scale_log2 = softmax_scale * static_cast<float>(kLog2e),
      .causal = a.causal && pr.s_q > 1,
      .seq_divisor = 1,
  };
  attach_plan(plan, &p);
  attach_io(a.q, a.out, a.lse, &p);
  return p;
}

Status dispatch_mla_decode(const MlaDecodeArgs& a, const MlaDecodePlan& plan, float softmax_scale,
                           cudaStream_t stream) {
  if (a.q.dtype != DType::kBF16 && a.q.dtype != DType::kFP16) {
    return Status(StatusCode::kUnsupported, "mla_decode: q.dtype: expected bf16 or fp16");
  }
  const MlaDecodeParams params = make_decode_params(a, plan, softmax_scale);
  const bool bf16 = a.q.dtype == DType::kBF16;
  // The Hopper kernel tiles pages that are multiples of 64, or 16 / 32; the portable kernel
  // runs any page size with the same plan (the schedule does not depend on the tiling).
  if (plan.kernel == MlaDecodeKernel::kSm90) {
    const int box_rows = sm90_box_rows(params.page_size);
    CUtensorMap kv_map;
    std::string why;
    if (box_rows > 0 && make_kv_tensor_map(a.kv_cache, box_rows, &kv_map, &why)) {
      CUtensorMap q_map;
      const CUtensorMap* q_by_tma = make_q_tensor_map(a.q, params.heads_per_kv, &q_map, &why) ? &q_map : nullptr;
      return cuda_status("mla_decode",
                         bf16 ? launch_mla_decode_sm90<__nv_bfloat16>(params, kv_map, box_rows, q_by_tma, stream)
                              : launch_mla_decode_sm90<__half>(params, kv_map, box_rows, q_by_tma, stream));
    }
  }
  return cuda_status("mla_decode", bf16 ? launch_mla_decode_portable<__nv_bfloat16>(params, stream)
                                        : launch_mla_decode_portable<__half>(params, stream));
}

MlaDecodeParams make_sparse_decode_params(const MlaSparseDecodeArgs& a, const MlaDecodePlan& plan,
                                          const SeqLengths& lengths, float softmax_scale) {
  // One scheduled sequence per (batch entry, query token): rows = the h_q heads of one token.
  const MlaDecodeProblem& pr = plan.problem;
  MlaDecodeParams params{
      .kv = a.kv_cache.data,
      .lengths = lengths,
      .kv_stride_block = a.kv_cache.stride[0],
      .kv_stride_page = a.kv_cache.stride[1],
      .b = pr.b,
      .s_q = 1,
      .h_q = pr.h_q,
      .h_kv = 1,
      .heads_per_kv = pr.h_q,
      .rows = pr.h_q,
      .page_size = static_cast<int>(a.kv_cache.shape[1]),
      .num_blocks = a.kv_cache.shape[0],
      .scale_log2 = softmax_scale * static_cast<float>(kLog2e),
      .causal = false,
      .seq_divisor = static_cast<int>(a.q.shape[1]),
      .indices = static_cast<const int32_t*>(a.indices.data),
      .indices_stride_b = a.indices.stride[0],
      .indices_stride_s = a.indices.stride[1],
      .attn_sink = a.attn_sink.empty() ? nullptr : static_cast<const float*>(a.attn_sink.data),
      .slot_limit = sparse_slot_limit(a.kv_cache.shape[0], static_cast<int>(a.kv_cache.shape[1])),
      .page_divisor = FastDivisor(static_cast<uint32_t>(a.kv_cache.shape[1])),
  };
  attach_plan(plan, &params);
  attach_io(a.q, a.out, a.lse, &params);
  return params;
}

Status dispatch_mla_sparse_decode(const MlaSparseDecodeArgs& a, const MlaDecodePlan& plan, const SeqLengths& lengths,
                                  float softmax_scale, cudaStream_t stream) {
  const MlaDecodeParams params = make_sparse_decode_params(a, plan, lengths, softmax_scale);
  // The plan's kernel: its layout (rows per tile, parts) was made for that kernel.
  if (plan.kernel == MlaDecodeKernel::kSm90) {
    CUtensorMap q_map;
    std::string why;  // no map (unaligned q): the consumers copy Q by cp.async
    const CUtensorMap* q_by_tma = make_q_tensor_map(a.q, params.heads_per_kv, &q_map, &why) ? &q_map : nullptr;
    return cuda_status("mla_sparse_decode_fp8", launch_mla_sparse_decode_sm90(params, q_by_tma, stream));
  }
  return cuda_status("mla_sparse_decode_fp8", launch_mla_decode_portable<__nv_bfloat16>(params, stream));
}

Status dispatch_mla_decode_combine(const MlaDecodeArgs& a, const MlaDecodePlan& plan, cudaStream_t stream) {
  const MlaDecodeParams params = make_decode_params(a, plan, 1.0f);
  return cuda_status("mla_decode_combine", a.q.dtype == DType::kBF16
                                               ? launch_mla_decode_combine<__nv_bfloat16>(params, stream)
                                               : launch_mla_decode_combine<__half>(params, stream));
}

}  // namespace mlakit::detail
