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

// cp.async.commit_group + cp.async.wait_group 0: every copy of this thread has landed.
__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;\n" ::: "memory");
}

}  // namespace mlakit::device
