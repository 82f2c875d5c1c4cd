// The producer warp of the Hopper MHA prefill: the Q tile once, then K and V tiles through
// their stages by TMA, last key tile first.
//
// Boxes are 64 columns x 1 head x a tile of tokens of the 3D maps {d, heads, tokens}
// (make_mha_prefill_maps), so rows past the sequence's end are the next sequence's (or, past
// the tensor, TMA's zeros). Scores of those keys are masked, but P = 0 times a NaN value row
// would still be NaN: the one key tile that crosses the sequence's end (the first one run)
// lands on `v_landed` instead, the warp zeroes its rows past the end and only then releases
// it to the consumers on `v_full` (generic-proxy stores, so a proxy fence before the arrival).
#pragma once

#include "device/sm90/sync.cuh"
#include "device/sm90/warpgroup.cuh"
#include "kernels/sm90/launch.h"
#include "kernels/sm90/mha_prefill/config.cuh"
#include "kernels/sm90/mha_prefill/work_tile.cuh"

namespace mlakit::detail::mha_sm90 {

// One tile of `slabs` 64-column boxes starting at token `token` into consecutive slabs.
__device__ __forceinline__ void load_tile(uint8_t* dst, int slabs, int slab_bytes, const CUtensorMap* map,
                                          uint64_t* bar, int head, int token) {
  for (int s = 0; s < slabs; ++s) {
    dev::tma_load_4d(dst + s * slab_bytes, map, bar, s * 64, head, token, 0);
  }
}

// Zeroes rows [first_row, kBlockN) of every V slab of `stage`: whole 128-byte rows, so the
// swizzle does not matter. The 32 lanes of the warp share the 16-byte stores.
template <class C>
__device__ __forceinline__ void zero_v_rows(Smem<C>& sm, int stage, int first_row, int lane) {
  const int chunks = (C::kBlockN - first_row) * dev::kSwizzleRowChunks;
  for (int s = 0; s < C::kVSlabs; ++s) {
    const uint32_t base = dev::smem_u32(&sm.v[stage][s][0]) + first_row * dev::kSwizzleRowBytes;
    for (int c = lane; c < chunks; c += dev::kWarpSize) {
      dev::st_shared_16(base + c * dev::kSwizzleChunkBytes, make_uint4(0, 0, 0, 0));
    }
  }
}

// Run by the 32 lanes of the producer warp; lane 0 issues the copies.
template <class C>
__device__ __forceinline__ void produce(const MhaPrefillMaps& maps, const WorkTile& w, Smem<C>& sm, int lane) {
  const bool leader = lane == 0;
  if (leader) {
    dev::tma_prefetch_descriptor(&maps.q);
    dev::tma_prefetch_descriptor(&maps.k);
    dev::tma_prefetch_descriptor(&maps.v);
    dev::mbarrier_expect_tx(&sm.q_full, C::kQBytes);
    dev::mbarrier_arrive(&sm.q_full);
    load_tile(&sm.q[0][0], C::kQkSlabs, C::kQSlabBytes, &maps.q, &sm.q_full, w.head,
              w.q_begin + w.m_block * C::kBlockM);
  }
#pragma unroll 1
  for (int it = 0; it < w.n_blocks; ++it) {
    const int n = w.n_last - it;
    const int stage = it % C::kStages;
    const uint32_t free_parity = ((it / C::kStages) & 1) ^ 1;  // a fresh barrier passes parity 1
    const int token = w.k_begin + n * C::kBlockN;
    if (leader) {
      dev::mbarrier_wait(&sm.k_empty[stage], free_parity);
      dev::mbarrier_expect_tx(&sm.k_full[stage], C::kKBytes);
      dev::mbarrier_arrive(&sm.k_full[stage]);
      load_tile(&sm.k[stage][0][0], C::kQkSlabs, C::kKvSlabBytes, &maps.k, &sm.k_full[stage], w.kv_head, token);
    }
    const int valid_rows = w.k_len - n * C::kBlockN;
    if (valid_rows >= C::kBlockN) {
      if (leader) {
        dev::mbarrier_wait(&sm.v_empty[stage], free_parity);
        dev::mbarrier_expect_tx(&sm.v_full[stage], C::kVBytes);
        dev::mbarrier_arrive(&sm.v_full[stage]);
        load_tile(&sm.v[stage][0][0], C::kVSlabs, C::kKvSlabBytes, &maps.v, &sm.v_full[stage], w.kv_head, token);
      }
    } else {  // the tile crossing the sequence's end: the first one run, at most once per CTA
      if (leader) {
        dev::mbarrier_wait(&sm.v_empty[stage], free_parity);
        dev::mbarrier_expect_tx(&sm.v_landed, C::kVBytes);
        dev::mbarrier_arrive(&sm.v_landed);
        load_tile(&sm.v[stage][0][0], C::kVSlabs, C::kKvSlabBytes, &maps.v, &sm.v_landed, w.kv_head, token);
      }
      __syncwarp();
      dev::mbarrier_wait(&sm.v_landed, 0);
      zero_v_rows<C>(sm, stage, valid_rows, lane);
      dev::fence_proxy_async_smem();  // the zeros, visible to the consumers' wgmma (async proxy)
      __syncwarp();
      if (leader) dev::mbarrier_arrive(&sm.v_full[stage]);
    }
  }
}

}  // namespace mlakit::detail::mha_sm90
