// Gathering producer of the Hopper kernel for the sparse prefill: the 128 threads of
// warpgroup 0 copy the listed KV rows of a query token (kv [s_kv, 1, d_qk] in q's dtype,
// row = indices[token][key]) into the same 128B-swizzled 64-key tiles that the TMA producer
// fills for the dense decode, so the consumers run unchanged apart from a valid-slot mask.
//
// Per tile: thread t copies half a row (4 of the 8 16-byte chunks of each slab) of key t / 2,
// slab by slab with cp.async; after each slab it arrives on full[stage][slab] through
// cp.async.mbarrier.arrive.noinc (count 128, + 1 on slab 0 for the mask). Slots outside
// [0, s_kv), -1 included, and keys past the token's length are zero-filled without a global
// read and left out of the mask (publish_valid_mask), which the extra arrival on slab 0
// releases (the cp.async arrivals do not order the mask write).
#pragma once

#include <cstdint>

#include "device/cp_async.cuh"
#include "device/sm90/sync.cuh"
#include "kernels/sm90/decode_config.cuh"

namespace mlakit::detail::sm90 {

// Arrivals each full[stage][slab] barrier of a gathered tile expects.
__host__ __device__ constexpr int gathered_full_count(int slab) { return 128 + (slab == 0 ? 1 : 0); }

// Element offset of key `key` of scheduled sequence seq in the listed rows, or -1 (past the
// segment's end, or an invalid slot).
__device__ __forceinline__ int64_t gathered_key_offset(const MlaDecodeParams& p, int seq, int key, int key_end) {
  return key < key_end ? listed_key_offset(p, seq, key) : -1;
}

// The valid-slot mask of a gathered tile from the producers' ballot of their keys (thread t
// holds key t / 2): lane 0 of each warp writes the 16 bits of its warp's keys.
__device__ __forceinline__ void publish_valid_mask(Sm90DecodeSmem& sm, int stage, uint32_t ballot) {
  if (threadIdx.x % 32 != 0) return;
  uint32_t mask = 0;  // even lanes (half 0) carry keys 16 warp + j
  for (int j = 0; j < 16; ++j) mask |= ((ballot >> (2 * j)) & 1u) << j;
  sm.key_valid[stage][threadIdx.x / 32] = static_cast<uint16_t>(mask);
}

template <typename Elem>
__device__ __forceinline__ void produce_gathered(const MlaDecodeParams& p, int tile, int seq, int L, Sm90DecodeSmem& sm) {
  namespace dev = mlakit::device::sm90;
  using C = Sm90DecodeConfig;
  const int t = threadIdx.x;
  const int key_in_tile = t / 2, half = t % 2;
  const Elem* kv = static_cast<const Elem*>(p.kv);
  const int stored_chunks = p.d_qk / 8;  // 16-byte chunks of a row held by kv (512: no RoPE)
  const int tiles = segment_tiles(p, 0, tile, L, 0, L);
  uint32_t phases = 0;  // bit s: parity of stage s's current lap
  for (int i = 0; i < tiles; ++i) {
    const int stage = i % C::kStages;
    const int64_t offset = gathered_key_offset(p, seq, i * C::kKeys + key_in_tile, L);
    const bool valid = offset >= 0;
    const uint32_t ballot = __ballot_sync(0xffffffffu, valid);
    const Elem* row = kv + (valid ? offset : 0);
    const uint32_t parity = ((phases >> stage) & 1u) ^ 1u;
    dev::mbarrier_wait(&sm.empty[stage][C::kLowSlabs], parity);
    publish_valid_mask(sm, stage, ballot);  // read before the low half's release, too
    uint8_t* dst_row = &sm.kv[stage][0][key_in_tile * 128];
#pragma unroll
    for (int s = 0; s < C::kSlabs; ++s) {
      // Slabs 4..8 once the stage's other half is free too.
      if (s == C::kFirstHighSlab) dev::mbarrier_wait(&sm.empty[stage][C::kHighSlabs], parity);
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int chunk = 4 * half + c;
        const int column_chunk = s * 8 + chunk;
        device::cp_async_16_or_zero(dst_row + s * C::kSlabBytes + ((chunk ^ (key_in_tile & 7)) * 16),
                                    row + column_chunk * 8, valid && column_chunk < stored_chunks);
      }
      device::cp_async_mbarrier_arrive_noinc(&sm.full[stage][s]);
    }
    // The mask is complete before the extra arrival on slab 0 (release) that the consumer's
    // wait acquires.
    dev::named_barrier_sync(C::kBarGatherers, 128);
    if (t == 0) dev::mbarrier_arrive(&sm.full[stage][0]);
    phases ^= 1u << stage;
  }
}

}  // namespace mlakit::detail::sm90
