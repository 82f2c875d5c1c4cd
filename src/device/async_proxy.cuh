// Async-proxy operations of sm90 for code that also compiles for sm80 (the portable kernels
// and device/sm90 alike): the shared-memory proxy fence, and bulk reductions from shared into
// global memory (the TMA unit adds a contiguous run of float32 values at the L2 as whole
// lines, far cheaper for the L2 than one reduction per value). Each thread tracks its own bulk
// groups. Compiled for older GPUs the reduction traps and the rest are empty: callers use them
// only where the host chose the sm90 path.
#pragma once

#include <cstdint>

namespace mlakit::device {

// cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 (PTX ISA 9.7.9.25.4.2): adds
// `bytes` (a multiple of 16; both addresses 16-byte aligned) of float32 values at smem_src
// into gmem_dst. The source must not be written until cp.async.bulk.wait_group.read says the
// group's reads are done; it reads through the async proxy (fence.proxy.async after st.shared).
__device__ __forceinline__ void bulk_reduce_add_f32(float* gmem_dst, uint32_t smem_src, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(gmem_dst),
               "r"(smem_src), "r"(bytes)
               : "memory");
#else
  __trap();
#endif
}

// cp.async.bulk.commit_group: closes this thread's bulk group.
__device__ __forceinline__ void bulk_commit_group() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
#endif
}

// cp.async.bulk.wait_group.read 0: this thread's bulk groups have read their sources.
__device__ __forceinline__ void bulk_wait_reads() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
#endif
}

// cp.async.bulk.wait_group 0: this thread's bulk groups are complete (their writes made and
// visible to this thread: a release store after it publishes them; the .read form below does
// not).
__device__ __forceinline__ void bulk_wait_all() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
#endif
}

// fence.proxy.async.shared::cta: this thread's st.shared are visible to async-proxy reads.
__device__ __forceinline__ void fence_proxy_async_shared() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

}  // namespace mlakit::device
