// Gathering producer of the Hopper sparse FP8 decode: the 128 threads of warpgroup 0 fill the
// dense decode's 128B-swizzled 64-key bf16 tiles from the listed FP8 tokens of either layout
// (kernels/fp8_tokens.cuh), of the first cache and then the second, so the consumers run
// unchanged apart from the valid-slot mask.
//
// DeepSeek V3.2 tokens (656 bytes, common/fp8_cache_row.h), described below. DeepSeek V4 tokens
// (a 576-byte record and 7 UE8M0 scale bytes, common/fp8_v4_cache_row.h): NoPE slabs 0..6, one
// scale each (a V4 tile is one slab); the RoPE goes by cp.async into slab 7 (V's last slab: V4's
// V is the whole row); slab 8 (K columns 512..575) is not written: the V4 consumers compute S
// over slabs 0..7 (SparseDecodeConsumer::kScoreSlabs), and only P goes there.
//
// Thread t serves key t / 2 of each tile and half t % 2 of its bytes. Per tile (slabs 0..3
// once the stage's low half is free, the rest once its high half is: mla_config.cuh):
//   - cp.async of the token's bf16 RoPE straight into slab 8 (swizzled), completing on
//     full[stage][8] through cp.async.mbarrier.arrive.noinc;
//   - slab k = 0..7: the thread's 32 e4m3 bytes of columns 64k + 32 half .. are already in
//     registers (loaded kLookahead slabs ahead, so the loads of the next slabs, or of the next
//     tile's first ones, are in flight while slab k converts), with their scale from the
//     token's four, read once per tile in one 16-byte load (the next tile's at the start); it
//     dequantizes them (device/fp8_convert.cuh, bit-identical to the reference) into its 4
//     chunks of the swizzled row (st.shared). After slab 7, lane 0 of each warp arrives on
//     full[stage][8] after __syncwarp: the consumers wait for that one barrier (their S needs
//     the whole tile), and a warp's release there covers all its slabs. (Arrivals on
//     every slab, from when S streamed slab by slab, cost 1-3%: b=128 h_q 128 / 64 396.1 /
//     235.7 us without, 396.0 / 242.4 with, H100, same call.) The generic -> async proxy
//     fence is the consumers', after their wait: one here would be a MEMBAR that also waits
//     for the loads in flight, undoing the lookahead.
// The raw bytes never touch shared memory, so the next tile's loads need no free stage. An
// invalid slot (or a key past the segment) reads kFp8ZeroToken instead: zeros, scale 0, zero
// RoPE, with the same unpredicated loads (a predicated load leaves register copies that wait
// for it early: device/global_load.cuh).
// Lane 0 writes the warp's valid-slot mask before its arrival on the tile's barrier, which
// releases it (Sm90MlaConfig::kGatheredTileBarrier).
// While tile i converts, the tokens of tile i + 1 are prefetched into L2 (prefetch_token_l2)
// and the indices are read two tiles ahead; no load is waited for before its data is
// converted. Fewer memory requests per token paid here (H100, same call, b=128 h_q 128 / 64
// topk 2048): the scales in one load per token instead of one per slab, 454 / 270 us vs 464 /
// 285; after that, prefetching each thread's bytes into L1 three slabs ahead (2% before) no
// longer paid and was dropped.
#pragma once

#include <cstdint>

#include "common/fp8_cache_row.h"
#include "common/fp8_v4_cache_row.h"
#include "device/cp_async.cuh"
#include "device/fp8_convert.cuh"
#include "device/global_load.cuh"
#include "device/sm90/swizzle.cuh"
#include "device/sm90/sync.cuh"
#include "device/sm90/warpgroup.cuh"
#include "kernels/fp8_tokens.cuh"
#include "kernels/sm90/gather_producer.cuh"
#include "kernels/sm90/mla_config.cuh"

namespace mlakit::detail::sm90 {

// What an invalid slot reads: a token of zero bytes (e4m3 zeros, bf16 zero RoPE; V3.2 scales 0,
// V4 scale bytes 0, 2^-127: zeros either way), as both its record and its scales.
// Internal linkage: one per translation unit, zero-initialised in global memory.
__device__ __align__(device::kCacheLineBytes) const uint8_t kFp8ZeroToken[kFp8TokenBytes] = {};
static_assert(kFp8TokenBytes >= kV4RecordBytes + kV4ScaleRecordBytes, "the zero token serves V4 too");

template <Fp8TokenLayout kLayout>
class Fp8GatherProducer {
  using C = Sm90MlaConfig;
  static constexpr bool kV4 = kLayout == Fp8TokenLayout::kV4;
  // Slabs of e4m3 values, and the slab the bf16 RoPE is copied into.
  static constexpr int kQuantizedSlabs = kV4 ? kV4Tiles : C::kNopeSlabs;
  static constexpr int kRopeSlab = kV4 ? C::kNopeSlabs - 1 : C::kNopeSlabs;
  static constexpr int kRopeOffset = kV4 ? kV4RopeOffset : kFp8RopeOffset;  // in the record
  static_assert(kFp8NopeDim == C::kNopeSlabs * C::kSlabCols, "V3.2: one quantized slab per V slab");
  static_assert(kFp8Tile == 2 * C::kSlabCols, "V3.2: a scale covers two slabs");
  static_assert(kV4Tile == C::kSlabCols && kV4Dqk == C::kDv, "V4: a scale per slab, the RoPE is V's last slab");
  static_assert(kRopeSlab >= C::kFirstHighSlab, "the RoPE slab is in the stage's high half");

  // Slabs loaded ahead of the one being converted (8 registers each). H200, b=128 h_q=128
  // topk=2048, with the per-slab scale and an L1 prefetch further ahead (both since dropped):
  // 2 slabs 462.0 us, 3: 478.8, 4: 483.8; H100 at 2f80ba5: 3 slabs 452.2 us vs 455.1, but 1.5%
  // slower at h_q 64 topk 16384 (docs/kernels/mla_sparse_decode_sm90.md).
  static constexpr int kLookahead = 2;

  // The 32 e4m3 bytes of one thread in one slab (the scale comes from the token's scales).
  struct RawSlab {
    uint4 lo, hi;
  };

  // A token's scales as loaded: V3.2 four float32 (16 bytes), V4 seven UE8M0 bytes (.x, .y).
  using RawScales = uint4;

 public:
  __device__ Fp8GatherProducer(const SparseDecodeParams& p, Sm90MlaSmem& sm, int tile)
      : p_(p), sm_(sm), tile_(tile), key_(threadIdx.x / 2), half_(threadIdx.x % 2) {}

  // The index of a tile's key is loaded two tiles ahead and turned into a token one tile
  // ahead (for the L2 prefetch), so no index load latency is waited for in the loop. Keys
  // below the sequence's first-cache length list first-cache slots, the rest second-cache ones.
  __device__ void run_segment(int seq, int L, int key_begin, int key_end) {
    const int tiles = segment_tiles(p_.core, 0, tile_, L, key_begin, key_end);
    if (tiles == 0) return;
    const int first = p_.core.lengths.first(seq);
    const int32_t* listed = p_.keys.indices + seq_offset(p_.core, seq, p_.keys.indices_stride_b, p_.keys.indices_stride_s);
    const int32_t* extra_listed =
        p_.extra_keys.indices == nullptr
            ? nullptr
            : p_.extra_keys.indices +
                  seq_offset(p_.core, seq, p_.extra_keys.indices_stride_b, p_.extra_keys.indices_stride_s) - first;
    // (key, the slot it lists): the key decides the cache.
    auto slot_of_tile = [&](int i) {
      const int key = key_begin + i * C::kKeys + key_;
      return device::load_s32_or(key < first ? listed + key : extra_listed + key, i < tiles && key < key_end, -1);
    };
    auto token_of_tile = [&](int i, int32_t slot) {
      const int key = key_begin + i * C::kKeys + key_;
      return fp8_token_at(key < first ? p_.keys : p_.extra_keys, kLayout, slot);
    };
    Fp8TokenRef current = token_of_tile(0, slot_of_tile(0));
    // The loop prefetches each next tile's tokens into L2; the first tile's too, so that its
    // slabs 2..7 do not each wait for DRAM behind the two-slab lookahead.
    prefetch_token_l2(or_zero(current));
    int32_t next_slot = slot_of_tile(1);
    RawSlab raw[kLookahead];
    RawScales scales = load_scales(or_zero(current));
#pragma unroll
    for (int k = 0; k < kLookahead; ++k) raw[k] = load_slab(or_zero(current).record, k);
    for (int i = 0; i < tiles; ++i) {
      const int32_t after_slot = slot_of_tile(i + 2);  // first used in the next iteration
      const Fp8TokenRef next = token_of_tile(i + 1, next_slot);
      prefetch_token_l2(or_zero(next));
      fill_tile(i % C::kStages, current, next, raw, scales);
      current = next;
      next_slot = after_slot;
    }
  }

 private:
  // The token, or the zero token for none (record null).
  __device__ static Fp8TokenRef or_zero(const Fp8TokenRef& t) {
    return t.record != nullptr ? t : Fp8TokenRef{kFp8ZeroToken, kFp8ZeroToken};
  }

  // The token's scales: one load per token and tile (V3.2 16 bytes, V4 8).
  __device__ static RawScales load_scales(const Fp8TokenRef& t) {
    if constexpr (kV4) {
      const uint2 v = device::load_nc_8(t.scales);
      return make_uint4(v.x, v.y, 0, 0);
    } else {
      return device::load_nc_16(t.scales);
    }
  }

  // The thread's bytes of slab k: the loads stay in flight until the slab converts.
  __device__ RawSlab load_slab(const uint8_t* record, int k) const {
    const uint8_t* src = record + k * C::kSlabCols + half_ * 32;
    return RawSlab{device::load_nc_16(src), device::load_nc_16(src + 16)};
  }

  // The scale of slab k (compile-time k): V3.2 tile k / 2's float32, V4 byte k as 2^(byte - 127).
  __device__ static float slab_scale(const RawScales& scales, int k) {
    if constexpr (kV4) {
      const uint32_t word = k < 4 ? scales.x : scales.y;
      return ue8m0_to_float(static_cast<uint8_t>(word >> (8 * (k % 4))));
    } else {
      const int tile = k / 2;
      return __uint_as_float(tile == 0 ? scales.x : tile == 1 ? scales.y : tile == 2 ? scales.z : scales.w);
    }
  }

  // The 128-byte lines of a token into L2 (16-byte aligned: a V3.2 token spans up to 6 lines, a
  // V4 record 5), split between the key's two threads: byte offsets 128j, the last byte for the
  // last line. A V4 token's scales too, though their 8 bytes are loaded a tile ahead and the
  // prefetch brings the 128-byte line of 16 tokens' scales from DRAM (62 MB of reads against
  // FlashMLA's 48 at V4 b64 h_q 128): without it those cases ran 1-5% slower (H100, side by
  // side, 2026-11-27; docs/history.md).
  __device__ void prefetch_token_l2(const Fp8TokenRef& t) const {
    constexpr int kBytes = kV4 ? kV4RecordBytes : kFp8TokenBytes;
#pragma unroll
    for (int j = 0; j < 3; ++j) {
      const int line = 3 * half_ + j;
      device::prefetch_l2(t.record + (line < 5 ? device::kCacheLineBytes * line : kBytes - 1));
    }
    if (kV4 && half_ == 1) device::prefetch_l2(t.scales);
  }

  // Fills the tile of token `current` into `stage`; on return raw holds the first slabs of the
  // token `next` (the next tile's key of this thread) and scales that token's scales.
  __device__ void fill_tile(int stage, const Fp8TokenRef& current, const Fp8TokenRef& next, RawSlab (&raw)[kLookahead],
                            RawScales& scales) {
    namespace dev = mlakit::device::sm90;
    const uint8_t* bytes = or_zero(current).record;
    const uint8_t* next_bytes = or_zero(next).record;
    const RawScales next_scales = load_scales(or_zero(next));
    const uint32_t ballot = __ballot_sync(0xffffffffu, current.record != nullptr);
    const uint32_t parity = ((phases_ >> stage) & 1u) ^ 1u;
    phases_ ^= 1u << stage;
    dev::mbarrier_wait(&sm_.empty[stage][C::kLowSlabs], parity);
    MLAKIT_SM90_STAMP(kProducerStageLowFree);
    publish_valid_mask(sm_, stage, key_mask_of_lane_pairs(ballot));  // read before the low half's release, too
#pragma unroll
    for (int k = 0; k < kQuantizedSlabs; ++k) {
      if (k == C::kFirstHighSlab) {
        // The stage's other half (slabs 4..8) is free too: RoPE first (by cp.async).
        dev::mbarrier_wait(&sm_.empty[stage][C::kHighSlabs], parity);
        MLAKIT_SM90_STAMP(kProducerStageHighFree);
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int chunk = 4 * half_ + c;
          device::cp_async_16(&sm_.kv[stage][kRopeSlab][dev::sw128_offset(key_, chunk)],
                              bytes + kRopeOffset + chunk * 16);
        }
        device::cp_async_mbarrier_arrive_noinc(&sm_.full[stage][C::kGatheredTileBarrier]);
      }
      // Slab k + kLookahead: of this tile, or of the next one.
      const int ahead = k + kLookahead;
      const RawSlab loaded =
          ahead < kQuantizedSlabs ? load_slab(bytes, ahead) : load_slab(next_bytes, ahead - kQuantizedSlabs);
      store_dequantized(stage, k, raw[0], slab_scale(scales, k));
#pragma unroll
      for (int j = 0; j + 1 < kLookahead; ++j) raw[j] = raw[j + 1];
      raw[kLookahead - 1] = loaded;
    }
    // No proxy fence here: it would also wait for the loads in flight (MEMBAR); the consumers
    // fence after their wait (acquire), before wgmma reads the tile.
    __syncwarp();
    if (threadIdx.x % dev::kWarpSize == 0) dev::mbarrier_arrive(&sm_.full[stage][C::kGatheredTileBarrier]);
    MLAKIT_SM90_STAMP(kProducerTileIssued);  // here: the last slab converted
    scales = next_scales;
  }

  // The thread's 32 values of slab k, dequantized, into chunks 4 half .. 4 half + 3 of its
  // key's swizzled row.
  __device__ void store_dequantized(int stage, int k, const RawSlab& raw, float scale) {
    namespace dev = mlakit::device::sm90;
    const uint32_t row = dev::smem_u32(&sm_.kv[stage][k][key_ * dev::kSwizzleRowBytes]);
    const int c0 = 4 * half_;
    dev::st_shared_16(row + dev::sw128_chunk_offset(key_, c0),
                      device::dequantize_e4m3x8_bf16(make_uint2(raw.lo.x, raw.lo.y), scale));
    dev::st_shared_16(row + dev::sw128_chunk_offset(key_, c0 + 1),
                      device::dequantize_e4m3x8_bf16(make_uint2(raw.lo.z, raw.lo.w), scale));
    dev::st_shared_16(row + dev::sw128_chunk_offset(key_, c0 + 2),
                      device::dequantize_e4m3x8_bf16(make_uint2(raw.hi.x, raw.hi.y), scale));
    dev::st_shared_16(row + dev::sw128_chunk_offset(key_, c0 + 3),
                      device::dequantize_e4m3x8_bf16(make_uint2(raw.hi.z, raw.hi.w), scale));
  }

  const SparseDecodeParams& p_;
  Sm90MlaSmem& sm_;
  const int tile_, key_, half_;
  uint32_t phases_ = 0;  // bit s: parity of stage s's current lap (kept across segments)
};

}  // namespace mlakit::detail::sm90
