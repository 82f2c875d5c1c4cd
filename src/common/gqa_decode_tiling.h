// Tiling of the GQA decode kernel (src/kernels/gqa/gqa_decode_kernel.cuh) as constexpr
// functions of the cache element size and the head dim, shared by the kernel and the host
// layout (src/host/gqa_decode_layout.cpp): the planner's row tiles, key blocks and CTAs per SM
// must be the kernel's.
//
// A CTA holds 16 query rows (one mma.sync M tile) of one kv head and streams 64-key tiles of K
// and V through a multi-stage cp.async pipeline; each of its 4 warps takes 16 keys of a tile.
// Stages: as many as keep the CTA within 112 KB (2 to 4), so that two CTAs share an SM (227
// KB) up to d = 128 and every SM keeps 64 KB or more of K/V loads in flight.
#pragma once

namespace mlakit::detail::gqa_tiling {

inline constexpr int kRows = 16;        // query rows per CTA
inline constexpr int kKeys = 64;        // keys per pipeline stage (= the planner's block_n)
inline constexpr int kWarps = 4;
inline constexpr int kThreads = kWarps * 32;
inline constexpr int kKeysPerWarp = kKeys / kWarps;
inline constexpr int kOverheadBlocks = 2;  // a segment's fixed cost (Q load, store, pipeline fill)
inline constexpr int kSmemTargetBytes = 112 * 1024;

// One cached row of d values, unpadded: the kernel swizzles a tile's 16-byte chunks within
// their 128-byte lines instead (GqaDecodeTile::line_address), so that a row's bytes keep
// their global alignment in shared memory.
constexpr int row_bytes(int cache_bytes, int d) { return d * cache_bytes; }
constexpr int elem_pitch(int d) { return d + 8; }  // 16-bit elements: the Q rows
constexpr int stage_bytes(int cache_bytes, int d) { return 2 * kKeys * row_bytes(cache_bytes, d); }
// Per stage: the K and V tiles, their 64 + 64 float scales and the 64 keys' locations (the
// kernel's GqaKeyLocation: K row offset, block, row in the page).
inline constexpr int kKeyLocationBytes = 16;
constexpr int stage_with_scales_bytes(int cache_bytes, int d) {
  return stage_bytes(cache_bytes, d) + kKeys * (2 * 4 + kKeyLocationBytes);
}
// The end-of-segment merge of the 4 warps' partial outputs (floats), aliased on the stages.
constexpr int merge_bytes(int d) { return kWarps * kRows * d * 4; }
// Everything but the stages: Q, the warps' row maxima and sums, Q's row factors. (Quantized
// tiles are converted in registers, after the ldmatrix of the stored bytes.)
constexpr int fixed_bytes(int d) { return kRows * elem_pitch(d) * 2 + 2 * kWarps * kRows * 4 + kRows * 4; }
constexpr int stage_count(int cache_bytes, int d) {
  const int n = (kSmemTargetBytes - fixed_bytes(d)) / stage_with_scales_bytes(cache_bytes, d);
  return n < 2 ? 2 : (n > 4 ? 4 : n);
}
constexpr int smem_bytes(int cache_bytes, int d) {
  return stage_count(cache_bytes, d) * stage_with_scales_bytes(cache_bytes, d) + fixed_bytes(d);
}

}  // namespace mlakit::detail::gqa_tiling
