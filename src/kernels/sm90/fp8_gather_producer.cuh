// Gathering producer of the Hopper sparse FP8 decode: the 128 threads of warpgroup 0 fill the
// dense decode's 128B-swizzled 64-key bf16 tiles from the listed 656-byte FP8 tokens
// (common/fp8_cache_row.h), so the consumers run unchanged apart from the valid-slot mask.
//
// Crossover (kShare = 2): the two CTAs of a cluster hold the two 64-row tiles of the same
// (batch entry, query token), so they need the same K/V tiles. Each converts half of every
// tile's keys (CTA rank r: keys 32r .. 32r + 31) and writes them into its own shared memory
// and, with st.async, into its peer's, so the dequantization (the bottleneck: FP8 -> bf16
// conversions run at a fraction of the tensor cores' rate) is done once per tile, not twice.
// kShare = 1: one CTA per tile (h_q <= 64), all 64 keys here.
//
// Thread t serves key key0 + t / kThreadsPerKey and part t % kThreadsPerKey of its bytes. A
// tile is produced as 10 units: NoPE slab k = 0..7 (the thread's e4m3 bytes of columns 64k..
// and their scale, dequantized by device/fp8_convert.cuh, bit-identical to the reference)
// and the bf16 RoPE in two halves (slab 8). Units are loaded into registers kLookahead units
// ahead (so the loads of the next units, or of the next tile's first ones, are in flight
// while one converts); they never touch shared memory unconverted, so the next tile's loads
// need no free stage. After a slab's unit(s): fence (generic -> async proxy), __syncwarp, and
// lane 0 of each warp arrives on full[stage][slab] (count 4). With a peer, warp 0's arrival
// also expects the bytes the peer stores here (its st.async complete them), and a stage is
// refilled only when the consumers of both CTAs have released it (empty counts 4).
// An invalid slot (or a key past the segment) loads nothing: zeros, scale 0. Lane 0 writes
// its warp's valid-slot mask word(s) before its slab-0 arrival (and st.asyncs a copy to the
// peer, counted in the peer's slab-0 bytes).
// While tile i converts, the tokens of tile i + 1 are prefetched into L2 (one bulk prefetch
// per token); the indices are read two tiles ahead.
#pragma once

#include <cstdint>

#include "common/fp8_cache_row.h"
#include "device/fp8_convert.cuh"
#include "device/sm90/cluster.cuh"
#include "device/sm90/sync.cuh"
#include "kernels/sm90/decode_config.cuh"
#include "kernels/sm90/gather_producer.cuh"

namespace mlakit::detail::sm90 {

// Arrivals on every full[stage][slab]: one per producer warp.
inline constexpr int kFp8FullCount = 4;

template <int kShare>
class Fp8GatherProducer {
  using C = Sm90DecodeConfig;
  static_assert(kShare == 1 || kShare == 2, "a tile is shared by one CTA or a cluster pair");
  static_assert(kFp8NopeDim == C::kNopeSlabs * C::kSlabCols, "one quantized slab per V slab");
  static_assert(kFp8Tile == 2 * C::kSlabCols, "a scale covers two slabs");

  static constexpr int kKeysPerCta = C::kKeys / kShare;
  static constexpr int kThreadsPerKey = 128 / kKeysPerCta;
  static constexpr int kChunksPerThread = 8 / kThreadsPerKey;  // 16-byte bf16 chunks of a slab row
  static constexpr int kRawWords = kChunksPerThread / 2;        // uint4 of raw bytes per unit
  static constexpr int kUnits = C::kNopeSlabs + 2;              // NoPE slabs, RoPE halves
  static constexpr int kLookahead = kShare == 2 ? 3 : 2;  // 15-18 registers of loads in flight
  // Bytes a peer stores into each of this CTA's slabs (+ its 4 mask words on slab 0).
  static constexpr uint32_t kPeerSlabBytes = kKeysPerCta * 128;
  static constexpr uint32_t kPeerMaskBytes = 4 * 4;

  // One unit of one thread: raw e4m3 (NoPE) or bf16 (RoPE) bytes, and the NoPE scale.
  struct Unit {
    uint4 raw[kRawWords];
    float scale;
  };

 public:
  __device__ Fp8GatherProducer(const MlaDecodeParams& p, Sm90DecodeSmem& sm)
      : p_(p), sm_(sm), cache_(static_cast<const uint8_t*>(p.kv)),
        rank_(kShare == 2 ? static_cast<int>(blockIdx.x & 1u) : 0),
        key_(rank_ * kKeysPerCta + static_cast<int>(threadIdx.x) / kThreadsPerKey),
        part_(static_cast<int>(threadIdx.x) % kThreadsPerKey) {}

  // The index of a tile's key is loaded two tiles ahead and turned into an offset one tile
  // ahead (for the L2 prefetch), so no index load latency is waited for in the loop.
  __device__ void run_segment(int seq, int L, int key_begin, int key_end) {
    const int tiles = segment_tiles(p_, 0, static_cast<int>(blockIdx.x), L, key_begin, key_end);
    if (tiles == 0) return;
    auto slot_of_tile = [&](int i) {
      const int key = key_begin + i * C::kKeys + key_;
      return i < tiles && key < key_end ? listed_slot(p_, seq, key) : -1;
    };
    int64_t offset = slot_offset(p_, slot_of_tile(0));
    int32_t next_slot = slot_of_tile(1);
    Unit ahead[kLookahead];
#pragma unroll
    for (int u = 0; u < kLookahead; ++u) ahead[u] = load_unit(offset, u);
    for (int i = 0; i < tiles; ++i) {
      const int32_t after_slot = slot_of_tile(i + 2);  // first used in the next iteration
      const int64_t next = slot_offset(p_, next_slot);
      if (part_ == 0 && next >= 0) device::sm90::bulk_prefetch_l2(cache_ + next, kFp8TokenBytes);
      fill_tile(i % C::kStages, offset, next, ahead);
      offset = next;
      next_slot = after_slot;
    }
  }

 private:
  __device__ Unit load_unit(int64_t offset, int u) const {
    Unit unit;
    unit.scale = 0.f;
#pragma unroll
    for (int w = 0; w < kRawWords; ++w) unit.raw[w] = make_uint4(0, 0, 0, 0);
    if (offset < 0) return unit;
    const uint8_t* token = cache_ + offset;
    const uint8_t* src;
    if (u < C::kNopeSlabs) {
      src = token + u * C::kSlabCols + part_ * (kRawWords * 16);
      // A scale covers two slabs: the second read hits L1.
      unit.scale = __ldg(reinterpret_cast<const float*>(token + kFp8ScaleOffset) + u / 2);
    } else {
      src = token + kFp8RopeOffset + (part_ * 2 + (u - C::kNopeSlabs)) * (kRawWords * 16);
    }
#pragma unroll
    for (int w = 0; w < kRawWords; ++w) unit.raw[w] = __ldg(reinterpret_cast<const uint4*>(src) + w);
    return unit;
  }

  // Fills the tile of `offset` into `stage`; on return `ahead` holds the first units of the
  // token at `next` (the next tile's key of this thread).
  __device__ void fill_tile(int stage, int64_t offset, int64_t next, Unit (&ahead)[kLookahead]) {
    namespace dev = mlakit::device::sm90;
    const uint32_t ballot = __ballot_sync(0xffffffffu, offset >= 0);
    // With a peer, releases come from both CTAs' consumers: acquire at cluster scope.
    if constexpr (kShare == 2) {
      dev::mbarrier_wait_cluster(&sm_.empty[stage], ((phases_ >> stage) & 1u) ^ 1u);
    } else {
      dev::mbarrier_wait(&sm_.empty[stage], ((phases_ >> stage) & 1u) ^ 1u);
    }
    phases_ ^= 1u << stage;
    const int warp = static_cast<int>(threadIdx.x) / 32;
    constexpr int kWordsPerWarp = 32 / kThreadsPerKey / 8;
    const int first_word = rank_ * (kKeysPerCta / 8) + warp * kWordsPerWarp;
    const uint32_t mask_word = publish_valid_mask(sm_, stage, ballot, kThreadsPerKey, first_word);
    if (kShare == 2 && threadIdx.x % 32 == 0) {
      dev::st_async_4(peer(&sm_.key_valid[stage][first_word]), mask_word, peer(&sm_.full[stage][0]));
    }
#pragma unroll
    for (int u = 0; u < kUnits; ++u) {
      const int later = u + kLookahead;  // the unit loaded now: of this tile, or of the next one
      const Unit loaded = later < kUnits ? load_unit(offset, later) : load_unit(next, later - kUnits);
      store_unit(stage, u, ahead[0]);
#pragma unroll
      for (int j = 0; j + 1 < kLookahead; ++j) ahead[j] = ahead[j + 1];
      ahead[kLookahead - 1] = loaded;
      if (u == C::kNopeSlabs) continue;  // the first RoPE half: slab 8 completes with the second
      const int slab = u < C::kNopeSlabs ? u : C::kNopeSlabs;
      dev::fence_proxy_async_smem();
      __syncwarp();
      if (threadIdx.x % 32 == 0) {
        if (kShare == 2 && warp == 0) {
          dev::mbarrier_arrive_expect_tx(&sm_.full[stage][slab], kPeerSlabBytes + (slab == 0 ? kPeerMaskBytes : 0));
        } else {
          dev::mbarrier_arrive(&sm_.full[stage][slab]);
        }
      }
    }
  }

  // Unit u of this thread into its chunks of its key's swizzled row (and the peer's copy).
  __device__ void store_unit(int stage, int u, const Unit& unit) {
    const bool nope = u < C::kNopeSlabs;
    const int slab = nope ? u : C::kNopeSlabs;
    // NoPE: the thread's kChunksPerThread chunks; RoPE: half of them per unit.
    const int first_chunk = part_ * kChunksPerThread + (nope ? 0 : (u - C::kNopeSlabs) * kRawWords);
    uint8_t* row = &sm_.kv[stage][slab][key_ * 128];
#pragma unroll
    for (int c = 0; c < (nope ? kChunksPerThread : kRawWords); ++c) {
      uint4 v;
      if (nope) {
        const uint4& raw = unit.raw[c / 2];
        v = device::dequantize_e4m3x8_bf16(c % 2 == 0 ? make_uint2(raw.x, raw.y) : make_uint2(raw.z, raw.w),
                                           unit.scale);
      } else {
        v = unit.raw[c];
      }
      uint8_t* dst = row + (((first_chunk + c) ^ (key_ & 7)) * 16);
      *reinterpret_cast<uint4*>(dst) = v;
      if constexpr (kShare == 2) device::sm90::st_async_16(peer(dst), v, peer(&sm_.full[stage][slab]));
    }
  }

  // The address of a variable of this CTA's shared memory in the peer CTA.
  __device__ uint32_t peer(const void* local) const {
    return device::sm90::peer_smem_address(local, static_cast<uint32_t>(rank_ ^ 1));
  }

  const MlaDecodeParams& p_;
  Sm90DecodeSmem& sm_;
  const uint8_t* cache_;
  const int rank_, key_, part_;
  uint32_t phases_ = 0;  // bit s: parity of stage s's current lap (kept across segments)
};

}  // namespace mlakit::detail::sm90
