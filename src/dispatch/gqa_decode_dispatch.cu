#include "dispatch/gqa_decode_dispatch.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "common/rotary.h"
#include "dispatch/cuda_status.h"
#include "dispatch/planned_decode.h"
#include "kernels/gqa/gqa_decode_launch.h"

namespace mlakit::detail {
namespace {

SeqLengths scheduled_lengths(const GqaDecodePlan& plan, const int32_t* cache_seqlens) {
  return SeqLengths{cache_seqlens, 0, 1, gqa_scheduled_cap(plan.problem)};
}

GqaScaleKind scale_kind(GqaScaleLayout layout) {
  switch (layout) {
    case GqaScaleLayout::kPerToken:
      return GqaScaleKind::kPerToken;
    case GqaScaleLayout::kPerTensor:
      return GqaScaleKind::kPerTensor;
    default:
      return GqaScaleKind::kNone;
  }
}

GqaCacheView cache_view(const GqaPagedCache& c, GqaScaleLayout layout) {
  const bool per_token = layout == GqaScaleLayout::kPerToken;
  return GqaCacheView{
      .values = c.values.data,
      .scale = static_cast<float*>(c.scale.data),
      .stride_block = c.values.stride[0],
      .stride_page = c.values.stride[1],
      .stride_h = c.values.stride[2],
      .scale_stride_block = per_token ? c.scale.stride[0] : 0,
      .scale_stride_page = per_token ? c.scale.stride[1] : 0,
      .scale_stride_h = per_token ? c.scale.stride[2] : 0,
      .scale_kind = scale_kind(layout),
  };
}

GqaDecodeParams make_params(const GqaDecodeArgs& a, const GqaDecodeShape& shape, const GqaDecodePlan& plan,
                            float softmax_scale) {
  const GqaDecodeProblem& pr = plan.problem;
  const int heads_per_kv = pr.h_q / pr.h_kv;
  const auto* seqlens = static_cast<const int32_t*>(a.cache_seqlens.data);
  GqaDecodeParams p{
      .core =
          {
              .lengths = scheduled_lengths(plan, seqlens),
              .b = pr.b,
              .s_q = pr.s_q,
              .h_q = pr.h_q,
              .h_kv = pr.h_kv,
              .heads_per_kv = heads_per_kv,
              .rows = static_cast<int>(gqa_decode_rows(pr)),
              .scale_log2 = 0.f,  // the GQA kernel applies `scale` in natural units (soft-cap, ALiBi)
              .causal = a.causal && pr.s_q > 1,
              .d_qk = pr.d,
              .skip = static_cast<const uint8_t*>(a.finished.data),
          },
      .k_cache = cache_view(a.k_cache, shape.scale_layout),
      .v_cache = cache_view(a.v_cache, shape.scale_layout),
      .pages =
          {
              .block_table = static_cast<const int32_t*>(a.block_table.data),
              .block_table_stride_b = a.block_table.stride[0],
              .page_size = static_cast<int>(shape.page_size),
              .max_blocks_per_seq = shape.max_blocks_per_seq,
              .num_blocks = shape.num_blocks,
              .page_divisor = FastDivisor(static_cast<uint32_t>(shape.page_size)),
          },
      .append =
          {
              .k_new = a.k_new.data,
              .v_new = a.v_new.data,
              .k_stride_b = shape.append ? a.k_new.stride[0] : 0,
              .k_stride_s = shape.append ? a.k_new.stride[1] : 0,
              .k_stride_h = shape.append ? a.k_new.stride[2] : 0,
              .v_stride_b = shape.append ? a.v_new.stride[0] : 0,
              .v_stride_s = shape.append ? a.v_new.stride[1] : 0,
              .v_stride_h = shape.append ? a.v_new.stride[2] : 0,
          },
      .rope =
          {
              .style = shape.rotary_dim > 0 ? static_cast<int>(a.rope.style) : 0,
              .rotary_dim = shape.rotary_dim,
              .log_theta = rope_log_theta(a.rope.theta),
          },
      .cache_seqlens = seqlens,
      .alibi_slopes = static_cast<const float*>(a.alibi_slopes.data),
      .finished = static_cast<const uint8_t*>(a.finished.data),
      .d = pr.d,
      .window = pr.window,
      .softcap = a.softcap,
      .scale = softmax_scale,
      .schedule = plan_schedule(plan),
  };
  attach_io(a.q, a.out, a.lse, &p.core);
  if (a.lse.empty()) p.core.lse = nullptr;
  return p;
}

GqaCacheFormat cache_format(DType dtype) {
  switch (dtype) {
    case DType::kInt8:
      return GqaCacheFormat::kInt8;
    case DType::kFP8E4M3:
      return GqaCacheFormat::kFp8;
    default:
      return GqaCacheFormat::kElem;
  }
}

template <typename Elem, int kD>
cudaError_t combine(const GqaDecodeParams& params, cudaStream_t stream) {
  return launch_mla_decode_combine<Elem, kD>(CombineParams{params.core, params.schedule}, stream);
}

template <typename Elem>
cudaError_t launch(const GqaDecodeParams& params, GqaCacheFormat format, cudaStream_t stream) {
  cudaError_t err = launch_gqa_decode<Elem>(params, format, stream);
  // No rows (h_q 0): the attention kernel only appended; there is nothing to combine.
  if (err != cudaSuccess || params.core.rows == 0) return err;
  switch (params.d) {
    case 64:
      return combine<Elem, 64>(params, stream);
    case 128:
      return combine<Elem, 128>(params, stream);
    default:
      return combine<Elem, 256>(params, stream);
  }
}

}  // namespace

Status dispatch_gqa_decode_plan(const GqaDecodePlan& plan, const int32_t* cache_seqlens, cudaStream_t stream) {
  return cuda_status("gqa_decode_plan", launch_plan(plan, scheduled_lengths(plan, cache_seqlens), stream));
}

Status dispatch_gqa_decode(const GqaDecodeArgs& a, const GqaDecodeShape& shape, const GqaDecodePlan& plan,
                           float softmax_scale, cudaStream_t stream) {
  const GqaDecodeParams params = make_params(a, shape, plan, softmax_scale);
  const GqaCacheFormat format = cache_format(shape.cache_dtype);
  return cuda_status("gqa_decode", a.q.dtype == DType::kBF16 ? launch<__nv_bfloat16>(params, format, stream)
                                                             : launch<__half>(params, format, stream));
}

}  // namespace mlakit::detail
