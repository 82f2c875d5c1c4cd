// The traced copies of the Hopper dense and sparse FP8 decodes for mlakit-decode-timeline: compiled with
// MLAKIT_SM90_TIMELINE and every namespace renamed (-Dmlakit=mlakit_timeline, set on this file
// only), so it shares no symbol with the library's kernel. Its entry point has C linkage and
// untyped pointers: the caller (decode_timeline.cpp) fills the parameters and the timeline
// buffer through the library's own headers, whose types have the same layout here.
#include <cuda_bf16.h>

#include "kernels/sm90/launch.h"
#include "kernels/sm90/mla_decode_sm90_kernel.cuh"
#include "kernels/sm90/mla_sparse_decode_sm90_kernel.cuh"

#ifndef MLAKIT_SM90_TIMELINE
#error "decode_timeline_kernel.cu needs MLAKIT_SM90_TIMELINE (set by its CMake target)"
#endif

namespace {

namespace d = mlakit::detail;
using C = d::sm90::Sm90MlaConfig;

// Copies `timeline` (TimelineBuffer) to the kernels' global and lets `kernel` have the decode's
// shared memory; the grid of `params`: (row tiles, h_kv, parts).
template <typename Kernel, typename Params>
cudaError_t prepare(Kernel kernel, const Params& p, const void* timeline, cudaStream_t stream, dim3* grid) {
  cudaError_t err = cudaMemcpyToSymbolAsync(d::sm90::g_timeline, timeline, sizeof(d::sm90::TimelineBuffer), 0,
                                            cudaMemcpyHostToDevice, stream);
  if (err != cudaSuccess) return err;
  *grid = dim3((p.core.rows + C::kRows - 1) / C::kRows, p.core.h_kv, p.schedule.num_parts);
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, d::sm90::kSm90SmemBytes);
}

}  // namespace

// Launches the traced bf16 kernel (no combine) on `stream` with `params` (DenseDecodeParams)
// and `timeline` (TimelineBuffer, copied to the kernel's global before the launch).
extern "C" cudaError_t traced_dense_decode(const void* params, const CUtensorMap* kv_map, int box_rows,
                                           const CUtensorMap* q_map, const void* timeline, cudaStream_t stream) {
  const auto& p = *static_cast<const d::DenseDecodeParams*>(params);
  auto kernel = &d::sm90::mla_decode_sm90_kernel<__nv_bfloat16>;
  dim3 grid;
  const cudaError_t err = prepare(kernel, p, timeline, stream, &grid);
  if (err != cudaSuccess) return err;
  kernel<<<grid, C::kThreads, d::sm90::kSm90SmemBytes, stream>>>(p, *kv_map, box_rows,
                                                                   d::map_or_empty(q_map), q_map != nullptr);
  return cudaGetLastError();
}

// The same for the sparse FP8 decode (params of make_sparse_decode_params; h_kv 1).
extern "C" cudaError_t traced_sparse_decode(const void* params, const CUtensorMap* q_map, const void* timeline,
                                            cudaStream_t stream) {
  const auto& p = *static_cast<const d::SparseDecodeParams*>(params);
  auto kernel = &d::sm90::mla_sparse_decode_sm90_kernel<d::Fp8TokenLayout::kV32>;
  dim3 grid;
  const cudaError_t err = prepare(kernel, p, timeline, stream, &grid);
  if (err != cudaSuccess) return err;
  kernel<<<grid, C::kThreads, d::sm90::kSm90SmemBytes, stream>>>(p, d::map_or_empty(q_map), q_map != nullptr);
  return cudaGetLastError();
}
