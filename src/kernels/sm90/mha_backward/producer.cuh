// The producer warp of the Hopper MHA backward: K and V of the CTA's keys once, then Q and dO
// of every query tile of the walk through two stages, all by TMA.
//
// Boxes are 64 columns x 1 head x a tile of tokens of the 4D maps {d, heads, tokens, 1}, so
// a tile that crosses its sequence's end carries the next sequence's rows, or rows of no
// sequence (which may hold NaN). Those rows are masked in the scores, but a masked P or dS of
// 0 times a NaN row is NaN in the wgmma: such a tile lands on a private barrier first, the
// warp zeroes its rows past the end (generic-proxy stores, then a proxy fence), and only then
// arrives on the barrier the consumers wait on.
#pragma once

#include <cmath>

#include "device/numeric.cuh"
#include "device/sm90/sync.cuh"
#include "device/sm90/warpgroup.cuh"
#include "kernels/sm90/launch.h"
#include "kernels/sm90/mha_backward/config.cuh"
#include "kernels/sm90/mha_backward/work.cuh"

namespace mlakit::detail::mha_bwd_sm90 {

// `slabs` 64-column boxes of `map` at (head, token) into consecutive slabs of `dst`.
__device__ __forceinline__ void load_slabs(uint8_t* dst, int slabs, int slab_bytes, const CUtensorMap* map,
                                           uint64_t* bar, int head, int64_t token) {
  for (int s = 0; s < slabs; ++s) {
    dev::tma_load_4d(dst + s * slab_bytes, map, bar, s * 64, head, static_cast<int32_t>(token), 0);
  }
}

// Zeroes rows [first_row, rows) of `slabs` slabs of `rows` 128-byte rows: whole rows, so the
// swizzle does not matter. The warp's 32 lanes share the 16-byte stores.
__device__ __forceinline__ void zero_rows(uint8_t* base, int slabs, int rows, int first_row, int lane) {
  const int chunks = (rows - first_row) * dev::kSwizzleRowChunks;
  for (int s = 0; s < slabs; ++s) {
    const uint32_t slab = dev::smem_u32(base + s * rows * dev::kSwizzleRowBytes) + first_row * dev::kSwizzleRowBytes;
    for (int c = lane; c < chunks; c += dev::kWarpSize) {
      dev::st_shared_16(slab + c * dev::kSwizzleChunkBytes, make_uint4(0, 0, 0, 0));
    }
  }
}

// Run by the 32 lanes of the producer warp; lane 0 issues the copies.
template <class C>
__device__ __forceinline__ void produce(const MhaBackwardParams& p, const MhaBackwardMaps& maps,
                                        const BackwardWork& w, Smem<C>& sm, int lane) {
  if (w.tiles == 0) return;  // no query sees the keys: nothing loaded (nobody would wait for it)
  const bool leader = lane == 0;
  if (leader) {
    dev::tma_prefetch_descriptor(&maps.k);
    dev::tma_prefetch_descriptor(&maps.v);
    dev::tma_prefetch_descriptor(&maps.q);
    dev::tma_prefetch_descriptor(&maps.dout);
  }
  // K and V, once.
  const int64_t key_token = int64_t{w.k_begin} + w.key0;
  const int valid_keys = w.k_rows - w.key0;
  uint64_t* kv_bar = valid_keys >= C::kBlockN ? &sm.kv_full : &sm.kv_landed;
  if (leader) {
    dev::mbarrier_expect_tx(kv_bar, C::kKBytes + C::kVBytes);
    dev::mbarrier_arrive(kv_bar);
    load_slabs(&sm.k[0][0], C::kQkSlabs, C::kKvSlabBytes, &maps.k, kv_bar, w.kv_head, key_token);
    load_slabs(&sm.v[0][0], C::kVSlabs, C::kKvSlabBytes, &maps.v, kv_bar, w.kv_head, key_token);
  }
  if (valid_keys < C::kBlockN) {
    __syncwarp();
    dev::mbarrier_wait(&sm.kv_landed, 0);
    zero_rows(&sm.k[0][0], C::kQkSlabs, C::kBlockN, valid_keys, lane);
    zero_rows(&sm.v[0][0], C::kVSlabs, C::kBlockN, valid_keys, lane);
    dev::fence_proxy_async_smem();  // the zeros, visible to the consumers' wgmma (async proxy)
    __syncwarp();
    if (leader) dev::mbarrier_arrive(&sm.kv_full);
  }
  // Q and dO of every query tile.
  uint32_t landed_uses = 0;
#pragma unroll 1
  for (int it = 0; it < w.tiles; ++it) {
    // The warp together per tile: q_landed is the leader's alone, so a lane a whole copy behind
    // it over two partial tiles could otherwise wait on a parity two phases old.
    __syncwarp();
    const int stage = it % C::kStages;
    const uint32_t free_parity = ((it / C::kStages) & 1) ^ 1;  // a fresh barrier passes parity 1
    const int head = tile_head<C>(p, w, it), row0 = tile_row0<C>(w, it);
    const int64_t token = int64_t{w.q_begin} + row0;
    const int valid_rows = w.q_rows - row0;
    const bool partial = valid_rows < C::kBlockM;  // the last tile of a head: at most once per head
    uint64_t* bar = partial ? &sm.q_landed : &sm.q_full[stage];
    for (int g = 0; g < C::kConsumers; ++g) dev::mbarrier_wait(&sm.q_empty[stage][g], free_parity);
    if (leader) {
      dev::mbarrier_expect_tx(bar, C::kQBytes + C::kDoBytes);
      if (partial) dev::mbarrier_arrive(bar);  // q_landed: the warp's own wait, one arrival
      load_slabs(&sm.q[stage][0][0], C::kQkSlabs, C::kQSlabBytes, &maps.q, bar, head, token);
      load_slabs(&sm.dout[stage][0][0], C::kVSlabs, C::kQSlabBytes, &maps.dout, bar, head, token);
    }
    // The rows' lse (base 2) and D, by plain loads while the copies fly: each lane's stores come
    // before its own arrival on q_full (release; kFullArrivals, the leader's included), which
    // the consumers' wait (acquire) pairs with.
    for (int r = lane; r < C::kBlockM; r += dev::kWarpSize) {
      const bool in = r < valid_rows;
      const int64_t t = token + r;
      sm.lse2[stage][r] = in ? p.lse[head * p.lse_stride_h + t * p.lse_stride_t] * device::kLog2e : INFINITY;
      sm.row_dot[stage][r] = in ? p.row_dot[head * p.total_q + t] : 0.f;
    }
    if (partial) {
      dev::mbarrier_wait(&sm.q_landed, landed_uses & 1);
      ++landed_uses;
      zero_rows(&sm.q[stage][0][0], C::kQkSlabs, C::kBlockM, valid_rows, lane);
      zero_rows(&sm.dout[stage][0][0], C::kVSlabs, C::kBlockM, valid_rows, lane);
      dev::fence_proxy_async_smem();  // each lane's zeros, visible to the wgmma (async proxy)
    }
    dev::mbarrier_arrive(&sm.q_full[stage]);
  }
}

}  // namespace mlakit::detail::mha_bwd_sm90
