// DeepSeek V4 FP8 cache kernels: quantize, dequantize, paged append. The layout and the
// per-value arithmetic are common/fp8_v4_cache_row.h, shared with the CPU reference, so both
// are bit-identical (a tile's max|x| is an fmax reduction: exact in any order).
//
// Warp roles: a warp owns one token. Lanes 0-27 own 16 NoPE values each (two 16-byte bf16
// loads, one 16-byte e4m3 store), four lanes per 64-value tile; the four reduce the tile's
// max|x| with two xor shuffles. Lanes 28-31 move the 128-byte RoPE part, 32 bytes each. Lane
// 0 stores the 8-byte scale record, gathered from each tile's first lane by shuffles. No
// shared memory; a grid-stride loop over tokens keeps the grid small for any cache size.
#include <cstdint>

#include "common/fp8_cache_row.h"
#include "common/fp8_v4_cache_row.h"
#include "kernels/portable/fp8_v4_cache_launch.h"

namespace mlakit::detail {
namespace {

constexpr int kWarpSize = 32;
constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kWarpsPerBlock = 8;
constexpr int64_t kMaxGridBlocks = int64_t{1} << 20;
constexpr int kValuesPerLane = 16;                              // 16 bytes of e4m3
constexpr int kLanesPerTile = kV4Tile / kValuesPerLane;         // 4
constexpr int kNopeLanes = kV4NopeDim / kValuesPerLane;         // 28
constexpr int kRopeLanes = kWarpSize - kNopeLanes;              // 4
constexpr int kRopeBytesPerLane = 2 * kV4RopeDim / kRopeLanes;  // 32
static_assert(kV4Tile % kValuesPerLane == 0 && (kLanesPerTile & (kLanesPerTile - 1)) == 0,
              "a tile is a power-of-two group of lanes (xor shuffles)");
static_assert(kNopeLanes % kLanesPerTile == 0 && kNopeLanes < kWarpSize, "RoPE lanes form groups of their own");
static_assert(kRopeBytesPerLane * kRopeLanes == 2 * kV4RopeDim && kRopeBytesPerLane == 32, "two 16-byte pieces");
static_assert(kV4Tiles <= 8 && kV4ScaleRecordBytes == 8, "the scale record is one 8-byte store");

// RoPE lane `r`'s 32 bytes, either way between a bf16 row and a record (16-byte aligned).
__device__ void copy_rope_piece(const void* from, void* to) {
  const uint4* f = static_cast<const uint4*>(from);
  uint4* t = static_cast<uint4*>(to);
  t[0] = f[0];
  t[1] = f[1];
}

__device__ void quantize_token(const uint16_t* src, V4CacheToken dst, int lane) {
  const bool nope = lane < kNopeLanes;
  const int first = lane * kValuesPerLane;
  alignas(16) uint16_t v[kValuesPerLane];
  float amax = 0.f;
  if (nope) {
    *reinterpret_cast<uint4*>(&v[0]) = *reinterpret_cast<const uint4*>(src + first);
    *reinterpret_cast<uint4*>(&v[8]) = *reinterpret_cast<const uint4*>(src + first + 8);
#pragma unroll
    for (int i = 0; i < kValuesPerLane; ++i) amax = fmaxf(amax, fabsf(bf16_bits_to_float(v[i])));
  }
#pragma unroll
  for (int x = 1; x < kLanesPerTile; x *= 2) amax = fmaxf(amax, __shfl_xor_sync(kFullMask, amax, x));
  const uint32_t scale_byte = v4_scale_byte(amax);
  if (nope) {
    const float scale = ue8m0_to_float(static_cast<uint8_t>(scale_byte));
    alignas(16) uint8_t q[kValuesPerLane];
#pragma unroll
    for (int i = 0; i < kValuesPerLane; ++i) q[i] = v4_quantize(bf16_bits_to_float(v[i]), scale);
    *reinterpret_cast<uint4*>(dst.record + first) = *reinterpret_cast<const uint4*>(q);
  } else {
    const int r = lane - kNopeLanes;
    copy_rope_piece(src + kV4NopeDim + r * (kRopeBytesPerLane / 2), dst.record + kV4RopeOffset + r * kRopeBytesPerLane);
  }
  // Tile t's byte from its first lane; the unused eighth byte stays 0.
  uint32_t word[2] = {0u, 0u};
#pragma unroll
  for (int t = 0; t < kV4Tiles; ++t) {
    word[t / 4] |= __shfl_sync(kFullMask, scale_byte, t * kLanesPerTile) << (8 * (t % 4));
  }
  if (lane == 0) *reinterpret_cast<uint2*>(dst.scales) = make_uint2(word[0], word[1]);
}

__device__ void dequantize_token(V4CacheToken src, uint16_t* dst, int lane) {
  if (lane >= kNopeLanes) {
    const int r = lane - kNopeLanes;
    copy_rope_piece(src.record + kV4RopeOffset + r * kRopeBytesPerLane, dst + kV4NopeDim + r * (kRopeBytesPerLane / 2));
    return;
  }
  const int first = lane * kValuesPerLane;
  const float scale = ue8m0_to_float(src.scales[lane / kLanesPerTile]);
  alignas(16) uint8_t q[kValuesPerLane];
  *reinterpret_cast<uint4*>(q) = *reinterpret_cast<const uint4*>(src.record + first);
  alignas(16) uint16_t v[kValuesPerLane];
#pragma unroll
  for (int i = 0; i < kValuesPerLane; ++i) v[i] = v4_dequantize(q[i], scale);
  *reinterpret_cast<uint4*>(dst + first) = *reinterpret_cast<const uint4*>(&v[0]);
  *reinterpret_cast<uint4*>(dst + first + 8) = *reinterpret_cast<const uint4*>(&v[8]);
}

// Token index of each warp in turn (whole warps: the shuffles need every lane).
__device__ int64_t first_token() { return static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarpSize; }
__device__ int64_t token_step() { return static_cast<int64_t>(gridDim.x) * kWarpsPerBlock; }

template <V4Convert kDirection>
__global__ void convert_kernel(V4ConvertArgs a) {
  const int64_t tokens = a.cache.num_blocks * a.cache.page_size;
  for (int64_t t = first_token(); t < tokens; t += token_step()) {
    const int64_t block = t / a.cache.page_size, offset = t % a.cache.page_size;
    uint16_t* row = v4_token_row(a.rows, block, offset);
    const V4CacheToken token = v4_cache_token(a.cache, block, offset);
    if constexpr (kDirection == V4Convert::kQuantize) {
      quantize_token(row, token, threadIdx.x % kWarpSize);
    } else {
      dequantize_token(token, row, threadIdx.x % kWarpSize);
    }
  }
}

__global__ void append_kernel(V4AppendArgs a) {
  const int64_t slots = a.cache.num_blocks * a.cache.page_size;  // < 2^61: the cache check's bounds
  for (int64_t i = first_token(); i < a.tokens.rows; i += token_step()) {
    const int64_t slot = a.slots[i];
    if (slot < 0 || slot >= slots) continue;  // -1 and out-of-range slots: skipped (the whole warp)
    quantize_token(static_cast<const uint16_t*>(a.tokens.data) + i * a.tokens.stride,
                   v4_cache_token(a.cache, slot / a.cache.page_size, slot % a.cache.page_size),
                   threadIdx.x % kWarpSize);
  }
}

unsigned grid_for(int64_t tokens) {
  const int64_t blocks = (tokens + kWarpsPerBlock - 1) / kWarpsPerBlock;
  return static_cast<unsigned>(blocks < kMaxGridBlocks ? blocks : kMaxGridBlocks);
}

template <V4Convert kDirection>
cudaError_t launch_convert(const V4ConvertArgs& args, cudaStream_t stream) {
  const int64_t tokens = args.cache.num_blocks * args.cache.page_size;
  if (tokens == 0) return cudaSuccess;
  convert_kernel<kDirection><<<grid_for(tokens), kWarpsPerBlock * kWarpSize, 0, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_quantize_mla_fp8_v4(const V4ConvertArgs& args, cudaStream_t stream) {
  return launch_convert<V4Convert::kQuantize>(args, stream);
}

cudaError_t launch_dequantize_mla_fp8_v4(const V4ConvertArgs& args, cudaStream_t stream) {
  return launch_convert<V4Convert::kDequantize>(args, stream);
}

cudaError_t launch_append_mla_fp8_v4(const V4AppendArgs& args, cudaStream_t stream) {
  if (args.tokens.rows == 0) return cudaSuccess;
  append_kernel<<<grid_for(args.tokens.rows), kWarpsPerBlock * kWarpSize, 0, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace mlakit::detail
