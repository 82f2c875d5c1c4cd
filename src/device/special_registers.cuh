// PTX special registers read by the kernels (PTX ISA 10 "Special Registers"): one function
// each, so kernels never spell the asm.
#pragma once

#include <cstdint>

namespace mlakit::device {

// %nsmid: the number of SM identifiers, an upper bound on the SM count (SM ids need not be
// contiguous); as a wave size it is the SM count on current GPUs.
__device__ __forceinline__ uint32_t nsmid() {
  uint32_t n;
  asm("mov.u32 %0, %%nsmid;" : "=r"(n));
  return n;
}

// %smid: the SM this thread runs on (0 .. nsmid() - 1); it can change under preemption, so
// use it only for diagnostics and placement hints.
__device__ __forceinline__ uint32_t smid() {
  uint32_t id;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
  return id;
}

// %globaltimer: nanoseconds on a clock shared by all SMs (volatile: every read is a new time).
__device__ __forceinline__ uint64_t globaltimer() {
  uint64_t ns;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
  return ns;
}

}  // namespace mlakit::device
