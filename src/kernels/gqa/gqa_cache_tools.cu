// The GQA cache tools' kernels (include/mlakit/gqa_cache.h). Each warp owns one cache row at a
// time and walks rows grid-stride; every row that is written is written by append_row_warp
// (cache_append_row.cuh), the routine the decode's fused append calls, so quantize, append
// and the decode store the same bytes, and the CPU tools (reference/gqa_cache_ref.cpp, the
// same arithmetic from common/) store them too.
//   quantize:   row (block, page row, kv head) of the dense tensor -> the cache's row
//               (append_row_warp without rotation);
//   dequantize: lane l converts D / 32 stored values: float(stored) * scale (one float
//               product), rounded to nearest even to the dense dtype;
//   append:     row (i, t, kv head) of k_new / v_new -> position L - s_q + t of entry i, k
//               rotated; finished entries, negative positions, positions past the table and
//               block ids outside [0, num_blocks) are skipped (nothing is dereferenced).
#include <algorithm>
#include <type_traits>

#include "kernels/gqa/cache_append_row.cuh"
#include "kernels/gqa/gqa_cache_tools_launch.h"

namespace mlakit::detail {
namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kThreads = kWarpsPerBlock * 32;
constexpr int64_t kMaxGrid = int64_t{1} << 16;  // CTAs; more rows are walked grid-stride

struct CacheRow {
  int64_t block, page_row;
  int hk;
};

// Row r of [num_blocks, page_size, h_kv] in row-major order.
__device__ __forceinline__ CacheRow cache_row(int64_t r, int64_t page_size, int h_kv) {
  const int64_t slot = r / h_kv;
  return {slot / page_size, slot % page_size, static_cast<int>(r - slot * h_kv)};
}

__device__ __forceinline__ int64_t first_warp() {
  return static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
}
__device__ __forceinline__ int64_t warp_stride() { return static_cast<int64_t>(gridDim.x) * kWarpsPerBlock; }

template <typename Elem, typename CacheT, int D>
__global__ void __launch_bounds__(kThreads) quantize_kernel(const GqaCacheConvertParams p) {
  const int64_t rows = p.num_blocks * p.page_size * p.h_kv;
  const GqaRope no_rope{0, 0, 0.0};
  for (int64_t r = first_warp(); r < rows; r += warp_stride()) {
    const CacheRow c = cache_row(r, p.page_size, p.h_kv);
    const Elem* src = static_cast<const Elem*>(p.dense) + c.block * p.dense_stride_block +
                      c.page_row * p.dense_stride_page + c.hk * p.dense_stride_h;
    append_row_warp<Elem, CacheT, D>(src, no_rope, false, 0, p.cache, c.block, c.page_row, c.hk, threadIdx.x % 32);
  }
}

template <typename Elem, typename CacheT, int D>
__global__ void __launch_bounds__(kThreads) dequantize_kernel(const GqaCacheConvertParams p) {
  constexpr int kPerLane = D / 32;
  const int64_t rows = p.num_blocks * p.page_size * p.h_kv;
  const int first = (threadIdx.x % 32) * kPerLane;
  for (int64_t r = first_warp(); r < rows; r += warp_stride()) {
    const CacheRow c = cache_row(r, p.page_size, p.h_kv);
    const float scale = p.cache.scale_kind == GqaScaleKind::kPerTensor
                            ? p.cache.scale[0]
                            : p.cache.scale[p.cache.scale_index(c.block, c.page_row, c.hk)];
    alignas(16) CacheT stored[kPerLane];
    copy_chunk<CacheT, kPerLane>(
        stored, static_cast<const CacheT*>(p.cache.values) + p.cache.row(c.block, c.page_row, c.hk) + first);
    alignas(16) Elem out[kPerLane];
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      out[i] = GqaCacheCodec<Elem>::encode(__fmul_rn(GqaCacheCodec<CacheT>::decode(stored[i]), scale), 0.f);
    }
    Elem* dst = static_cast<Elem*>(p.dense) + c.block * p.dense_stride_block + c.page_row * p.dense_stride_page +
                c.hk * p.dense_stride_h;
    copy_chunk<Elem, kPerLane>(dst + first, out);
  }
}

template <typename Elem, typename CacheT, int D>
__global__ void __launch_bounds__(kThreads) append_kernel(const GqaCacheAppendParams p) {
  const int64_t rows = p.b * p.s_q * p.h_kv;
  for (int64_t r = first_warp(); r < rows; r += warp_stride()) {
    // Row r = ((i * s_q) + t) * h_kv + hk; everything below is warp-uniform.
    const int64_t token = r / p.h_kv, i = token / p.s_q;
    const int hk = static_cast<int>(r - token * p.h_kv), t = static_cast<int>(token - i * p.s_q);
    if (p.finished != nullptr && p.finished[i] != 0) continue;
    const int64_t pos = static_cast<int64_t>(p.cache_seqlens[i]) - p.s_q + t;
    if (pos < 0) continue;
    const int64_t logical = pos / p.pages.page_size;
    if (logical >= p.pages.max_blocks_per_seq) continue;
    const int64_t block = p.pages.block_table[i * p.pages.block_table_stride_b + logical];
    if (block < 0 || block >= p.pages.num_blocks) continue;
    const int64_t page_row = pos - logical * p.pages.page_size;
    const Elem* k =
        static_cast<const Elem*>(p.rows.k_new) + i * p.rows.k_stride_b + t * p.rows.k_stride_s + hk * p.rows.k_stride_h;
    const Elem* v =
        static_cast<const Elem*>(p.rows.v_new) + i * p.rows.v_stride_b + t * p.rows.v_stride_s + hk * p.rows.v_stride_h;
    append_row_warp<Elem, CacheT, D>(k, p.rope, true, pos, p.k_cache, block, page_row, hk, threadIdx.x % 32);
    append_row_warp<Elem, CacheT, D>(v, p.rope, false, pos, p.v_cache, block, page_row, hk, threadIdx.x % 32);
  }
}

unsigned grid_for(int64_t rows) {
  return static_cast<unsigned>(std::min((rows + kWarpsPerBlock - 1) / kWarpsPerBlock, kMaxGrid));
}

// Calls launch(std::integral_constant<int, D>) for the runtime head dim d (64, 128 or 256,
// validated by the host); nothing for no rows.
template <typename Launch>
cudaError_t for_head_dim(int d, int64_t rows, Launch launch) {
  if (rows == 0) return cudaSuccess;
  switch (d) {
    case 64:
      launch(std::integral_constant<int, 64>{});
      break;
    case 128:
      launch(std::integral_constant<int, 128>{});
      break;
    case 256:
      launch(std::integral_constant<int, 256>{});
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace

template <typename Elem, typename CacheT>
cudaError_t launch_quantize_gqa_cache(const GqaCacheConvertParams& p, cudaStream_t stream) {
  const int64_t rows = p.num_blocks * p.page_size * p.h_kv;
  return for_head_dim(p.d, rows, [&](auto d) {
    quantize_kernel<Elem, CacheT, decltype(d)::value><<<grid_for(rows), kThreads, 0, stream>>>(p);
  });
}

template <typename Elem, typename CacheT>
cudaError_t launch_dequantize_gqa_cache(const GqaCacheConvertParams& p, cudaStream_t stream) {
  const int64_t rows = p.num_blocks * p.page_size * p.h_kv;
  return for_head_dim(p.d, rows, [&](auto d) {
    dequantize_kernel<Elem, CacheT, decltype(d)::value><<<grid_for(rows), kThreads, 0, stream>>>(p);
  });
}

template <typename Elem, typename CacheT>
cudaError_t launch_gqa_cache_append(const GqaCacheAppendParams& p, cudaStream_t stream) {
  const int64_t rows = p.b * p.s_q * p.h_kv;
  return for_head_dim(p.d, rows, [&](auto d) {
    append_kernel<Elem, CacheT, decltype(d)::value><<<grid_for(rows), kThreads, 0, stream>>>(p);
  });
}

// The instances the dispatch uses (gqa_cache_dispatch.cu).
template cudaError_t launch_quantize_gqa_cache<__nv_bfloat16, int8_t>(const GqaCacheConvertParams&, cudaStream_t);
template cudaError_t launch_quantize_gqa_cache<__nv_bfloat16, __nv_fp8_e4m3>(const GqaCacheConvertParams&,
                                                                             cudaStream_t);
template cudaError_t launch_quantize_gqa_cache<__half, int8_t>(const GqaCacheConvertParams&, cudaStream_t);
template cudaError_t launch_quantize_gqa_cache<__half, __nv_fp8_e4m3>(const GqaCacheConvertParams&, cudaStream_t);

template cudaError_t launch_dequantize_gqa_cache<__nv_bfloat16, int8_t>(const GqaCacheConvertParams&, cudaStream_t);
template cudaError_t launch_dequantize_gqa_cache<__nv_bfloat16, __nv_fp8_e4m3>(const GqaCacheConvertParams&,
                                                                               cudaStream_t);
template cudaError_t launch_dequantize_gqa_cache<__half, int8_t>(const GqaCacheConvertParams&, cudaStream_t);
template cudaError_t launch_dequantize_gqa_cache<__half, __nv_fp8_e4m3>(const GqaCacheConvertParams&, cudaStream_t);

template cudaError_t launch_gqa_cache_append<__nv_bfloat16, __nv_bfloat16>(const GqaCacheAppendParams&, cudaStream_t);
template cudaError_t launch_gqa_cache_append<__nv_bfloat16, int8_t>(const GqaCacheAppendParams&, cudaStream_t);
template cudaError_t launch_gqa_cache_append<__nv_bfloat16, __nv_fp8_e4m3>(const GqaCacheAppendParams&, cudaStream_t);
template cudaError_t launch_gqa_cache_append<__half, __half>(const GqaCacheAppendParams&, cudaStream_t);
template cudaError_t launch_gqa_cache_append<__half, int8_t>(const GqaCacheAppendParams&, cudaStream_t);
template cudaError_t launch_gqa_cache_append<__half, __nv_fp8_e4m3>(const GqaCacheAppendParams&, cudaStream_t);

}  // namespace mlakit::detail
