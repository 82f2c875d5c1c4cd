// Gathering producer of the Hopper kernel for the sparse prefill: the 128 threads of
// warpgroup 0 copy the listed KV rows of a query token (kv [s_kv, 1, d_qk] in q's dtype,
// row = indices[token][key]) into the same 128B-swizzled 64-key tiles that the TMA producer
// fills for the dense decode, so the consumers run unchanged apart from a valid-slot mask.
//
// Per tile: warp w holds keys 16w..16w+15; lane 8q + c copies 16-byte chunk c of each
// 128-byte slab row of keys 16w + 4j + q (j < 4), so one warp-wide cp.async reads 4 whole
// rows (4 cache lines; half rows per thread made it 16 partial lines and took twice as long
// to issue). After its copies of slabs 0..3 the thread arrives on full[stage][3] (count 128),
// after its last copy of the tile on full[stage][8] (count 128, + 4 for the masks), both
// through cp.async.mbarrier.arrive.noinc: the consumers start S on the low half while the high
// half lands (kGatheredHalves; H100, same call, h_q 64: 1-2% faster). The slots of the
// next tile's keys are read while the current tile is copied, and every copy is one
// instruction (row base in a register, slab and chunk as immediate offsets). Slots outside
// [0, s_kv), -1 included, and keys past the token's length are zero-filled without a global
// read and left out of the mask (publish_valid_mask), which each warp's extra arrival on
// slab 8 releases (the cp.async arrivals do not order the mask write): slab 8's barrier is the
// one a gathered tile's consumer waits for (Sm90MlaConfig::kGatheredTileBarrier).
#pragma once

#include <cstdint>

#include "device/cp_async.cuh"
#include "device/sm90/swizzle.cuh"
#include "device/sm90/sync.cuh"
#include "device/sm90/warpgroup.cuh"
#include "kernels/sm90/mla_config.cuh"
#include "kernels/sm90/timeline.cuh"

namespace mlakit::detail::sm90 {

// Arrivals each full[stage][slab] barrier of a gathered tile expects, for both gathering
// producers (this one and the FP8 decode's): on the tile's barrier (slab 8) the 128 producer
// threads' cp.async arrivals (all their copies here; the RoPE copy there) and one ordinary
// arrival per producer warp after its last store and its lane 0's valid-slot mask; the other
// slabs' barriers are neither arrived at nor waited for.
__host__ __device__ constexpr int gathered_full_count(int slab) {
  return slab == Sm90MlaConfig::kGatheredTileBarrier
             ? device::sm90::kWarpgroupThreads + device::sm90::kWarpsPerWarpgroup
             : 1;
}

// This producer also completes each tile's low half on its own barrier (the 128 threads'
// cp.async arrivals after slab 3), for consumers that stream S by halves (kGatheredHalves).
__host__ __device__ constexpr int gathered_halves_full_count(int slab) {
  return slab == Sm90MlaConfig::kGatheredLowHalfBarrier ? device::sm90::kWarpgroupThreads : gathered_full_count(slab);
}

// Lane 0 of each producer warp writes the valid-slot mask of the warp's 16 keys (key 16w + j:
// bit j) for the consumers.
__device__ __forceinline__ void publish_valid_mask(Sm90MlaSmem& sm, int stage, uint32_t warp_mask) {
  using device::sm90::kWarpSize;
  if (threadIdx.x % kWarpSize == 0) sm.key_valid[stage][threadIdx.x / kWarpSize] = static_cast<uint16_t>(warp_mask);
}

// The warp's 16-bit key mask from a ballot in which lanes 2j and 2j + 1 hold key 16w + j (the
// FP8 producer's layout).
__device__ __forceinline__ uint32_t key_mask_of_lane_pairs(uint32_t ballot) {
  uint32_t mask = 0;
  for (int j = 0; j < 16; ++j) mask |= ((ballot >> (2 * j)) & 1u) << j;
  return mask;
}

// kSlabs: the slabs of a row copied, 9 (d_qk 576) or 8 (d_qk 512: the consumers compute S over
// slabs 0..7, kScoreSlabs, and slab 8 is left to P).
template <typename Elem, int kSlabs>
__device__ __forceinline__ void produce_gathered(const SparsePrefillParams& p, int tile, int seq, int L, Sm90MlaSmem& sm) {
  namespace dev = mlakit::device::sm90;
  using C = Sm90MlaConfig;
  constexpr int kRowsPerThread = 4;  // keys 16 w + 4 j + group
  const int lane = threadIdx.x % dev::kWarpSize, warp = threadIdx.x / dev::kWarpSize;
  const int group = lane / dev::kSwizzleRowChunks, chunk = lane % dev::kSwizzleRowChunks;
  const uint8_t* kv = static_cast<const uint8_t*>(p.keys.kv) + chunk * dev::kSwizzleChunkBytes;  // + row offset + 128 s
  const int32_t* indices = p.keys.indices + seq_offset(p.core, seq, p.keys.indices_stride_b, p.keys.indices_stride_s);
  static_assert(kSlabs == C::kSlabs || kSlabs == C::kNopeSlabs, "d_qk 576 or 512");
  const int tiles = segment_tiles(p.core, 0, tile, L, 0, L);
  auto slot_of = [&](int i, int j) {
    const int key = i * C::kKeys + 16 * warp + 4 * j + group;
    return i < tiles && key < L ? indices[key] : -1;
  };
  int32_t next_slot[kRowsPerThread];
#pragma unroll
  for (int j = 0; j < kRowsPerThread; ++j) next_slot[j] = slot_of(0, j);
  uint32_t phases = 0;  // bit s: parity of stage s's current lap
  for (int i = 0; i < tiles; ++i) {
    const int stage = i % C::kStages;
    const uint8_t* src[kRowsPerThread];
    bool valid[kRowsPerThread];
    uint32_t warp_mask = 0;
#pragma unroll
    for (int j = 0; j < kRowsPerThread; ++j) {
      const int64_t offset = row_slot_offset(p.keys, next_slot[j]);
      next_slot[j] = slot_of(i + 1, j);
      valid[j] = offset >= 0;
      src[j] = kv + (valid[j] ? offset * static_cast<int64_t>(sizeof(Elem)) : 0);
      const uint32_t ballot = __ballot_sync(0xffffffffu, valid[j]);  // lane 8 q: group q's key
#pragma unroll
      for (int q = 0; q < 4; ++q) warp_mask |= ((ballot >> (8 * q)) & 1u) << (4 * j + q);
    }
    const uint32_t parity = ((phases >> stage) & 1u) ^ 1u;
    dev::mbarrier_wait(&sm.empty[stage][C::kLowSlabs], parity);
    MLAKIT_SM90_STAMP(kProducerStageLowFree);
    publish_valid_mask(sm, stage, warp_mask);  // read before the low half's release, too
    // Key 16 w + 4 j + group is row (16 w + group) + 4 j of each slab; its chunk sits at
    // chunk ^ (row & 7), row & 7 = 4 (j & 1) + group: the swizzle of row 4 j + group.
    uint8_t* dst = &sm.kv[stage][0][(16 * warp + group) * dev::kSwizzleRowBytes];
#pragma unroll
    for (int s = 0; s < kSlabs; ++s) {
      if (s == C::kFirstHighSlab) {  // slabs 4..8 once the stage's other half is free too
        // The low half completes on its own barrier, so S can start on it.
        device::cp_async_mbarrier_arrive_noinc(&sm.full[stage][C::kGatheredLowHalfBarrier]);
        dev::mbarrier_wait(&sm.empty[stage][C::kHighSlabs], parity);
        MLAKIT_SM90_STAMP(kProducerStageHighFree);
      }
#pragma unroll
      for (int j = 0; j < kRowsPerThread; ++j) {
        const int swizzled = dev::sw128_chunk_offset(4 * j + group, chunk);
        device::cp_async_16_or_zero(dst + s * C::kSlabBytes + j * 4 * dev::kSwizzleRowBytes + swizzled,
                                    src[j] + s * dev::kSwizzleRowBytes, valid[j]);
      }
    }
    device::cp_async_mbarrier_arrive_noinc(&sm.full[stage][C::kGatheredTileBarrier]);
    MLAKIT_SM90_STAMP(kProducerTileIssued);
    // The warp's mask is written before its lane 0's arrival (release) that the consumer's
    // wait acquires; no producer-wide barrier, so each warp runs on by itself.
    if (threadIdx.x % dev::kWarpSize == 0) dev::mbarrier_arrive(&sm.full[stage][C::kGatheredTileBarrier]);
    phases ^= 1u << stage;
  }
}

}  // namespace mlakit::detail::sm90
