#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

#include "common/rotary.h"
#include "dispatch/cuda_status.h"
#include "dispatch/gqa_cache_dispatch.h"
#include "kernels/gqa/gqa_cache_tools_launch.h"

namespace mlakit::detail {
namespace {

// The kernels' view of a validated cache: its strides, and its scale layout from the scale's
// rank (none, [1] per tensor, [num_blocks, page_size, h_kv] per token).
GqaCacheView cache_view(const GqaPagedCache& c) {
  GqaCacheView v{};
  v.values = c.values.data;
  v.stride_block = c.values.stride[0];
  v.stride_page = c.values.stride[1];
  v.stride_h = c.values.stride[2];
  v.scale = static_cast<float*>(c.scale.data);
  if (c.scale.empty()) {
    v.scale_kind = GqaScaleKind::kNone;
  } else if (c.scale.rank == 1) {
    v.scale_kind = GqaScaleKind::kPerTensor;
  } else {
    v.scale_kind = GqaScaleKind::kPerToken;
    v.scale_stride_block = c.scale.stride[0];
    v.scale_stride_page = c.scale.stride[1];
    v.scale_stride_h = c.scale.stride[2];
  }
  return v;
}

GqaCacheConvertParams convert_params(const TensorRef& dense, const GqaPagedCache& cache) {
  return GqaCacheConvertParams{.dense = dense.data,
                               .dense_stride_block = dense.stride[0],
                               .dense_stride_page = dense.stride[1],
                               .dense_stride_h = dense.stride[2],
                               .cache = cache_view(cache),
                               .num_blocks = dense.shape[0],
                               .page_size = dense.shape[1],
                               .h_kv = static_cast<int>(dense.shape[2]),
                               .d = static_cast<int>(dense.shape[3])};
}

// The launch of Launcher<Elem, CacheT> for the runtime dtypes: Elem from the 16-bit dtype,
// CacheT from the cache's (Elem itself, int8 or fp8).
template <template <typename, typename> class Launcher, typename Params>
cudaError_t launch_for_dtypes(DType elem, DType cache, const Params& p, cudaStream_t stream) {
  auto with = [&](auto elem_tag) -> cudaError_t {
    using Elem = decltype(elem_tag);
    switch (cache) {
      case DType::kInt8:
        return Launcher<Elem, int8_t>::run(p, stream);
      case DType::kFP8E4M3:
        return Launcher<Elem, __nv_fp8_e4m3>::run(p, stream);
      default:
        return Launcher<Elem, Elem>::run(p, stream);
    }
  };
  return elem == DType::kBF16 ? with(__nv_bfloat16{}) : with(__half{});
}

template <typename Elem, typename CacheT>
struct Quantize {
  static cudaError_t run(const GqaCacheConvertParams& p, cudaStream_t s) {
    if constexpr (std::is_same_v<Elem, CacheT>) {
      return cudaErrorInvalidValue;  // a 16-bit "cache": refused by the validation
    } else {
      return launch_quantize_gqa_cache<Elem, CacheT>(p, s);
    }
  }
};
template <typename Elem, typename CacheT>
struct Dequantize {
  static cudaError_t run(const GqaCacheConvertParams& p, cudaStream_t s) {
    if constexpr (std::is_same_v<Elem, CacheT>) {
      return cudaErrorInvalidValue;  // a 16-bit "cache": refused by the validation
    } else {
      return launch_dequantize_gqa_cache<Elem, CacheT>(p, s);
    }
  }
};
template <typename Elem, typename CacheT>
struct Append {
  static cudaError_t run(const GqaCacheAppendParams& p, cudaStream_t s) {
    return launch_gqa_cache_append<Elem, CacheT>(p, s);
  }
};

}  // namespace

Status dispatch_quantize_gqa_cache(const char* op, const TensorRef& src, const GqaPagedCache& dst,
                                   cudaStream_t stream) {
  return cuda_status(op, launch_for_dtypes<Quantize>(src.dtype, dst.values.dtype, convert_params(src, dst), stream));
}

Status dispatch_dequantize_gqa_cache(const char* op, const GqaPagedCache& src, const TensorRef& dst,
                                     cudaStream_t stream) {
  return cuda_status(op, launch_for_dtypes<Dequantize>(dst.dtype, src.values.dtype, convert_params(dst, src), stream));
}

Status dispatch_gqa_cache_append(const char* op, const GqaCacheAppendArgs& a, int rotary_dim, cudaStream_t stream) {
  const TensorRef& cache = a.k_cache.values;
  const int64_t page_size = cache.shape[1];
  const GqaCacheAppendParams p{.rows = {.k_new = a.k_new.data,
                                        .v_new = a.v_new.data,
                                        .k_stride_b = a.k_new.stride[0],
                                        .k_stride_s = a.k_new.stride[1],
                                        .k_stride_h = a.k_new.stride[2],
                                        .v_stride_b = a.v_new.stride[0],
                                        .v_stride_s = a.v_new.stride[1],
                                        .v_stride_h = a.v_new.stride[2]},
                               .k_cache = cache_view(a.k_cache),
                               .v_cache = cache_view(a.v_cache),
                               .pages = {.block_table = static_cast<const int32_t*>(a.block_table.data),
                                         .block_table_stride_b = a.block_table.stride[0],
                                         .page_size = static_cast<int>(page_size),
                                         .max_blocks_per_seq = static_cast<int>(a.block_table.shape[1]),
                                         .num_blocks = cache.shape[0],
                                         .page_divisor = FastDivisor(static_cast<uint32_t>(page_size))},
                               .rope = {.style = static_cast<int>(a.rope.style),
                                        .rotary_dim = rotary_dim,
                                        .log_theta = rope_log_theta(a.rope.theta)},
                               .cache_seqlens = static_cast<const int32_t*>(a.cache_seqlens.data),
                               .finished = static_cast<const uint8_t*>(a.finished.data),
                               .b = a.k_new.shape[0],
                               .s_q = static_cast<int>(a.k_new.shape[1]),
                               .h_kv = static_cast<int>(a.k_new.shape[2]),
                               .d = static_cast<int>(a.k_new.shape[3])};
  return cuda_status(op, launch_for_dtypes<Append>(a.k_new.dtype, cache.dtype, p, stream));
}

}  // namespace mlakit::detail
