// S = Q K^T of a Hopper consumer's own cache tile (64 x 64 over d_qk = 576: 36 wgmma
// m64n64k16, K-major A and B, 128B swizzle, SBO 1024), issued as one committed group as the
// tile's slabs land, and the per-tile flags the producer leaves with the tile (the bad flag of
// a TMA tile, the valid-slot mask of a gathered one).
#pragma once

#include <cstdint>

#include "device/sm90/swizzle.cuh"
#include "device/sm90/sync.cuh"
#include "device/sm90/warpgroup.cuh"
#include "device/sm90/wgmma.cuh"
#include "kernels/sm90/consumer_handoff.cuh"
#include "kernels/sm90/consumer_options.cuh"
#include "kernels/sm90/consumer_thread.cuh"
#include "kernels/sm90/mla_config.cuh"
#include "kernels/sm90/timeline.cuh"

namespace mlakit::detail::sm90 {

template <class Options>
class ScoreTiles {
  using C = Sm90MlaConfig;
  using Elem = typename Options::Elem;
  using Mma64 = device::sm90::Wgmma<64, Elem>;
  static constexpr bool kGathered = kGatheredTiles<Options>;
  static_assert(kScoreSlabs<Options> == C::kSlabs || (kGathered && kScoreSlabs<Options> > C::kFirstHighSlab),
                "fewer score slabs: gathered tiles only (TMA tiles complete per slab group), the high half not empty");

 public:
  __device__ ScoreTiles(Sm90MlaSmem& sm, ConsumerThread me) : sm_(sm), me_(me) {}

  // Issues S of the tile in `stage` (keys tile_start ..; the segment ends at key_end) and
  // returns the tile's bad flag. A tile that extends past the segment gets its rows past the
  // segment zeroed first (prepare_tile).
  //   TMA tiles: each slab group's k-steps as soon as that group has landed (S overlaps the
  //   tile's own load).
  //   Gathered tiles (st.shared, cp.async: the generic proxy) need a proxy fence between the
  //   wait and the wgmma reads (the async proxy): the two-way fence.proxy.async (MEMBAR.ALL.CTA +
  //   FENCE.VIEW.ASYNC.S), by each reading thread after the barrier that showed it the data.
  //   The one-way fence.proxy.async::generic.acquire.sync_restrict::shared::cluster that stood
  //   here from b1fae7c covers shared::cluster objects only: ptxas emitted a NOP, wgmma read
  //   tiles before the producer's writes reached the async proxy, and the FP8 decode returned
  //   different bits in 61-89 of 90 calls on the same inputs, NaN rows in 16-27 (stale or
  //   uninitialised shared memory; H100, 2026-11-24, docs/kernels/mla_sparse_decode_sm90.md).
  //   The MEMBAR waits for this warpgroup's wgmmas in flight, so the fences sit where few are.
  __device__ bool issue(float (&s)[32], int stage, int tile_start, int key_end, ConsumerHandoffs<Elem>& handoffs) {
    namespace dev = device::sm90;
    prepare_tile(stage, tile_start, key_end, handoffs);
    const uint64_t q_desc = dev::opaque_desc(dev::make_sw128_desc(dev::smem_u32(&sm_.q[0][0]), 16, 1024));
    const uint64_t k_desc = dev::opaque_desc(dev::make_sw128_desc(dev::smem_u32(&sm_.kv[stage][0][0]), 16, 1024));
    if constexpr (Options::kTiles == KeyTiles::kGatheredHalves) {
      await_slabs(stage, C::kGatheredLowHalfBarrier, C::kGatheredLowHalfBarrier + 1);
      // A thread that finds the high half landed too fences once for both halves; the others
      // fence again after waiting for it, and that fence's MEMBAR waits for the low half's
      // k-steps in flight (a gap in the tensor pipe), so it is kept to tiles that need it.
      const bool high_landed = dev::mbarrier_test_wait(&sm_.full[stage][C::kGatheredTileBarrier], phase_);
      dev::fence_proxy_async_smem();
      dev::wgmma_fence();
      issue_slabs(s, q_desc, k_desc, 0, C::kFirstHighSlab);
      if (!high_landed) {
        await_slabs(stage, C::kGatheredTileBarrier, C::kSlabs);
        dev::fence_proxy_async_smem();
      }
      dev::wgmma_fence();
      issue_slabs(s, q_desc, k_desc, C::kFirstHighSlab, kScoreSlabs<Options>);
      MLAKIT_SM90_STAMP(kConsumerHighIssued);
    } else if constexpr (kGathered) {
      await_tile(stage);
      dev::fence_proxy_async_smem();
      dev::wgmma_fence();
      issue_slabs(s, q_desc, k_desc, 0, kScoreSlabs<Options>);
    } else {
      dev::wgmma_fence();
#pragma unroll
      for (int slab = 0; slab < C::kSlabs; ++slab) {
        if (C::group_last_slab(slab) != slab) continue;
        await_slabs(stage, slab, slab + 1);  // the group ending at this slab has landed
        issue_slabs(s, q_desc, k_desc, C::group_first_slab(slab), slab + 1);
      }
    }
    dev::wgmma_commit();
    phase_ ^= 1;
    return stage_bad(stage);
  }

  // The producer's bad-block flag of a stage's tile. Lane 0 of each warp reads it and arrives
  // on the stage's empty barriers (the consumer's release), so its read is ordered before the
  // producer's next write by the reading thread's own arrival; the other lanes get it by shuffle.
  __device__ bool stage_bad(int stage) const {
    if constexpr (kGathered) return false;  // gathering producers mask bad slots out instead
    const int bad = me_.lane == 0 ? sm_.stage_bad[stage] : 0;
    return __shfl_sync(0xffffffffu, bad, 0) != 0;
  }

  // The valid-slot bits of the gathered tile in `stage` for this thread's 16 score columns
  // 8j + 2 (lane % 4) + {0, 1}, j = 0..7, as bits 2j, 2j + 1.
  __device__ uint32_t gathered_mask(int stage) const {
    // The four warps' 16-bit words in one load (key 8 j + c is bit 8 j + c), by lane 0, which
    // arrives on the stage's empty barrier after it (stage_bad says why).
    uint64_t loaded = 0;
    if (me_.lane == 0) loaded = *reinterpret_cast<const uint64_t*>(sm_.key_valid[stage]);
    const uint64_t words = static_cast<uint64_t>(__shfl_sync(0xffffffffu, static_cast<unsigned long long>(loaded), 0)) >>
                           (2 * (me_.lane % 4));
    uint32_t bits = 0;
#pragma unroll
    for (int j = 0; j < 8; ++j) bits |= static_cast<uint32_t>((words >> (8 * j)) & 3u) << (2 * j);
    return bits;
  }

 private:
  // A tile that extends past the segment is waited for whole and its cache rows past the
  // segment (stale, or NaN past the sequence end) are zeroed in the V slabs, so 0-weight P
  // entries cannot meet NaN in P·V (the other consumer reads them only after this consumer's
  // P hand-off). Full tiles are waited for in issue.
  __device__ void prepare_tile(int stage, int tile_start, int key_end, ConsumerHandoffs<Elem>& handoffs) {
    const int valid_rows = min(C::kKeys, key_end - tile_start);
    if (valid_rows == C::kKeys) return;
    await_tile(stage);
    // Whole rows are zeroed, so the chunks' order within a row (the swizzle) does not matter.
    namespace dev = device::sm90;
    const int chunks_per_row = C::kNopeSlabs * dev::kSwizzleRowChunks;
    const int chunks = (C::kKeys - valid_rows) * chunks_per_row;
    for (int c = me_.t % dev::kWarpgroupThreads; c < chunks; c += dev::kWarpgroupThreads) {
      const int r = valid_rows + c / chunks_per_row, k = c % chunks_per_row;
      *reinterpret_cast<uint4*>(&sm_.kv[stage][k / dev::kSwizzleRowChunks][r * dev::kSwizzleRowBytes +
                                                                            (k % dev::kSwizzleRowChunks) * dev::kSwizzleChunkBytes]) =
          make_uint4(0, 0, 0, 0);
    }
    device::sm90::fence_proxy_async_smem();
    const int zeroed = me_.w == 0 ? C::kZeroed0 : C::kZeroed1;
    handoffs.arrive(zeroed);
    handoffs.await(zeroed);
  }

  // Waits for the whole tile of a stage: its one barrier (gathered tiles), or the barrier of
  // each slab group (TMA tiles).
  __device__ void await_tile(int stage) {
    if constexpr (kGathered) {
      await_slabs(stage, C::kGatheredTileBarrier, C::kSlabs);
    } else {
#pragma unroll
      for (int slab = 0; slab < C::kSlabs; ++slab) {
        if (C::group_last_slab(slab) == slab) await_slabs(stage, slab, slab + 1);
      }
    }
  }

  // Waits for slabs [first, end) of a stage's tile (this lap's parity).
  __device__ void await_slabs(int stage, int first, int end) {
#pragma unroll
    for (int slab = first; slab < end; ++slab) {
      device::sm90::mbarrier_wait(&sm_.full[stage][slab], phase_);
      constexpr int kFirstBarrier = Options::kTiles == KeyTiles::kGatheredHalves ? C::kGatheredLowHalfBarrier
                                    : kGathered                                  ? C::kGatheredTileBarrier
                                                                                 : C::group_last_slab(0);
      if (slab == kFirstBarrier) MLAKIT_SM90_STAMP(kConsumerFirstSlab);
      if (slab == C::kSlabs - 1) MLAKIT_SM90_STAMP(kConsumerLastSlab);
    }
  }

  // The 4 k-steps of each of slabs [first, end) into S (the first k-step overwrites S).
  __device__ void issue_slabs(float (&s)[32], uint64_t q_desc, uint64_t k_desc, int first, int end) {
#pragma unroll
    for (int slab = first; slab < end; ++slab) {
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int kk = 4 * slab + k;
        const uint32_t offset = slab * C::kSlabBytes + k * 32;
        Mma64::template ss<0>(s, device::sm90::advance_desc(q_desc, offset), device::sm90::advance_desc(k_desc, offset),
                              kk > 0);
      }
    }
  }

  Sm90MlaSmem& sm_;
  const ConsumerThread me_;  // by value: plain registers, no address taken
  uint32_t phase_ = 0;       // parity of this consumer's next wait on full[stage][*]
};

}  // namespace mlakit::detail::sm90
