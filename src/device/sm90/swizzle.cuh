// The 128-byte shared-memory swizzle of the Hopper kernels' tiles, one spelling for every
// copy that writes a tile by hand (cp.async, st.shared, stmatrix) instead of by TMA.
//
// A slab is rows of 128 bytes (64 16-bit values), 8 rows to a 1024-byte atom; 16-byte chunk c
// of row r is stored at chunk c ^ (r % 8) of that row, so the 8 rows' copies of one column
// chunk fall in 8 different bank groups. This is the layout that the wgmma descriptor of
// make_sw128_desc (wgmma.cuh: swizzle mode 1, "128B", PTX ISA 9.7.15.5.1.2.2) reads and that a
// TMA map with CU_TENSOR_MAP_SWIZZLE_128B writes; tiles are 1024-byte aligned, so r % 8 is the
// row's place in its atom.
#pragma once

namespace mlakit::device::sm90 {

inline constexpr int kSwizzleRowBytes = 128;   // one row of a swizzled slab
inline constexpr int kSwizzleChunkBytes = 16;  // the unit the swizzle permutes
inline constexpr int kSwizzleRowChunks = kSwizzleRowBytes / kSwizzleChunkBytes;

// Byte offset of chunk `chunk` (0..7) within row `row` of a slab: where the swizzle moves it.
// Only row % 8 matters (row & 7: rows are never negative, and it keeps the codegen of the
// former hand-written copies), so a row relative to any multiple of 8 rows works too.
__host__ __device__ __forceinline__ constexpr int sw128_chunk_offset(int row, int chunk) {
  return (chunk ^ (row & 7)) * kSwizzleChunkBytes;
}

// Byte offset of chunk `chunk` of row `row` from the start of the slab.
__host__ __device__ __forceinline__ constexpr int sw128_offset(int row, int chunk) {
  return row * kSwizzleRowBytes + sw128_chunk_offset(row, chunk);
}

}  // namespace mlakit::device::sm90
