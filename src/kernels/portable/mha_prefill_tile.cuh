// Tiling of the portable MHA prefill kernel (mha_prefill_kernel.cuh): the constexpr config per
// head-dim pair, the shared-memory map, the swizzled tile addressing that the copies and the
// ldmatrix loads share, and the global -> shared row copies.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "device/cp_async.cuh"

namespace mlakit::detail::mha_portable {

// Dqk, Dv: the head dims. 4 warps of 16 query rows each (one mma.m16n8k16 M tile per warp).
template <int Dqk, int Dv>
struct Config {
  static constexpr int kDqk = Dqk;
  static constexpr int kDv = Dv;
  static constexpr int kElemBytes = 2;  // bf16 / fp16
  static constexpr int kWarps = 4;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kRowsPerWarp = 16;
  static constexpr int kRows = kWarps * kRowsPerWarp;  // query rows per CTA
  // d = 256 takes 32-key tiles: S stays 16 registers beside O's 128, and Q + K + V (64 KB)
  // leave room for two CTAs per SM on sm80 / sm90 and fit the 99 KB of sm86 / sm89.
  static constexpr int kKeys = Dqk >= 256 ? 32 : 64;
  static constexpr int kQkRowBytes = Dqk * kElemBytes;  // Q and K rows, unpadded (swizzled)
  static constexpr int kVRowBytes = Dv * kElemBytes;
  static constexpr int kChunkBytes = 16;
  static constexpr int kChunkElems = kChunkBytes / kElemBytes;
  static constexpr int kQkChunks = kQkRowBytes / kChunkBytes;  // 16-byte chunks per row
  static constexpr int kVChunks = kVRowBytes / kChunkBytes;
  static constexpr int kScoreTiles = kKeys / 8;  // n8 tiles of S per warp
  static constexpr int kValueTiles = Dv / 8;     // n8 tiles of O per warp
  // Shared memory (byte offsets; each tile a multiple of 128 bytes, so every row starts a
  // 128-byte line and the swizzle of tile_offset never leaves the row).
  static constexpr int kQOffset = 0;
  static constexpr int kQBytes = kRows * kQkRowBytes;
  static constexpr int kKOffset = kQOffset + kQBytes;
  static constexpr int kKBytes = kKeys * kQkRowBytes;
  static constexpr int kVOffset = kKOffset + kKBytes;
  static constexpr int kVBytes = kKeys * kVRowBytes;
  static constexpr int kSmemBytes = kVOffset + kVBytes;
  static constexpr int kSmemLimitBytes = 99 * 1024;  // the per-block opt-in limit of sm86 / sm89
  // CTAs per SM that the register budget is cut for (__launch_bounds__): 65536 / (kThreads x
  // kMinBlocks) registers per thread, 128 / 168 / 255 for d_v = 64 / 128 / 256 (O alone takes
  // d_v / 2, S kKeys / 2). Every instance compiles without spills at these (CUDA 13.0).
  static constexpr int kMinBlocks = Dv <= 64 ? 4 : (Dv <= 128 ? 3 : 2);
  static constexpr int kSm90SmemBytes = 227 * 1024;  // per SM (sm80: 164 KB, so 2 CTAs of 64 KB)

  static_assert(Dqk % 64 == 0 && Dv % 64 == 0, "rows of whole 128-byte lines (the swizzle's unit)");
  static_assert(Dv <= Dqk, "the output is staged in the warp's own Q rows");
  static_assert(kKeys % 16 == 0, "k16 steps of P V");
  static_assert(kSmemBytes <= kSmemLimitBytes, "one CTA fits every sm80+ GPU");
  static_assert(kMinBlocks * kSmemBytes <= kSm90SmemBytes, "the register budget's CTAs also fit in shared memory");
};

// Byte offset of 16-byte chunk `chunk` of row `row` in a tile of `row_bytes`-byte rows (a
// multiple of 128): chunk c of every 128-byte line of the row is stored at c ^ (row % 8) of
// that line (the permutation of the Hopper tiles' 128-byte swizzle, device/sm90/swizzle.cuh,
// which portable code may not include). The 8 rows of one ldmatrix matrix (the same column
// chunk of 8 consecutive rows) then fall in 8 different bank groups with no padding, and each
// 128-byte global line lands in one shared line.
__device__ __forceinline__ uint32_t tile_offset(int row, int chunk, int row_bytes) {
  return static_cast<uint32_t>(row * row_bytes + (chunk ^ (row & 7)) * 16);
}

// The ldmatrix address of a lane whose matrix row is `row` and whose 16-byte column chunk is
// `chunk_in_pair` (0 or 1) of the 16-column block at column 0; ldmatrix_at moves it to a
// block at column `col` (a multiple of 16). Swizzled chunk c ^ (row % 8) with c = col / 8 +
// chunk_in_pair and col / 8 even is (col / 8 % 8) ^ (chunk_in_pair ^ row % 8) within the line,
// so the column offset is one XOR and one add of constants once the loop is unrolled.
__device__ __forceinline__ uint32_t ldmatrix_lane_address(uint32_t tile, int row, int chunk_in_pair, int row_bytes) {
  return tile + tile_offset(row, chunk_in_pair, row_bytes);
}
__device__ __forceinline__ uint32_t ldmatrix_at(uint32_t lane_address, int col) {
  return (lane_address ^ static_cast<uint32_t>((col / 8 & 6) * 16)) + static_cast<uint32_t>(col / 64 * 128);
}

// Copies rows [0, kTileRows) of a row tile from global memory (row r at src + r * stride,
// elements) into the swizzled shared tile at `tile` (generic pointer `tile_ptr`, the same
// memory). Rows >= valid_rows are zero-filled and never read: rows outside the sequence may
// hold NaN, and 0 * NaN in an MMA would reach every row. valid_rows >= 1 (row 0 is the
// address the zero-filling copies name). kAligned16: every row and `src` 16-byte aligned
// (cp.async.cg of 16 bytes); else 4-byte aligned (cp.async.ca of 4 bytes, four per chunk).
//
// Thread t copies chunks t % 8 + 8 q of rows t / 8 + kRowStep p: a warp covers four whole
// 128-byte lines per instruction, and the thread's rows share row % 8, so its swizzled chunk
// within a line is one per-thread constant and every shared offset an immediate beside it.
template <typename Elem, int kTileRows, int kChunks, int kThreads, bool kAligned16>
__device__ __forceinline__ void copy_rows(uint32_t tile, unsigned char* tile_ptr, const Elem* src, int64_t stride,
                                          int valid_rows, int tid) {
  constexpr int kLineChunks = 8;  // 16-byte chunks per 128-byte line
  constexpr int kRowStep = kThreads / kLineChunks;
  constexpr int kRowBytes = kChunks * 16;
  constexpr int kChunkElems = 16 / static_cast<int>(sizeof(Elem));
  static_assert(kChunks % kLineChunks == 0 && kTileRows % kRowStep == 0 && kRowStep % 8 == 0,
                "whole lines, whole row steps, one row % 8 per thread");
  const int row0 = tid / kLineChunks, chunk0 = tid % kLineChunks;
  const uint32_t offset0 = tile_offset(row0, chunk0, kRowBytes);
  const Elem* first_row = src + chunk0 * kChunkElems;  // row 0: the address of skipped copies
  src = first_row + row0 * stride;
#pragma unroll
  for (int p = 0; p < kTileRows / kRowStep; ++p) {
    const bool ok = row0 + p * kRowStep < valid_rows;
    const Elem* from = ok ? src : first_row;
#pragma unroll
    for (int q = 0; q < kChunks / kLineChunks; ++q) {
      const uint32_t offset = offset0 + p * kRowStep * kRowBytes + q * kLineChunks * 16;
      const Elem* chunk = from + q * kLineChunks * kChunkElems;
      if constexpr (kAligned16) {
        device::cp_async_16_or_zero(tile + offset, chunk, ok);
      } else if (ok) {
#pragma unroll
        for (int w = 0; w < 4; ++w) device::cp_async_4(tile + offset + 4 * w, chunk + w * (kChunkElems / 4));
      } else {
        *reinterpret_cast<uint4*>(tile_ptr + offset) = make_uint4(0, 0, 0, 0);
      }
    }
    src += kRowStep * stride;
  }
}

// copy_rows with the alignment known at run time (a CTA-uniform flag): 16-byte copies when
// every row and `src` are 16-byte aligned, 4-byte ones otherwise.
template <typename Elem, int kTileRows, int kChunks, int kThreads>
__device__ __forceinline__ void copy_rows_aligned_as(bool aligned16, uint32_t tile, unsigned char* tile_ptr,
                                                     const Elem* src, int64_t stride, int valid_rows, int tid) {
  if (aligned16) {
    copy_rows<Elem, kTileRows, kChunks, kThreads, true>(tile, tile_ptr, src, stride, valid_rows, tid);
  } else {
    copy_rows<Elem, kTileRows, kChunks, kThreads, false>(tile, tile_ptr, src, stride, valid_rows, tid);
  }
}

// The grid of the MHA kernels: (tiles, heads, b) with y and z capped at CUDA's 65535; the
// kernels walk the heads and sequences past the caps (head += gridDim.y, seq += gridDim.z).
inline dim3 tiles_heads_batch_grid(int64_t tiles, int heads, int b) {
  constexpr int kGridYZLimit = 65535;
  return dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(heads < kGridYZLimit ? heads : kGridYZLimit),
              static_cast<unsigned>(b < kGridYZLimit ? b : kGridYZLimit));
}

// Rows of a [rows, heads, d] tensor of 16-bit values start 16-byte aligned: the base pointer
// and the token / head strides (in elements). The kernels' copies take 16-byte chunks then.
inline bool rows_aligned16(const void* ptr, int64_t stride_t, int64_t stride_h) {
  return reinterpret_cast<uintptr_t>(ptr) % 16 == 0 && stride_t % 8 == 0 && stride_h % 8 == 0;
}

}  // namespace mlakit::detail::mha_portable
