// Global loads and prefetches for producers that keep loads in flight in registers (PTX ISA
// 9.7.9.8 "ld", 9.7.9.15 "prefetch"). The point is where the wait for a load lands: at the
// first real use of its data, not at a register copy the compiler made earlier.
#pragma once

#include <cstdint>

namespace mlakit::device {

// 16 bytes from `src` (16-byte aligned), read-only path. Unpredicated on purpose: a load whose
// destination is conditionally written leaves the compiler copies of it under the predicate,
// and each copy waits for the load (callers point invalid reads at a zero buffer instead).
__device__ __forceinline__ uint4 load_nc_16(const void* src) {
  uint4 v;
  asm("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(src));
  return v;
}

// 8 bytes from `src` (8-byte aligned), read-only path, unpredicated as load_nc_16.
__device__ __forceinline__ uint2 load_nc_8(const void* src) {
  uint2 v;
  asm("ld.global.nc.v2.u32 {%0, %1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "l"(src));
  return v;
}

// An int32 from `src` when `pred`, else `fallback` (plain ld.global: indices may be written by
// earlier kernels of the same stream, e.g. an indexer).
__device__ __forceinline__ int32_t load_s32_or(const int32_t* src, bool pred, int32_t fallback) {
  int32_t v;
  asm("{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %3, 0;\n"
      "mov.b32 %0, %2;\n"
      "@p ld.global.s32 %0, [%1];\n"
      "}\n"
      : "=&r"(v)
      : "l"(src), "r"(fallback), "r"(static_cast<int>(pred)));
  return v;
}

// Bytes of a cache line (L1 and L2): what one prefetch_l2 brings in.
inline constexpr int kCacheLineBytes = 128;

// prefetch.global.L2: brings the line holding `addr` into L2 (no register, no scoreboard),
// so a later load of it misses only L1. One instruction per thread with any address,
// where cp.async.bulk.prefetch.L2 takes a warp-uniform one (per-lane addresses compile to a
// loop over the distinct values).
__device__ __forceinline__ void prefetch_l2(const void* addr) {
  asm volatile("prefetch.global.L2 [%0];\n" ::"l"(addr));
}

}  // namespace mlakit::device
