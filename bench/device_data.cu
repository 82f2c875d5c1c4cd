#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "bench/check.h"
#include "bench/device_data.h"

namespace mlakit::bench {
namespace {

constexpr int kFillThreads = 256;
// Enough CTAs to fill any current GPU; a grid-stride loop covers the rest.
constexpr int64_t kMaxFillBlocks = 8192;

// splitmix64's finaliser: a bijection with good avalanche, so hashing (key ^ index) gives
// independent-looking values per element.
__device__ __forceinline__ uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

// (2k + 1 - 2^24) / 2^24 for a 24-bit k: an odd numerator, so never zero; its magnitude is
// >= 2^-24, which bf16 and fp16 (subnormal) both represent, so rounding cannot make it zero.
__device__ __forceinline__ float uniform_pm1(uint64_t key, uint64_t index) {
  const int32_t k = static_cast<int32_t>(mix64(key ^ index) >> 40);
  return static_cast<float>(2 * k + 1 - (1 << 24)) * (1.0f / 16777216.0f);
}

__device__ __forceinline__ void store(__nv_bfloat16* p, float x) { *p = __float2bfloat16_rn(x); }
__device__ __forceinline__ void store(__half* p, float x) { *p = __float2half_rn(x); }

template <typename Elem>
__global__ void fill_uniform_kernel(Elem* dst, int64_t count, uint64_t key) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    store(dst + i, uniform_pm1(key, static_cast<uint64_t>(i)));
  }
}

// Hashing the seed first keeps nearby seeds (1, 2, ...) from giving related streams.
uint64_t seed_key(uint64_t seed) {
  uint64_t x = seed + 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

void fill_uniform(void* dst, DType dtype, int64_t count, uint64_t seed, cudaStream_t stream) {
  if (count <= 0) return;
  const int64_t blocks = std::min(kMaxFillBlocks, (count + kFillThreads - 1) / kFillThreads);
  const uint64_t key = seed_key(seed);
  switch (dtype) {
    case DType::kBF16:
      fill_uniform_kernel<<<static_cast<unsigned>(blocks), kFillThreads, 0, stream>>>(
          static_cast<__nv_bfloat16*>(dst), count, key);
      break;
    case DType::kFP16:
      fill_uniform_kernel<<<static_cast<unsigned>(blocks), kFillThreads, 0, stream>>>(
          static_cast<__half*>(dst), count, key);
      break;
    default:
      fail(std::string("fill_uniform: expected bf16 or fp16, got ") + dtype_name(dtype));
  }
  BENCH_CUDA(cudaGetLastError());
}

}  // namespace mlakit::bench
