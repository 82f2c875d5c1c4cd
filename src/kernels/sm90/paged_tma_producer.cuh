// Producer role of the Hopper dense decode: warps of warpgroup 0 look up the block table and
// issue the TMA loads of 64-key cache tiles, tile j of a segment into stage j % 2.
#pragma once

#include <cuda.h>

#include "device/sm90/swizzle.cuh"
#include "device/sm90/sync.cuh"
#include "device/sm90/warpgroup.cuh"
#include "kernels/sm90/mla_config.cuh"
#include "kernels/sm90/timeline.cuh"

namespace mlakit::detail::sm90 {

// Warps of the producer warpgroup that load a tile: warp w issues box w of every slab, so the
// 36 boxes per tile of 16-row pages leave four warps at once. Four lanes of one warp issuing
// them (divergent TMA coordinates) made page 16 11% slower (H100, b128 s_k~4k: 337 vs 303 us).
__device__ __forceinline__ int producer_warps(int box_rows) { return Sm90MlaConfig::kKeys / box_rows; }

// Run by warps 0 .. producer_warps(box_rows) - 1 of warpgroup 0; each arrives once per slab
// group of every tile (the full barriers count producer_warps arrivals).
__device__ __forceinline__ void produce(const DenseDecodeParams& p, const CUtensorMap& kv_map, int box_rows,
                                        Sm90MlaSmem& sm) {
  namespace dev = mlakit::device::sm90;
  using C = Sm90MlaConfig;
  const int lane = threadIdx.x % dev::kWarpSize, warp = threadIdx.x / dev::kWarpSize;
  const int hk = blockIdx.y, tile = blockIdx.x;
  const int boxes = producer_warps(box_rows);
  const uint32_t box_bytes = static_cast<uint32_t>(box_rows) * dev::kSwizzleRowBytes;  // one box of one slab
  if (lane == 0) dev::tma_prefetch_descriptor(&kv_map);
  uint32_t phases = 0;  // bit s: parity of stage s's current lap (a bit mask: no local memory)
  for_each_segment(p.core, p.schedule, p.schedule.part_ranges[blockIdx.z], [&](int seq, int L, int key_begin, int key_end, int) {
    const int tiles = segment_tiles(p.core, hk, tile, L, key_begin, key_end);
    for (int i = 0; i < tiles; ++i) {
      const int stage = i % C::kStages;
      const int tile_start = key_begin + i * C::kKeys;
      // Lane j looks up box j of the tile (every warp: all of them need the stage's bad flag);
      // entries past the segment are never read.
      const int key0 = tile_start + lane * box_rows;
      bool valid = lane < boxes && key0 < key_end;
      bool bad = false;
      int32_t block = 0;
      if (valid) {
        const int logical = key0 / p.cache.page_size;
        block = logical < p.cache.max_blocks_per_seq ? p.cache.block_table[seq * p.cache.block_table_stride_b + logical] : -1;
        bad = block < 0 || block >= p.cache.num_blocks;
        valid = !bad;
      }
      const bool any_bad = __any_sync(0xffffffffu, bad);
      // This warp's box, issued by its lane 0 with warp-uniform coordinates.
      const bool mine = __shfl_sync(0xffffffffu, valid, warp);
      const int32_t my_block = __shfl_sync(0xffffffffu, block, warp);
      const int my_row = mine ? (tile_start + warp * box_rows) % p.cache.page_size : 0;
      // Slab-major, each group of slabs on the barrier of its last slab
      // (Sm90MlaConfig::group_last_slab): the consumer starts S on the first group while the
      // later slabs are still in flight. Slabs 0..3 go as soon as their half of the stage is
      // free, 4..8 after the other.
      const uint32_t parity = ((phases >> stage) & 1u) ^ 1u;
      // Lane 0 issues the copies of a half, then arrives on its groups: an arrive (a release)
      // between two copies delayed the later ones (page 64 1.5% slower).
      auto issue_copies = [&](int first, int end) {
        for (int s = first; mine && s < end; ++s) {
          uint64_t* bar = &sm.full[stage][C::group_last_slab(s)];
          dev::mbarrier_expect_tx(bar, box_bytes);
          dev::tma_load_4d(&sm.kv[stage][s][warp * box_rows * dev::kSwizzleRowBytes], &kv_map, bar, s * C::kSlabCols, hk, my_row,
                           my_block);
        }
      };
      auto arrive_groups = [&](int first, int end) {
        for (int s = first; s < end; ++s) {
          if (C::group_last_slab(s) == s) dev::mbarrier_arrive(&sm.full[stage][s]);
        }
      };
      dev::mbarrier_wait(&sm.empty[stage][C::kLowSlabs], parity);
      MLAKIT_SM90_STAMP(kProducerStageLowFree);
      if (lane == 0) {
        issue_copies(0, C::kFirstHighSlab);
        arrive_groups(0, C::kFirstHighSlab);
      }
      __syncwarp();  // reconverged before the next wait
      dev::mbarrier_wait(&sm.empty[stage][C::kHighSlabs], parity);
      MLAKIT_SM90_STAMP(kProducerStageHighFree);
      if (lane == 0) {
        issue_copies(C::kFirstHighSlab, C::kSlabs);
        // The consumers read the flag after their wait on slab 8, which these arrives complete
        // (release); every warp computed the same any_bad, warp 0 writes it.
        if (warp == 0) sm.stage_bad[stage] = any_bad ? 1 : 0;
        arrive_groups(C::kFirstHighSlab, C::kSlabs);
      }
      __syncwarp();
      MLAKIT_SM90_STAMP(kProducerTileIssued);
      phases ^= 1u << stage;
    }
  });
}

}  // namespace mlakit::detail::sm90
