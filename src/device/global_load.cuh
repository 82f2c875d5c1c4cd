// Predicated read-only global loads whose "else" value is set in the same instruction sequence
// (PTX ISA 9.7.9.8 "ld", .nc). Written in C++ (`if (p) x = load(..)`), the compiler loads into
// a temporary and then moves it into x under the predicate, and that move waits for the load
// at once: a load issued ahead of its use stops being ahead. Here the destination is set to
// the fallback first and the load writes it directly, so the wait comes at the first real use.
#pragma once

#include <cstdint>

namespace mlakit::device {

// 16 bytes from `src` (16-byte aligned) when `pred`, else zeros (src not read).
__device__ __forceinline__ uint4 load_nc_16_or_zero(const void* src, bool pred) {
  uint4 v;
  asm("{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %5, 0;\n"
      "mov.b32 %0, 0;\n"
      "mov.b32 %1, 0;\n"
      "mov.b32 %2, 0;\n"
      "mov.b32 %3, 0;\n"
      "@p ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];\n"
      "}\n"
      : "=&r"(v.x), "=&r"(v.y), "=&r"(v.z), "=&r"(v.w)
      : "l"(src), "r"(static_cast<int>(pred)));
  return v;
}

// 4 bytes (a float) from `src` when `pred`, else 0.
__device__ __forceinline__ float load_nc_f32_or_zero(const void* src, bool pred) {
  float v;
  asm("{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %2, 0;\n"
      "mov.b32 %0, 0;\n"
      "@p ld.global.nc.f32 %0, [%1];\n"
      "}\n"
      : "=&f"(v)
      : "l"(src), "r"(static_cast<int>(pred)));
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

// prefetch.global.L1: brings the line holding `addr` into L1 (no register, no scoreboard),
// so a later load of it is an L1 hit.
__device__ __forceinline__ void prefetch_l1(const void* addr) {
  asm volatile("prefetch.global.L1 [%0];\n" ::"l"(addr));
}

// prefetch.global.L2: the same into L2 only. One instruction per thread with any address,
// where cp.async.bulk.prefetch.L2 takes a warp-uniform one (per-lane addresses compile to a
// loop over the distinct values).
__device__ __forceinline__ void prefetch_l2(const void* addr) {
  asm volatile("prefetch.global.L2 [%0];\n" ::"l"(addr));
}

}  // namespace mlakit::device
