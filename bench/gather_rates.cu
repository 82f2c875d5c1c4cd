// mlakit-gather-rates: bytes per clock per SM that cp.async gathers of random 128-byte row
// pieces deliver into shared memory, by the number of gathering warps and the copy groups each
// keeps in flight. The sparse prefill's 4 producer warps get a 72 KB tile in ~4,000 cycles
// after its stage is free, whether 16 or 132 SMs are busy (docs/kernels/mla_sparse_prefill_sm90.md):
// this tells whether more warps or deeper queues would deliver more per SM.
//
// One CTA per SM. Each warp round: lane 8q + c copies 16-byte chunk c of 4 random 128-byte
// pieces (one slab of a random 1152-byte row of an L2-resident 9.4 MB buffer, the prefill's
// whole-row layout), i.e. 2 KB per warp, as one cp.async group; a warp keeps kDepth groups in
// flight (wait_group kDepth - 1).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "device/cp_async.cuh"
#include "bench/rate_tools.cuh"
#include "support/device_array.h"

namespace {

using mlakit::bench_rates::check;
using mlakit::bench_rates::mix;

using mlakit::support::DeviceArray;

constexpr int kRows = 8192, kRowBytes = 1152, kRounds = 512, kRoundBytes = 2048;

template <int kDepth>
__global__ void gather_kernel(const uint8_t* rows, long long* spans) {
  extern __shared__ __align__(128) uint8_t ring[];  // [warps][kDepth][2 KB]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, q = lane / 8, c = lane % 8;
  uint8_t* mine = ring + static_cast<size_t>(warp) * kDepth * kRoundBytes;
  __syncthreads();
  const long long start = clock64();
  for (int r = 0; r < kRounds; ++r) {
    uint8_t* dst = mine + (r % kDepth) * kRoundBytes;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint32_t h = mix(blockIdx.x * 0x9e3779b9u + warp * 0x85ebca6bu + r * 4 + j + q * 0x27d4eb2fu);
      const uint8_t* piece = rows + static_cast<size_t>(h % kRows) * kRowBytes + ((h >> 16) % 9) * 128;
      mlakit::device::cp_async_16(dst + (4 * j + q) * 128 + c * 16, piece + c * 16);
    }
    asm volatile("cp.async.commit_group;\n" ::: "memory");
    asm volatile("cp.async.wait_group %0;\n" ::"n"(kDepth - 1) : "memory");
  }
  mlakit::device::cp_async_wait_all();
  __syncthreads();
  if (threadIdx.x == 0) spans[blockIdx.x] = clock64() - start;
}

template <int kDepth>
void measure(int warps, int sms, const uint8_t* rows) {
  const int smem = warps * kDepth * kRoundBytes;
  check(cudaFuncSetAttribute(gather_kernel<kDepth>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), "smem");
  DeviceArray spans(sms * sizeof(long long));
  for (int run = 0; run < 2; ++run) {  // the second run is timed: L2 warm
    gather_kernel<kDepth><<<sms, warps * 32, smem>>>(rows, static_cast<long long*>(spans.get()));
    check(cudaGetLastError(), "gather_kernel launch");
    check(cudaDeviceSynchronize(), "gather_kernel");
  }
  const std::vector<long long> host = spans.download<long long>();
  const double span = static_cast<double>(*std::max_element(host.begin(), host.end()));
  const double bytes = static_cast<double>(warps) * kRounds * kRoundBytes;
  std::printf("%2d warps  %d groups in flight  %6.1f B/clk/SM  (%.0f KB in flight per SM)\n", warps, kDepth,
              bytes / span, warps * kDepth * kRoundBytes / 1024.0);
}

}  // namespace

int main() {
  try {
    int device = 0, sms = 0;
    check(cudaGetDevice(&device), "cudaGetDevice");
    check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "SM count");
    cudaDeviceProp prop{};
    check(cudaGetDeviceProperties(&prop, device), "properties");
    DeviceArray rows(static_cast<size_t>(kRows) * kRowBytes);
    rows.fill_bytes(1);
    std::printf("cp.async gathers of random 128-byte pieces (L2-resident rows) on %s, %d SMs, one CTA per SM\n",
                prop.name, sms);
    for (int warps : {4, 8, 16}) {
      const auto* data = static_cast<const uint8_t*>(rows.get());
      measure<2>(warps, sms, data);
      measure<4>(warps, sms, data);
      if (warps <= 8) measure<8>(warps, sms, data);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mlakit-gather-rates: %s\n", e.what());
    return 1;
  }
  return 0;
}
