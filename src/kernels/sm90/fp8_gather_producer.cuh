// Gathering producer of the Hopper sparse FP8 decode: the 128 threads of warpgroup 0 fill the
// dense decode's 128B-swizzled 64-key bf16 tiles from the listed 656-byte FP8 tokens
// (common/fp8_cache_row.h), so the consumers run unchanged apart from the valid-slot mask.
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
#include "device/cp_async.cuh"
#include "device/fp8_convert.cuh"
#include "device/global_load.cuh"
#include "device/sm90/swizzle.cuh"
#include "device/sm90/sync.cuh"
#include "device/sm90/warpgroup.cuh"
#include "kernels/sm90/mla_config.cuh"
#include "kernels/sm90/gather_producer.cuh"

namespace mlakit::detail::sm90 {

// What an invalid slot reads: a token of zero bytes (e4m3 zeros, scales 0, bf16 zero RoPE).
// Internal linkage: one per translation unit, zero-initialised in global memory.
__device__ __align__(device::kCacheLineBytes) const uint8_t kFp8ZeroToken[kFp8TokenBytes] = {};

class Fp8GatherProducer {
  using C = Sm90MlaConfig;
  static_assert(kFp8NopeDim == C::kNopeSlabs * C::kSlabCols, "one quantized slab per V slab");
  static_assert(kFp8Tile == 2 * C::kSlabCols, "a scale covers two slabs");

  // Slabs loaded ahead of the one being converted (8 registers each). H200, b=128 h_q=128
  // topk=2048, with the per-slab scale and an L1 prefetch further ahead (both since dropped):
  // 2 slabs 462.0 us, 3: 478.8, 4: 483.8; H100 at 2f80ba5: 3 slabs 452.2 us vs 455.1, but 1.5%
  // slower at h_q 64 topk 16384 (docs/kernels/mla_sparse_decode_sm90.md).
  static constexpr int kLookahead = 2;

  // The 32 e4m3 bytes of one thread in one slab (the scale comes from the token's four).
  struct RawSlab {
    uint4 lo, hi;
  };

 public:
  __device__ Fp8GatherProducer(const SparseDecodeParams& p, Sm90MlaSmem& sm, int tile)
      : p_(p), sm_(sm), cache_(static_cast<const uint8_t*>(p.keys.kv)), tile_(tile), key_(threadIdx.x / 2),
        half_(threadIdx.x % 2) {}

  // The index of a tile's key is loaded two tiles ahead and turned into an offset one tile
  // ahead (for the L2 prefetch), so no index load latency is waited for in the loop.
  __device__ void run_segment(int seq, int L, int key_begin, int key_end) {
    const int tiles = segment_tiles(p_.core, 0, tile_, L, key_begin, key_end);
    if (tiles == 0) return;
    const int32_t* listed = p_.keys.indices + seq_offset(p_.core, seq, p_.keys.indices_stride_b, p_.keys.indices_stride_s);
    auto slot_of_tile = [&](int i) {
      const int key = key_begin + i * C::kKeys + key_;
      return device::load_s32_or(listed + key, i < tiles && key < key_end, -1);
    };
    int64_t offset = slot_offset(p_.keys, slot_of_tile(0));
    // The loop prefetches each next tile's tokens into L2; the first tile's too, so that its
    // slabs 2..7 do not each wait for DRAM behind the two-slab lookahead.
    prefetch_token_l2(token(offset));
    int32_t next_slot = slot_of_tile(1);
    RawSlab raw[kLookahead];
    float4 scales = load_scales(token(offset));
#pragma unroll
    for (int k = 0; k < kLookahead; ++k) raw[k] = load_slab(token(offset), k);
    for (int i = 0; i < tiles; ++i) {
      const int32_t after_slot = slot_of_tile(i + 2);  // first used in the next iteration
      const int64_t next = slot_offset(p_.keys, next_slot);
      prefetch_token_l2(token(next));
      fill_tile(i % C::kStages, offset, next, raw, scales);
      offset = next;
      next_slot = after_slot;
    }
  }

 private:
  // The bytes of the token at cache byte offset `offset`, or the zero token (offset -1).
  __device__ const uint8_t* token(int64_t offset) const { return offset >= 0 ? cache_ + offset : kFp8ZeroToken; }

  // The token's four scales: one 16-byte load per token and tile.
  __device__ float4 load_scales(const uint8_t* token) const {
    const uint4 v = device::load_nc_16(token + kFp8ScaleOffset);
    return make_float4(__uint_as_float(v.x), __uint_as_float(v.y), __uint_as_float(v.z), __uint_as_float(v.w));
  }

  // The thread's bytes of slab k: the loads stay in flight until the slab converts.
  __device__ RawSlab load_slab(const uint8_t* token, int k) const {
    const uint8_t* src = token + k * C::kSlabCols + half_ * 32;
    return RawSlab{device::load_nc_16(src), device::load_nc_16(src + 16)};
  }

  // The scale of slab k (compile-time k) among a token's four.
  __device__ static float slab_scale(const float4& scales, int k) {
    const int tile = k / 2;
    return tile == 0 ? scales.x : tile == 1 ? scales.y : tile == 2 ? scales.z : scales.w;
  }

  // The 128-byte lines of a token (16-byte aligned: up to 6 lines) into L2, three per thread of
  // the key's pair: byte offsets 128j, and the last byte for the last line.
  __device__ void prefetch_token_l2(const uint8_t* token) const {
#pragma unroll
    for (int j = 0; j < 3; ++j) {
      const int line = 3 * half_ + j;
      device::prefetch_l2(token + (line < 5 ? device::kCacheLineBytes * line : kFp8TokenBytes - 1));
    }
  }

  // Fills the tile of `offset` into `stage`; on return raw holds the first slabs of the token
  // at `next` (the next tile's key of this thread) and scales that token's scales.
  __device__ void fill_tile(int stage, int64_t offset, int64_t next, RawSlab (&raw)[kLookahead], float4& scales) {
    namespace dev = mlakit::device::sm90;
    const uint8_t* bytes = token(offset);
    const uint8_t* next_bytes = token(next);
    const float4 next_scales = load_scales(next_bytes);
    const uint32_t ballot = __ballot_sync(0xffffffffu, offset >= 0);
    const uint32_t parity = ((phases_ >> stage) & 1u) ^ 1u;
    phases_ ^= 1u << stage;
    dev::mbarrier_wait(&sm_.empty[stage][C::kLowSlabs], parity);
    MLAKIT_SM90_STAMP(kProducerStageLowFree);
    publish_valid_mask(sm_, stage, key_mask_of_lane_pairs(ballot));  // read before the low half's release, too
#pragma unroll
    for (int k = 0; k < C::kNopeSlabs; ++k) {
      if (k == C::kFirstHighSlab) {
        // The stage's other half (slabs 4..8) is free too: RoPE first (slab 8, by cp.async).
        dev::mbarrier_wait(&sm_.empty[stage][C::kHighSlabs], parity);
        MLAKIT_SM90_STAMP(kProducerStageHighFree);
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int chunk = 4 * half_ + c;
          device::cp_async_16(&sm_.kv[stage][C::kNopeSlabs][dev::sw128_offset(key_, chunk)],
                              bytes + kFp8RopeOffset + chunk * 16);
        }
        device::cp_async_mbarrier_arrive_noinc(&sm_.full[stage][C::kNopeSlabs]);
      }
      // Slab k + kLookahead: of this tile, or of the next one.
      const int ahead = k + kLookahead;
      const RawSlab loaded =
          ahead < C::kNopeSlabs ? load_slab(bytes, ahead) : load_slab(next_bytes, ahead - C::kNopeSlabs);
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
  const uint8_t* cache_;
  const int tile_, key_, half_;
  uint32_t phases_ = 0;  // bit s: parity of stage s's current lap (kept across segments)
};

}  // namespace mlakit::detail::sm90
