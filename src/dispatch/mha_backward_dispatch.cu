#include "dispatch/mha_backward_dispatch.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <string>

#include "dispatch/cuda_status.h"
#include "dispatch/mha_prefill_dispatch.h"
#include "kernels/portable/launch.h"
#include "kernels/sm90/launch.h"

namespace mlakit::detail {
namespace {

constexpr const char* kOp = "mha_prefill_backward";

// The forward's arguments inside the backward's: q, k, v, the sequences, the forward's out
// and lse (read here).
MhaPrefillArgs forward_args(const MhaPrefillBackwardArgs& a) {
  return MhaPrefillArgs{
      .q = a.q,
      .k = a.k,
      .v = a.v,
      .cu_seqlens_q = a.cu_seqlens_q,
      .cu_seqlens_k = a.cu_seqlens_k,
      .max_seqlen_q = a.max_seqlen_q,
      .max_seqlen_k = a.max_seqlen_k,
      .causal = a.causal,
      .softmax_scale = a.softmax_scale,
      .out = a.out,
      .lse = a.lse,
  };
}

MhaBackwardParams mha_backward_params(const MhaPrefillBackwardArgs& a, const MhaPrefillShape& s, float scale,
                                      const MhaBackwardWorkspace& layout, bool bulk_dq, void* workspace) {
  MhaBackwardParams p;
  static_cast<MhaPrefillParams&>(p) = mha_prefill_params(forward_args(a), s, scale);
  auto* base = static_cast<unsigned char*>(workspace);  // null only when layout.bytes is 0 (offsets 0)
  p.dout = a.dout.data;
  p.dq = a.dq.data;
  p.dk = a.dk.data;
  p.dv = a.dv.data;
  p.dq_accum = reinterpret_cast<float*>(base + layout.dq_accum_offset);
  p.row_dot = reinterpret_cast<float*>(base + layout.row_dot_offset);
  p.counters = layout.counters > 0 ? reinterpret_cast<int32_t*>(base + layout.counters_offset) : nullptr;
  p.num_counters = layout.counters;
  p.query_tiles = mha_backward_query_tiles(a.max_seqlen_q, s.d_qk);
  p.dout_stride_t = a.dout.stride[0];
  p.dout_stride_h = a.dout.stride[1];
  p.dq_stride_t = a.dq.stride[0];
  p.dq_stride_h = a.dq.stride[1];
  p.dk_stride_t = a.dk.stride[0];
  p.dk_stride_h = a.dk.stride[1];
  p.dv_stride_t = a.dv.stride[0];
  p.dv_stride_h = a.dv.stride[1];
  p.deterministic = a.deterministic;
  p.bulk_dq = bulk_dq;
  return p;
}

// The Hopper main kernel's tail split (common/mha_backward_tiling.h) over params' key tiles,
// its pieces' dK and dV in the workspace; none where the layout has no room for one.
void plan_tail_split(const MhaBackwardWorkspace& layout, void* workspace, MhaBackwardParams* params) {
  MhaBackwardParams& p = *params;
  const int64_t key_tiles = mha_tiles_of(p.max_seqlen_k, kMhaBackwardSm90KeyRows);
  const int64_t tiles = key_tiles * p.h_kv * p.b;
  const MhaPrefillTailSplit split =
      layout.partial_kv_slots > 0
          ? mha_prefill_tail_split(tiles, mha_backward_tail_steps(p.heads_per_kv, p.max_seqlen_q), p.causal, p.sm_count)
          : MhaPrefillTailSplit{tiles, 0, 1};
  p.whole_tiles = split.whole_tiles;
  p.tail_tiles = split.tail_tiles;
  p.tail_pieces = split.pieces;
  if (split.tail_tiles > 0) {
    p.partial_kv = reinterpret_cast<float*>(static_cast<unsigned char*>(workspace) + layout.partial_kv_offset);
  }
}

// maps: the Hopper main kernel's (its dq_accum in query-tile slots, zeroed by the row kernel
// beside D and converted by its own kernel), or null for the portable one.
template <typename Elem>
Status run(const MhaBackwardParams& params, const MhaBackwardMaps* maps, cudaStream_t stream) {
  MLAKIT_RETURN_IF_ERROR(cuda_status(kOp, launch_mha_backward_preprocess<Elem>(params, stream)));
  if (maps == nullptr) {
    MLAKIT_RETURN_IF_ERROR(cuda_status(kOp, launch_mha_backward_main_portable<Elem>(params, stream)));
    return cuda_status(kOp, launch_mha_backward_postprocess<Elem>(params, stream));
  }
  MLAKIT_RETURN_IF_ERROR(cuda_status(kOp, launch_mha_backward_sm90<Elem>(params, *maps, stream)));
  return cuda_status(kOp, launch_mha_backward_sm90_dq_convert<Elem>(params, stream));
}

}  // namespace

Status dispatch_mha_backward(const MhaPrefillBackwardArgs& args, const MhaPrefillShape& shape, float softmax_scale,
                             const MhaBackwardWorkspace& layout, bool bulk_dq, bool hopper, int sm_count,
                             void* workspace, cudaStream_t stream) {
  MhaBackwardParams params = mha_backward_params(args, shape, softmax_scale, layout, bulk_dq, workspace);
  const bool bf16 = args.q.dtype == DType::kBF16;
  const bool required = args.kernel == MlaKernel::kSm90;
  // The workspace holds the Hopper kernel's dQ slots only where they stay small beside the rows
  // (common/mha_backward_tiling.h); without query rows it needs none.
  const bool slots = layout.dq_slots > 0 || shape.total_q == 0;
  const bool served =
      slots &&
      mha_sm90_backward_supported(shape.d_qk, shape.d_v, shape.h_kv, static_cast<int>(std::min<int64_t>(shape.b, 65536)));
  if (required && !served) {
    return Status(StatusCode::kUnsupported,
                  std::string(kOp) + ": kernel: kSm90 serves (d_qk, d_v) = (64, 64), (128, 128) and (192, 128), h_kv and b up to " +
                      "65535, and batches whose 64-row query tiles per sequence take at most twice the rows' dQ accumulator or 64 MiB " +
                      "(got d (" + std::to_string(shape.d_qk) + ", " + std::to_string(shape.d_v) + "), h_kv " +
                      std::to_string(shape.h_kv) + ", b " + std::to_string(shape.b) + ", total_q " +
                      std::to_string(shape.total_q) + "): expected kAuto or kPortable");
  }
  // kAuto: the Hopper main kernel where it serves the problem and its TMA can read the layout
  // (16-byte rows of q, k, v, dout), the portable one otherwise.
  MhaBackwardMaps maps;
  const MhaBackwardMaps* sm90 = nullptr;
  if (required || (args.kernel == MlaKernel::kAuto && hopper && served)) {
    std::string why;
    if (make_mha_backward_maps(params, bf16, &maps, &why)) {
      sm90 = &maps;
      params.dq_tiled = true;  // the workspace has room for the slots wherever the kernel serves the dims
      params.dq_slots = layout.dq_slots;
      params.sm_count = sm_count;
      plan_tail_split(layout, workspace, &params);
    } else if (required) {
      return Status(StatusCode::kInvalidArgument, std::string(kOp) + ": kernel: kSm90 cannot take this layout: " + why);
    }
  }
  return bf16 ? run<__nv_bfloat16>(params, sm90, stream) : run<__half>(params, sm90, stream);
}

}  // namespace mlakit::detail
