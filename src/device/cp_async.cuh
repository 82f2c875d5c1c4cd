// Asynchronous global -> shared copies of sm80+ (PTX ISA 9.7.9.25.3, "cp.async").
#pragma once

#include <cstdint>

namespace mlakit::device {

__device__ __forceinline__ uint32_t smem_address(const void* ptr) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(ptr));
}

// 16 bytes, L2 only (cp.async.cg.shared.global). Both addresses 16-byte aligned.
__device__ __forceinline__ void cp_async_16(void* smem_dst, const void* gmem_src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_address(smem_dst)),
               "l"(gmem_src));
}

// 16 bytes when `copy`, else 16 zero bytes and no global read (src-size 0; `gmem_src` must
// still be a valid address).
__device__ __forceinline__ void cp_async_16_or_zero(void* smem_dst, const void* gmem_src, bool copy) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_address(smem_dst)), "l"(gmem_src),
               "r"(copy ? 16 : 0));
}

// The same to a shared-memory address (cvta'd once by the caller, so a loop over chunks
// keeps one 32-bit base instead of 64-bit generic pointers), in the ignore-src form: the
// predicate goes to the copy as it is, where a src-size operand costs a select per copy.
__device__ __forceinline__ void cp_async_16_or_zero(uint32_t smem_dst, const void* gmem_src, bool copy) {
  asm volatile(
      "{ .reg .pred skip; setp.eq.u32 skip, %2, 0; cp.async.cg.shared.global [%0], [%1], 16, skip; }\n" ::"r"(smem_dst),
      "l"(gmem_src), "r"(static_cast<uint32_t>(copy)));
}

// 4 bytes through L1 (cp.async.ca: .cg takes only 16); both addresses 4-byte aligned.
__device__ __forceinline__ void cp_async_4(uint32_t smem_dst, const void* gmem_src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(smem_dst), "l"(gmem_src));
}

// cp.async.commit_group: closes the group of this thread's copies issued since the last one.
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

// cp.async.wait_group N: all but this thread's N most recent groups have landed.
template <int N>
__device__ __forceinline__ void cp_async_wait_groups_but() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// cp.async.mbarrier.arrive.noinc.shared::cta.b64: one arrival on `bar` once every cp.async
// this thread issued so far has landed (the barrier's count includes these arrivals).
__device__ __forceinline__ void cp_async_mbarrier_arrive_noinc(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_address(bar)) : "memory");
}

// cp.async.commit_group + cp.async.wait_group 0: every copy of this thread has landed.
__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;\n" ::: "memory");
}

}  // namespace mlakit::device
