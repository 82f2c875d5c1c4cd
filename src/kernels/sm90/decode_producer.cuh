// Producer role of the Hopper dense decode: warp 0 of warpgroup 0 looks up the block table
// and issues the TMA loads of 64-key cache tiles, tile j of a segment into stage j % 2.
#pragma once

#include <cuda.h>

#include "device/sm90/sync.cuh"
#include "kernels/sm90/decode_config.cuh"
#include "kernels/sm90/timeline.cuh"

namespace mlakit::detail::sm90 {

__device__ __forceinline__ void produce(const MlaDecodeParams& p, const CUtensorMap& kv_map, int box_rows,
                                        Sm90DecodeSmem& sm) {
  namespace dev = mlakit::device::sm90;
  using C = Sm90DecodeConfig;
  const int lane = threadIdx.x % 32;
  const int hk = blockIdx.y, tile = blockIdx.x;
  const int boxes = C::kKeys / box_rows;
  const uint32_t box_bytes = static_cast<uint32_t>(box_rows) * 128;  // one box of one slab
  if (lane == 0) dev::tma_prefetch_descriptor(&kv_map);
  uint32_t phases = 0;  // bit s: parity of stage s's current lap (a bit mask: no local memory)
  for_each_segment(p, p.part_ranges[blockIdx.z], [&](int seq, int L, int key_begin, int key_end, int) {
    const int tiles = segment_tiles(p, hk, tile, L, key_begin, key_end);
    for (int i = 0; i < tiles; ++i) {
      const int stage = i % C::kStages;
      const int tile_start = key_begin + i * C::kKeys;
      // Lane j looks up box j of the tile; entries past the segment are never read.
      const int key0 = tile_start + lane * box_rows;
      bool valid = lane < boxes && key0 < key_end;
      bool bad = false;
      int32_t block = 0;
      if (valid) {
        const int logical = key0 / p.page_size;
        block = logical < p.max_blocks_per_seq ? p.block_table[seq * p.block_table_stride_b + logical] : -1;
        bad = block < 0 || block >= p.num_blocks;
        valid = !bad;
      }
      const bool any_bad = __any_sync(0xffffffffu, bad);
      // Each lane issues its own box (16-row pages: 4 lanes at once), slab-major, each group of
      // slabs on the barrier of its last slab (Sm90DecodeConfig::group_last_slab): the
      // consumer starts S on the first group while the later slabs are still in
      // flight. Slabs 0..3 go as soon as their half of the stage is free, 4..8 after the other.
      const uint32_t parity = ((phases >> stage) & 1u) ^ 1u;
      const int row_in_page = valid ? key0 % p.page_size : 0;
      auto load_slabs = [&](int first, int end) {
        if (valid) {
          for (int s = first; s < end; ++s) {
            uint64_t* bar = &sm.full[stage][C::group_last_slab(s)];
            dev::mbarrier_expect_tx(bar, box_bytes);
            dev::tma_load_4d(&sm.kv[stage][s][lane * box_rows * 128], &kv_map, bar, s * C::kSlabCols, hk, row_in_page,
                             block);
          }
        }
        __syncwarp();  // every expect_tx before the arrive that can complete the phase
      };
      dev::mbarrier_wait(&sm.empty[stage][C::kLowSlabs], parity);
      MLAKIT_SM90_STAMP(kProducerStageLowFree);
      load_slabs(0, C::kFirstHighSlab);
      if (lane == 0) {
        for (int s = 0; s < C::kFirstHighSlab; ++s) {
          if (C::group_last_slab(s) == s) dev::mbarrier_arrive(&sm.full[stage][s]);
        }
      }
      dev::mbarrier_wait(&sm.empty[stage][C::kHighSlabs], parity);
      MLAKIT_SM90_STAMP(kProducerStageHighFree);
      load_slabs(C::kFirstHighSlab, C::kSlabs);
      if (lane == 0) {
        // The consumers read the flag after their wait on slab 8 (release by this arrive).
        sm.stage_bad[stage] = any_bad ? 1 : 0;
        for (int s = C::kFirstHighSlab; s < C::kSlabs; ++s) {
          if (C::group_last_slab(s) == s) dev::mbarrier_arrive(&sm.full[stage][s]);
        }
      }
      MLAKIT_SM90_STAMP(kProducerTileIssued);
      phases ^= 1u << stage;
    }
  });
}

}  // namespace mlakit::detail::sm90
