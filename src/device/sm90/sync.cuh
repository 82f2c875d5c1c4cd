// Hopper synchronisation and copy primitives used by the sm90 kernels: mbarrier, TMA tensor
// loads, proxy fences, named barriers, setmaxnreg. One small function per PTX instruction.
#pragma once

#include <cstdint>

#include "device/async_proxy.cuh"

namespace mlakit::device::sm90 {

__device__ __forceinline__ uint32_t smem_u32(const void* ptr) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(ptr));
}

// st.shared.v4.b32: 16 bytes to a shared-memory address (a plain C++ store through a pointer
// the compiler cannot prove shared becomes a slower generic ST).
__device__ __forceinline__ void st_shared_16(uint32_t addr, uint4 v) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}

// ---- mbarrier (PTX ISA 9.7.13.15) ----

// mbarrier.init.shared::cta.b64: phase 0, `count` arrivals expected.
__device__ __forceinline__ void mbarrier_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}

// fence.mbarrier_init.release.cluster: makes the inits visible to the async proxy (TMA).
__device__ __forceinline__ void fence_mbarrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// mbarrier.expect_tx.relaxed.cta.shared::cta.b64: the current phase also waits for `bytes`.
__device__ __forceinline__ void mbarrier_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes)
               : "memory");
}

// mbarrier.arrive.shared::cta.b64 (release, cta scope).
__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(bar)) : "memory");
}

// mbarrier.try_wait.parity.shared::cta.b64 (acquire): true once the phase of parity
// `parity` has completed.
__device__ __forceinline__ bool mbarrier_try_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n"
      "}\n"
      : "=r"(done)
      : "r"(smem_u32(bar)), "r"(parity)
      : "memory");
  return done != 0;
}

// mbarrier.test_wait.parity.shared::cta.b64 (acquire): whether the phase of parity `parity`
// has completed, without waiting (try_wait may suspend the thread for a while first).
__device__ __forceinline__ bool mbarrier_test_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "mbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n"
      "}\n"
      : "=r"(done)
      : "r"(smem_u32(bar)), "r"(parity)
      : "memory");
  return done != 0;
}

__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, uint32_t parity) {
  while (!mbarrier_try_wait(bar, parity)) {
  }
}

// ---- TMA (PTX ISA 9.7.9.25.5.2) ----

// cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes:
// loads one box of `map` at coordinates (c0 innermost .. c3) into shared memory; completion
// is counted on `bar` in bytes.
__device__ __forceinline__ void tma_load_4d(void* smem_dst, const void* map, uint64_t* bar, int32_t c0,
                                            int32_t c1, int32_t c2, int32_t c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
      "[%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(smem_u32(smem_dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(smem_u32(bar))
      : "memory");
}

// cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes: `bytes` (multiple of 16,
// both addresses 16-byte aligned) of contiguous global memory into shared memory, counted on
// `bar` in bytes (the non-tensor bulk copy: no box, no swizzle).
__device__ __forceinline__ void bulk_copy_global_to_shared(void* smem_dst, const void* gmem_src, uint32_t bytes,
                                                           uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                   smem_u32(smem_dst)),
               "l"(gmem_src), "r"(bytes), "r"(smem_u32(bar))
               : "memory");
}

// prefetch.tensormap: warms the descriptor cache with the (kernel-parameter) tensor map.
__device__ __forceinline__ void tma_prefetch_descriptor(const void* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// ---- fences and barriers ----

// fence.proxy.async.shared::cta: generic-proxy shared-memory writes (st.shared) become
// visible to later async-proxy reads (wgmma operands, TMA stores). PTX ISA 9.7.13.4.
__device__ __forceinline__ void fence_proxy_async_smem() { fence_proxy_async_shared(); }

// bar.sync id, n (PTX ISA 9.7.13.1): named barrier over `threads` threads (multiple of 32).
__device__ __forceinline__ void named_barrier_sync(uint32_t id, uint32_t threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// bar.arrive id, n: signals the named barrier without waiting (the producer side of a
// producer/consumer hand-off between warpgroups; the consumers bar.sync with the same n).
__device__ __forceinline__ void named_barrier_arrive(uint32_t id, uint32_t threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// setmaxnreg.{inc,dec}.sync.aligned.u32 (PTX ISA 9.7.19.5): a warpgroup takes registers
// from / returns them to the CTA pool. Needs __launch_bounds__(threads, 1).
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

}  // namespace mlakit::device::sm90
