// The dQ writer of the Hopper MHA backward (lane 0 of the producer warpgroup's second warp):
// adds each query tile's dQ, staged by both consumers in fragment order, into the tile's
// dq_accum slot (common/mha_backward_tiling.h) with one bulk reduction of 64 x d_qk floats (16, 32
// or 48 KiB; the two consumers' parts are adjacent in the staging and in the slot).
//
// The consumers only stage and arrive (dq_full); waiting for the add to have read the staging,
// and in the deterministic mode for the query tile's turn and for the add to be made, happens
// here, off the consumers' path: a consumer waits (dq_empty) only when it has the next tile's
// dQ ready before this add has read the previous one.
#pragma once

#include <cstdint>

#include "common/mha_backward_tiling.h"
#include "device/async_proxy.cuh"
#include "device/gpu_flag.cuh"
#include "device/sm90/sync.cuh"
#include "kernels/sm90/mha_backward/config.cuh"
#include "kernels/sm90/mha_backward/work.cuh"

namespace mlakit::detail::mha_bwd_sm90 {

// Deterministic mode: the key tiles add into a query tile's slot from the last one that sees
// it down to 0, ordered by the tile's counter (the portable kernel's protocol): wait for this
// key tile's turn, add, wait for the add to be made (not only issued), advance the counter.
template <class C>
__device__ __forceinline__ void write_dq(const MhaBackwardParams& p, const BackwardWork& w, Smem<C>& sm) {
  static_assert(sizeof(sm.dq) == C::kBlockM * C::kDqk * 4, "both consumers' parts, adjacent: the slot's block");
#pragma unroll 1
  for (int it = 0; it < w.tiles; ++it) {
    const int head = tile_head<C>(p, w, it), row0 = tile_row0<C>(w, it);
    dev::mbarrier_wait(&sm.dq_full, it & 1);
    const int64_t slot = mha_backward_dq_slot(w.q_begin, w.batch, row0 / C::kBlockM);
    int32_t* counter = nullptr;
    int32_t turn = 0;
    if (p.deterministic) {
      counter = p.counters + mha_backward_counter(w.batch, head, p.h_q, p.query_tiles, row0 / C::kBlockM);
      turn = last_key_tile<C>(p, w, row0) - w.key_tile;
      device::wait_until_equal(counter, turn);
    }
    if (slot >= 0 && slot < p.dq_slots) {  // always, within the data rules of the prefix sums
      device::bulk_reduce_add_f32(p.dq_accum + mha_backward_dq_block(slot, head, p.h_q, C::kDqk),
                                  dev::smem_u32(&sm.dq[0][0]), sizeof(sm.dq));
      device::bulk_commit_group();
    }
    device::bulk_wait_reads();
    dev::mbarrier_arrive(&sm.dq_empty);  // the consumers may stage the next tile
    if (p.deterministic) {
      // The add made: the wait without .read returns once its writes are visible to this
      // thread, and the completion carries an implicit generic-async proxy fence (PTX ISA,
      // cp.async.bulk completion mechanisms); the release store is cumulative over them. No
      // separate fence: one on every tile sat on the chain of key tiles' turns.
      device::bulk_wait_all();
      device::store_release_gpu(counter, turn + 1);
    }
  }
  device::bulk_wait_all();  // the default mode's last add made before the CTA ends
}

}  // namespace mlakit::detail::mha_bwd_sm90
