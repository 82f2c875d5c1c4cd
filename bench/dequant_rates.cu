// mlakit-dequant-rates: issue rates of the instructions an FP8 -> bf16 dequantization can be
// built from, per clock per SM, on the GPU it runs on. The sparse FP8 decode's producer spends
// most of its instructions converting (docs/kernels/mla_sparse_decode_sm90.md); which pipe each
// conversion occupies decides how to write it, and the CUDA guide's throughput table does not
// name these instructions.
//
// Each kernel runs one 1024-thread CTA per SM; every thread runs 8 independent dependency
// chains of one operation for kIters steps (enough warps and chains to saturate any pipe), and
// the CTA's clock64 span gives values (or operations) per clock per SM.
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "device/fp8_convert.cuh"
#include "bench/rate_tools.cuh"
#include "support/device_array.h"

namespace {

using mlakit::bench_rates::check;

using mlakit::support::DeviceArray;

constexpr int kThreads = 1024;
constexpr int kChains = 8;
constexpr int kIters = 2048;

// One step of each measured operation on a 32-bit chain value.
struct Unpack {  // cvt.rn.f16x2.e4m3x2: 2 values
  static constexpr int kValues = 2;
  __device__ static uint32_t step(uint32_t x, float) {
    uint32_t y;
    asm("{ .reg .b16 lo; cvt.u16.u32 lo, %1; cvt.rn.f16x2.e4m3x2 %0, lo; }" : "=r"(y) : "r"(x));
    return y;
  }
};
struct HalfToFloat {  // cvt.f32.f16: 1 value
  static constexpr int kValues = 1;
  __device__ static uint32_t step(uint32_t x, float) {
    float y;
    asm("{ .reg .b16 lo; cvt.u16.u32 lo, %1; cvt.f32.f16 %0, lo; }" : "=f"(y) : "r"(x));
    return __float_as_uint(y);
  }
};
struct PackBf16 {  // cvt.rn.bf16x2.f32: 2 values
  static constexpr int kValues = 2;
  __device__ static uint32_t step(uint32_t x, float s) {
    uint32_t y;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(y) : "f"(__uint_as_float(x)), "f"(s));
    return y;
  }
};
struct Multiply {  // mul.f32: 1 value
  static constexpr int kValues = 1;
  __device__ static uint32_t step(uint32_t x, float s) { return __float_as_uint(__uint_as_float(x) * s); }
};
struct MultiplyBf16x2 {  // mul.rn.bf16x2: 2 values
  static constexpr int kValues = 2;
  __device__ static uint32_t step(uint32_t x, float s) {
    uint32_t y;
    asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(y) : "r"(x), "r"(__float_as_uint(s)));
    return y;
  }
};
struct Logic {  // lop3: 1 operation
  static constexpr int kValues = 1;
  __device__ static uint32_t step(uint32_t x, float s) {
    uint32_t y;
    asm("lop3.b32 %0, %1, %2, %3, 0x96;" : "=r"(y) : "r"(x), "r"(__float_as_uint(s)), "r"(0x5a5a5a5au));
    return y;
  }
};
struct Permute {  // prmt: 1 operation
  static constexpr int kValues = 1;
  __device__ static uint32_t step(uint32_t x, float s) {
    uint32_t y;
    asm("prmt.b32 %0, %1, %2, 0x5140;" : "=r"(y) : "r"(x), "r"(__float_as_uint(s)));
    return y;
  }
};
struct Dequantize {  // device/fp8_convert.cuh, 8 values; the chain adds 2 lop3
  static constexpr int kValues = 8;
  __device__ static uint32_t step(uint32_t x, float s) {
    const uint4 o = mlakit::device::dequantize_e4m3x8_bf16(make_uint2(x, x ^ 0x01010101u), s);
    return (o.x ^ o.y) ^ (o.z ^ o.w);
  }
};

template <typename Op>
__global__ void __launch_bounds__(kThreads, 1) rate_kernel(uint32_t seed, float scale, uint32_t* sink,
                                                           long long* cycles) {
  uint32_t v[kChains];
#pragma unroll
  for (int c = 0; c < kChains; ++c) v[c] = seed * (threadIdx.x + 1) + 0x3c3c0000u * c + 0x3838u;
  __syncthreads();
  const long long start = clock64();
  for (int i = 0; i < kIters; ++i) {
#pragma unroll
    for (int c = 0; c < kChains; ++c) v[c] = Op::step(v[c], scale);
  }
  __syncthreads();
  const long long stop = clock64();
  uint32_t acc = 0;
#pragma unroll
  for (int c = 0; c < kChains; ++c) acc ^= v[c];
  if (acc == seed) sink[blockIdx.x] = acc;  // keeps the chains alive; practically never true
  if (threadIdx.x == 0) cycles[blockIdx.x] = stop - start;
}

template <typename Op>
void measure(const char* name, int sms, const DeviceArray& sink, const DeviceArray& cycles) {
  for (int round = 0; round < 2; ++round) {  // the first is a warm-up
    rate_kernel<Op><<<sms, kThreads>>>(12345u, 1.5f, static_cast<uint32_t*>(sink.get()),
                                       static_cast<long long*>(cycles.get()));
  }
  check(cudaGetLastError(), "rate_kernel launch");
  check(cudaDeviceSynchronize(), "rate_kernel");
  const std::vector<long long> host = cycles.download<long long>();
  const long long span = *std::max_element(host.begin(), host.end());
  const double steps = static_cast<double>(kThreads) * kChains * kIters;
  std::printf("%-16s %7.1f steps/clk/SM  %7.1f values/clk/SM\n", name, steps / span, steps * Op::kValues / span);
}

}  // namespace

int main() {
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  const int sms = prop.multiProcessorCount;
  std::printf("dequant rates on %s (%d SMs), %d threads x %d chains per SM\n", prop.name, sms, kThreads, kChains);
  const DeviceArray sink(sms * sizeof(uint32_t)), cycles(sms * sizeof(long long));
  measure<Unpack>("e4m3x2->f16x2", sms, sink, cycles);
  measure<HalfToFloat>("f16->f32", sms, sink, cycles);
  measure<PackBf16>("f32x2->bf16x2", sms, sink, cycles);
  measure<Multiply>("fmul", sms, sink, cycles);
  measure<MultiplyBf16x2>("bf16x2 mul", sms, sink, cycles);
  measure<Logic>("lop3", sms, sink, cycles);
  measure<Permute>("prmt", sms, sink, cycles);
  measure<Dequantize>("dequantize x8", sms, sink, cycles);
  return 0;
}
