// Global-memory counters that order the work of different CTAs (a CTA waits until the counter
// reaches its turn, works, then advances it): acquire loads and release stores at gpu scope.
#pragma once

#include <cstdint>

namespace mlakit::device {

// ld.acquire.gpu.global.b32 (PTX ISA 9.7.9.8 "ld", memory consistency model section 8): the
// reads and writes after it are ordered after it.
__device__ __forceinline__ int32_t load_acquire_gpu(const int32_t* p) {
  int32_t v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// st.release.gpu.global.b32: the reads and writes before it (and, through a barrier that
// precedes it, those of the threads taking part) are visible to a thread whose acquire load
// sees it.
__device__ __forceinline__ void store_release_gpu(int32_t* p, int32_t v) {
  asm volatile("st.release.gpu.global.b32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// Spins until *p == value (one thread of the CTA; the others wait at a barrier after it).
__device__ __forceinline__ void wait_until_equal(const int32_t* p, int32_t value) {
  while (load_acquire_gpu(p) != value) {
    __nanosleep(32);
  }
}

}  // namespace mlakit::device
