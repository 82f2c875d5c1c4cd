// The MHA prefill backward's row kernels, before and after the main kernel
// (mha_backward_kernel.cuh): one warp per (query row, query head) of the rows inside a
// sequence, [0, cu_seqlens_q[b]), read on the device.
//   preprocess:  row_dot[h][t] = sum_d dout[t, h, d] * out[t, h, d] (float32), dq_accum[t, h, :]
//                = 0 (or, where the Hopper kernel's slots hold it (dq_tiled), every slot = 0:
//                one pass beside D instead of a memset of its own), and every deterministic
//                counter = 0;
//   postprocess: dq[t, h, :] = dq_accum[t, h, :] * softmax_scale in q's dtype.
// Memory-bound and small beside the main kernel (it reads each row once).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "common/mha_backward_tiling.h"
#include "device/numeric.cuh"
#include "kernels/portable/launch.h"

namespace mlakit::detail {
namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kThreads = kWarpsPerBlock * 32;
constexpr int64_t kMaxBlocks = 8192;  // the rest is walked by the warps

// Query rows inside a sequence: cu_seqlens_q[b] clamped to the tensor (a prefix sum past it
// breaks the data rules and must not send a write outside the workspace).
__device__ int64_t rows_in_sequences(const MhaBackwardParams& p) {
  const int64_t end = p.cu_seqlens_q[p.b];
  return end < 0 ? 0 : (end < p.total_q ? end : p.total_q);
}

__device__ float warp_sum(float x) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

// Calls row(r, t, h) in each warp for the (query row t, head h) pairs inside a sequence, r = t *
// h_q + h (the row of dq_accum), walking the grid's warps over them.
template <typename Row>
__device__ void for_each_query_row(const MhaBackwardParams& p, Row row) {
  const int64_t first_warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int64_t num_warps = static_cast<int64_t>(gridDim.x) * blockDim.x / 32;
  const int64_t rows = rows_in_sequences(p) * p.h_q;
  for (int64_t r = first_warp; r < rows; r += num_warps) row(r, r / p.h_q, static_cast<int>(r % p.h_q));
}

// The Hopper kernel's dq_accum slots (common/mha_backward_tiling.h) in float4s; 0 without them.
__host__ __device__ int64_t slot_float4s(const MhaBackwardParams& p) {
  return p.dq_tiled ? mha_backward_dq_block(p.dq_slots, 0, p.h_q, p.d_qk) / 4 : 0;
}

template <typename Elem>
__global__ void __launch_bounds__(kThreads) mha_backward_preprocess_kernel(const __grid_constant__ MhaBackwardParams p) {
  using Ops = device::ElemOps<Elem>;
  const int lane = threadIdx.x % 32;
  for_each_query_row(p, [&](int64_t r, int64_t t, int h) {
    const auto* o = reinterpret_cast<const uint32_t*>(static_cast<const Elem*>(p.out) + t * p.out_stride_t +
                                                      h * p.out_stride_h);
    const auto* g = reinterpret_cast<const uint32_t*>(static_cast<const Elem*>(p.dout) + t * p.dout_stride_t +
                                                      h * p.dout_stride_h);
    // Four pairs of the row per lane and step, loaded before any is used (d_v <= 256: one step).
    float sum = 0.f;
    for (int base = 0; base < p.d_v / 2; base += 4 * 32) {
      uint32_t oa[4], ga[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int i = base + lane + 32 * j;
        oa[j] = i < p.d_v / 2 ? o[i] : 0u;
        ga[j] = i < p.d_v / 2 ? g[i] : 0u;
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float2 a = Ops::unpack(oa[j]), b = Ops::unpack(ga[j]);
        sum += a.x * b.x + a.y * b.y;
      }
    }
    sum = warp_sum(sum);
    if (lane == 0) p.row_dot[h * p.total_q + t] = sum;
    if (p.dq_tiled) return;
    auto* acc = reinterpret_cast<float4*>(p.dq_accum + r * p.d_qk);
    for (int i = lane; i < p.d_qk / 4; i += 32) acc[i] = make_float4(0.f, 0.f, 0.f, 0.f);
  });
  const int64_t first_thread = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t num_threads = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = first_thread; i < p.num_counters; i += num_threads) p.counters[i] = 0;
  if (p.dq_tiled) {
    auto* slots = reinterpret_cast<float4*>(p.dq_accum);  // 256-byte aligned, whole float4s
    for (int64_t i = first_thread; i < slot_float4s(p); i += num_threads) slots[i] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
}

template <typename Elem>
__global__ void __launch_bounds__(kThreads) mha_backward_postprocess_kernel(const __grid_constant__ MhaBackwardParams p) {
  using Ops = device::ElemOps<Elem>;
  const int lane = threadIdx.x % 32;
  for_each_query_row(p, [&](int64_t r, int64_t t, int h) {
    const auto* acc = reinterpret_cast<const float2*>(p.dq_accum + r * p.d_qk);
    auto* dq = reinterpret_cast<uint32_t*>(static_cast<Elem*>(p.dq) + t * p.dq_stride_t + h * p.dq_stride_h);
    for (int i = lane; i < p.d_qk / 2; i += 32) {
      const float2 x = acc[i];
      dq[i] = Ops::pack(x.x * p.softmax_scale, x.y * p.softmax_scale);
    }
  });
}

// Blocks for `rows` warp rows and `threads` threads of per-element work (counters, slots), at
// least one block, at most kMaxBlocks (the kernels' loops walk the rest).
unsigned blocks_for(int64_t rows, int64_t threads) {
  const int64_t by_rows = (rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
  const int64_t by_threads = (threads + kThreads - 1) / kThreads;
  return static_cast<unsigned>(std::clamp<int64_t>(std::max(by_rows, by_threads), 1, kMaxBlocks));
}

}  // namespace

template <typename Elem>
cudaError_t launch_mha_backward_preprocess(const MhaBackwardParams& p, cudaStream_t stream) {
  // Threads for the rows' warps, the counters and the slots (8 float4s a thread, more where the
  // grid reaches kMaxBlocks).
  const int64_t flat = std::max(p.num_counters, (slot_float4s(p) + 7) / 8);
  mha_backward_preprocess_kernel<Elem><<<blocks_for(p.total_q * p.h_q, flat), kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

template <typename Elem>
cudaError_t launch_mha_backward_postprocess(const MhaBackwardParams& p, cudaStream_t stream) {
  if (p.total_q == 0 || p.h_q == 0) return cudaSuccess;  // no dq row
  mha_backward_postprocess_kernel<Elem><<<blocks_for(p.total_q * p.h_q, 0), kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

template cudaError_t launch_mha_backward_preprocess<__nv_bfloat16>(const MhaBackwardParams&, cudaStream_t);
template cudaError_t launch_mha_backward_preprocess<__half>(const MhaBackwardParams&, cudaStream_t);
template cudaError_t launch_mha_backward_postprocess<__nv_bfloat16>(const MhaBackwardParams&, cudaStream_t);
template cudaError_t launch_mha_backward_postprocess<__half>(const MhaBackwardParams&, cudaStream_t);

}  // namespace mlakit::detail
