// merge_states on the GPU (docs/kernels/merge.md): N partial attention states of the same rows
// merged into one, memory-bound.
//
// Threads: a group of G lanes (a power of two <= 32, so a group never leaves its warp) per
// row, each lane kChunksPerLane chunks of kVec consecutive values per pass (lane l of the
// group chunks l, l + G, l + 2G, ...: a warp's k-th loads are consecutive bytes); a warp holds
// 32 / G rows and the warps stride over the rows (one wave of resident CTAs). Per row, every
// lane of the group reads the N LSEs (broadcast loads, kLsesPerLoad issued together) for the
// maximum and the sum of the weights (online: one pass), and again for the weights as it
// reads the states' chunks: kStatesPerRound states x kChunksPerLane chunks per round, their
// loads issued together. An empty state (LSE +-inf) is never read.
//
// In place: out may be one of the o tensors (each chunk is read and then written by the same
// lane) and out_lse one of the lse tensors: its row is written by the group's first lane after
// a __syncwarp that follows every read of the row's LSEs by the group's lanes.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "common/merge_layout.h"

namespace mlakit::detail::merge {

inline constexpr int kThreads = 256;
// A lane's loads of one round: kStatesPerRound states x kChunksPerLane chunks of its row,
// issued together (8 x 16 bytes in flight per lane). One chunk and four states per round
// held 4 x 16 bytes in flight and the LSE loads between rounds left a 2-state merge of
// 16384 x 32 rows of d 128 at 0.45 of the copy bandwidth (H200); this shape 0.88-0.90 (H100).
inline constexpr int kStatesPerRound = 2;
inline constexpr int kChunksPerLane = 4;
inline constexpr int kLsesPerLoad = 8;  // a row's LSEs loaded together before the maximum and sum
// 2 CTAs of 256 threads per SM: up to 128 registers a thread (the 16-bit instances with
// 16-byte chunks need 118-128: 32 accumulators and 8 loads of 4 registers; at 3 CTAs' 80
// they spill). 512 lanes x 128 bytes in flight is 64 KB per SM, over twice what the
// memory's latency needs (about 26 KB per SM at the H200's 4.3 TB/s and ~0.8 us).
inline constexpr int kMinCtasPerSm = 2;

// `bytes` of consecutive memory as one load or store.
template <int kBytes>
struct RawVector;
template <>
struct RawVector<16> { using Type = uint4; };
template <>
struct RawVector<8> { using Type = uint2; };
template <>
struct RawVector<4> { using Type = uint32_t; };
template <>
struct RawVector<2> { using Type = uint16_t; };

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <>
__device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }

// kVec values of T (aligned to their size, up to 16 bytes) loaded as they are stored, and
// converted to float only where they are added: a round's loads then hold half the registers
// of their float values at 16 bits (8 floats a chunk spilled at the 64-register budget).
template <typename T, int kVec>
struct StoredChunk {
  static constexpr int kBytes = kVec * static_cast<int>(sizeof(T));
  static_assert(kBytes <= 16, "one load per chunk");
  using Raw = typename RawVector<kBytes>::Type;
  __device__ __forceinline__ static Raw load(const T* p) { return *reinterpret_cast<const Raw*>(p); }
  // acc[i] += w * value i
  __device__ __forceinline__ static void add(float* acc, float w, const Raw& raw) {
    const T* v = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int i = 0; i < kVec; ++i) acc[i] = fmaf(w, to_float(v[i]), acc[i]);
  }
};

// kVec floats stored as T at `p`, in pieces of up to 16 bytes (each aligned to its size).
template <typename T, int kVec>
__device__ __forceinline__ void store_chunk(T* p, const float* x) {
  constexpr int kBytes = kVec * static_cast<int>(sizeof(T));
  constexpr int kPieceBytes = kBytes < 16 ? kBytes : 16;
  constexpr int kPerPiece = kPieceBytes / static_cast<int>(sizeof(T));
  using Raw = typename RawVector<kPieceBytes>::Type;
#pragma unroll
  for (int piece = 0; piece < kVec / kPerPiece; ++piece) {
    Raw raw;
    T* v = reinterpret_cast<T*>(&raw);
#pragma unroll
    for (int i = 0; i < kPerPiece; ++i) v[i] = from_float<T>(x[piece * kPerPiece + i]);
    *reinterpret_cast<Raw*>(p + piece * kPerPiece) = raw;
  }
}

__device__ __forceinline__ int64_t row_offset(const int64_t* stride, int64_t i0, int64_t i1, int64_t i2) {
  return i0 * stride[0] + i1 * stride[1] + i2 * stride[2];
}

// In, Out: float, __nv_bfloat16 or __half; kVec values per chunk (d % kVec == 0, rows aligned
// to the chunk's bytes: the dispatch checks). group_shift: log2 of the lanes per row.
template <typename In, typename Out, int kVec>
__global__ void __launch_bounds__(kThreads, kMinCtasPerSm) merge_states_kernel(const __grid_constant__ MergeLayout p, int group_shift) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int group_lanes = 1 << group_shift;
  const int group_lane = lane & (group_lanes - 1);
  const int64_t chunks = p.d / kVec;
  const int64_t rows_per_warp = 32 >> group_shift;
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) / 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (kThreads / 32);
  const int n = p.num_states;
  const float c = p.lse_to_log2;
  using Stored = StoredChunk<In, kVec>;

  // Warp-uniform trip count: every lane reaches the __syncwarp below.
  for (int64_t row0 = warp * rows_per_warp; row0 < p.rows; row0 += warps * rows_per_warp) {
    const int64_t row = row0 + (lane >> group_shift);
    const bool active = row < p.rows;
    const int64_t i2 = row % p.row_shape[2], i01 = row / p.row_shape[2];
    const int64_t i1 = i01 % p.row_shape[1], i0 = i01 / p.row_shape[1];
    const int64_t lse_at = row_offset(p.lse_stride, i0, i1, i2);
    auto lse_of = [&](int s) { return active && s < n ? p.lse[s][lse_at] : -INFINITY; };

    // Online maximum and sum of the weights exp2((lse - max) * c), in the inputs' base; the
    // LSEs loaded kLsesPerLoad at a time first, so their latencies overlap.
    float max_lse = -INFINITY, sum = 0.f;
    bool has_nan = false;
    for (int s0 = 0; s0 < n; s0 += kLsesPerLoad) {
      float v[kLsesPerLoad];
#pragma unroll
      for (int u = 0; u < kLsesPerLoad; ++u) v[u] = lse_of(s0 + u);  // -inf past the last state
#pragma unroll
      for (int u = 0; u < kLsesPerLoad; ++u) {
        has_nan |= isnan(v[u]);
        if (!isfinite(v[u])) continue;
        if (v[u] > max_lse) {
          sum = sum * exp2f((max_lse - v[u]) * c) + 1.f;  // the first: 0 * exp2(-inf) + 1
          max_lse = v[u];
        } else {
          sum += exp2f((v[u] - max_lse) * c);
        }
      }
    }
    const bool empty = max_lse == -INFINITY;
    const float inv_sum = empty ? 0.f : 1.f / sum;

    const int64_t o_at = row_offset(p.o_stride, i0, i1, i2);
    Out* out = static_cast<Out*>(p.out) + row_offset(p.out_stride, i0, i1, i2);
    // A lane's chunks of a pass: group_lane + k * group_lanes, k < kChunksPerLane (a warp's
    // k-th loads are consecutive bytes); more passes only where a row has more chunks.
    for (int64_t base = 0; active && base < chunks; base += kChunksPerLane * group_lanes) {
      float acc[kChunksPerLane][kVec] = {};
      bool in_row[kChunksPerLane];
#pragma unroll
      for (int k = 0; k < kChunksPerLane; ++k) in_row[k] = base + group_lane + k * group_lanes < chunks;
      if (!has_nan && !empty) {
        for (int s0 = 0; s0 < n; s0 += kStatesPerRound) {
          float w[kStatesPerRound];
          typename Stored::Raw x[kStatesPerRound][kChunksPerLane];
#pragma unroll
          for (int u = 0; u < kStatesPerRound; ++u) {
            const float v = lse_of(s0 + u);
            const bool used = isfinite(v);
            w[u] = used ? exp2f((v - max_lse) * c) * inv_sum : 0.f;
            const In* src = used ? static_cast<const In*>(p.o[s0 + u]) + o_at + (base + group_lane) * kVec : nullptr;
#pragma unroll
            for (int k = 0; k < kChunksPerLane; ++k) {
              // zeros where nothing is read: an empty state or a chunk past the row adds 0 * 0
              x[u][k] = used && in_row[k] ? Stored::load(src + k * group_lanes * kVec) : typename Stored::Raw{};
            }
          }
#pragma unroll
          for (int u = 0; u < kStatesPerRound; ++u) {
#pragma unroll
            for (int k = 0; k < kChunksPerLane; ++k) Stored::add(acc[k], w[u], x[u][k]);
          }
        }
      } else if (has_nan) {
#pragma unroll
        for (int k = 0; k < kChunksPerLane; ++k) {
#pragma unroll
          for (int i = 0; i < kVec; ++i) acc[k][i] = NAN;
        }
      }
#pragma unroll
      for (int k = 0; k < kChunksPerLane; ++k) {
        if (in_row[k]) store_chunk<Out, kVec>(out + (base + group_lane + k * group_lanes) * kVec, acc[k]);
      }
    }
    if (p.out_lse != nullptr) {
      __syncwarp();  // the group's LSE reads are done: out_lse may be one of the lse tensors
      if (active && group_lane == 0) {
        const float lse = has_nan ? NAN : empty ? INFINITY : (max_lse + log2f(sum) / c) * p.lse_to_out_base;
        p.out_lse[row_offset(p.out_lse_stride, i0, i1, i2)] = lse;
      }
    }
  }
}

}  // namespace mlakit::detail::merge
