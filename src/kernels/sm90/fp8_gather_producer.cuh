// Gathering producer of the Hopper sparse FP8 decode: the 128 threads of warpgroup 0 fill the
// dense decode's 128B-swizzled 64-key bf16 tiles from the listed 656-byte FP8 tokens
// (common/fp8_cache_row.h), so the consumers run unchanged apart from the valid-slot mask.
//
// Crossover (kShare = 2): the two CTAs of a cluster hold the two 64-row tiles of the same
// (batch entry, query token), so they need the same K/V tiles. CTA rank r dequantizes keys
// 32r .. 32r + 31 of every tile and writes them into its own shared memory and, with
// st.async, into its peer's, so each token is loaded and converted once per pair of CTAs
// instead of twice (the conversion is the producer's main work). kShare = 1: one CTA per
// tile (h_q <= 64), all 64 keys here.
//
// Converting thread t serves key 32r + t / 4 (kShare 2) or t / 2 (kShare 1) and a quarter or
// half of its bytes. Per tile (slabs 0..3 once the stage's low half is free, the rest once its
// high half is: decode_config.cuh; with a peer, free in both CTAs):
//   - cp.async of the bf16 RoPE of key t / 2 (all 64 keys, in each CTA: it needs no
//     conversion) straight into slab 8, completing on full[stage][8] (noinc arrivals);
//   - slab k = 0..7: the thread's e4m3 bytes of the slab are already in registers with their
//     scale (loaded kLookahead slabs ahead, so the loads of the next slabs, or of the next
//     tile's first ones, are in flight while slab k converts); it dequantizes them
//     (device/fp8_convert.cuh, bit-identical to the reference) into its chunks of the
//     swizzled row (st.shared, and st.async to the peer), and lane 0 of each warp arrives on
//     full[stage][k] after __syncwarp (with a peer, each arrival also expects a quarter of the
//     bytes the peer's st.async complete there), so S starts on slab 0 while later slabs convert. The
//     generic -> async proxy fence is the consumers', after their wait: one here would be a
//     MEMBAR that also waits for the loads in flight, undoing the lookahead.
// The raw bytes never touch shared memory, so the next tile's loads need no free stage. An
// invalid slot (or a key past the segment) reads kFp8ZeroToken instead: zeros, scale 0, zero
// RoPE, with the same unpredicated loads (a predicated load leaves register copies that wait
// for it early: device/global_load.cuh). The valid-slot mask comes from the ballot of the
// RoPE keys (t / 2, all 64 keys in each CTA); lane 0 writes its warp's word before its slab-0
// arrival, which releases it. While tile i converts, the tokens of tile i + 1 are prefetched
// into L2 (prefetch_token_l2), each thread's bytes kL1Lookahead slabs ahead into L1, and the
// indices are read two tiles ahead; no load is waited for before its data is converted.
#pragma once

#include <cstdint>

#include "common/fp8_cache_row.h"
#include "device/cp_async.cuh"
#include "device/fp8_convert.cuh"
#include "device/global_load.cuh"
#include "device/sm90/cluster.cuh"
#include "device/sm90/sync.cuh"
#include "kernels/sm90/decode_config.cuh"
#include "kernels/sm90/gather_producer.cuh"

namespace mlakit::detail::sm90 {

// What an invalid slot reads: a token of zero bytes (e4m3 zeros, scales 0, bf16 zero RoPE).
// Internal linkage: one per translation unit, zero-initialised in global memory.
__device__ __align__(128) const uint8_t kFp8ZeroToken[kFp8TokenBytes] = {};

// Arrivals on full[stage][slab]: one per producer warp on the dequantized slabs, one per
// producer thread (cp.async) on the RoPE slab.
__host__ __device__ constexpr int fp8_gathered_full_count(int slab) {
  return slab < Sm90DecodeConfig::kNopeSlabs ? 4 : 128;
}

template <int kShare>
class Fp8GatherProducer {
  using C = Sm90DecodeConfig;
  static_assert(kShare == 1 || kShare == 2, "a tile is converted by one CTA or shared by a cluster pair");
  static_assert(kFp8NopeDim == C::kNopeSlabs * C::kSlabCols, "one quantized slab per V slab");
  static_assert(kFp8Tile == 2 * C::kSlabCols, "a scale covers two slabs");

  static constexpr int kKeysPerCta = C::kKeys / kShare;       // keys this CTA converts
  static constexpr int kThreadsPerKey = 128 / kKeysPerCta;    // 2 or 4
  static constexpr int kWords = C::kSlabCols / kThreadsPerKey / 16;  // 16-byte raw loads per slab
  static constexpr int kChunks = 2 * kWords;                  // 16-byte bf16 chunks stored per slab
  // Bytes the peer's st.async complete on each full barrier of a slab of this CTA.
  static constexpr uint32_t kPeerSlabBytes = (C::kKeys - kKeysPerCta) * 128;

  // Slabs loaded ahead of the one being converted (registers: 4 kWords + 1 per slab), and
  // slabs prefetched into L1 ahead of it, further than the register loads so that those hit L1
  // (0: none). H200, b=128 h_q=128 topk=2048, kShare 1 (register, L1): (2, 3) 462.0 us,
  // (3, 5) 478.8, (4, 6) 483.8, (4, none) 478.2.
  static constexpr int kLookahead = 2;
  static constexpr int kL1Lookahead = 3;
  static_assert(kL1Lookahead == 0 || (kL1Lookahead > kLookahead && kL1Lookahead < 2 * C::kNopeSlabs),
                "within the next tile, beyond the register loads");

  // One thread's e4m3 bytes of one slab, and their tile's scale.
  struct RawSlab {
    uint4 words[kWords];
    float scale;
  };

 public:
  __device__ Fp8GatherProducer(const MlaDecodeParams& p, Sm90DecodeSmem& sm, int tile)
      : p_(p), sm_(sm), cache_(static_cast<const uint8_t*>(p.kv)), tile_(tile),
        rank_(kShare == 2 ? static_cast<int>(device::sm90::cluster_rank()) : 0),
        key_(rank_ * kKeysPerCta + static_cast<int>(threadIdx.x) / kThreadsPerKey),
        part_(static_cast<int>(threadIdx.x) % kThreadsPerKey),
        rope_key_(threadIdx.x / 2),
        rope_half_(threadIdx.x % 2) {
    if constexpr (kShare == 2) {
      peer_kv_ = device::sm90::peer_smem_address(&sm.kv[0][0][0], rank_ ^ 1);
      peer_full_ = device::sm90::peer_smem_address(&sm.full[0][0], rank_ ^ 1);
    }
  }

  // The index of a tile's key is loaded two tiles ahead and turned into an offset one tile
  // ahead (for the L2 prefetch), so no index load latency is waited for in the loop. With a
  // peer, the RoPE/mask key of a thread differs from its converting key: both are followed.
  __device__ void run_segment(int seq, int L, int key_begin, int key_end) {
    const int tiles = segment_tiles(p_, 0, tile_, L, key_begin, key_end);
    if (tiles == 0) return;
    const int32_t* listed = p_.indices + seq_offset(p_, seq, p_.indices_stride_b, p_.indices_stride_s);
    auto slot_of = [&](int i, int key_in_tile) {
      const int key = key_begin + i * C::kKeys + key_in_tile;
      return device::load_s32_or(listed + key, i < tiles && key < key_end, -1);
    };
    int64_t offset = slot_offset(p_, slot_of(0, key_));
    int32_t next_slot = slot_of(1, key_);
    int64_t rope_offset = offset;
    int32_t rope_next_slot = -1;
    if constexpr (kShare == 2) {
      rope_offset = slot_offset(p_, slot_of(0, rope_key_));
      rope_next_slot = slot_of(1, rope_key_);
    }
    RawSlab raw[kLookahead];
#pragma unroll
    for (int k = 0; k < kLookahead; ++k) raw[k] = load_slab(token(offset), k);
    for (int i = 0; i < tiles; ++i) {
      const int32_t after_slot = slot_of(i + 2, key_);  // first used in the next iteration
      const int64_t next = slot_offset(p_, next_slot);
      prefetch_token_l2(token(next));
      fill_tile(i % C::kStages, token(offset), token(next), token(rope_offset), rope_offset >= 0, raw);
      offset = next;
      next_slot = after_slot;
      if constexpr (kShare == 2) {
        rope_offset = slot_offset(p_, rope_next_slot);
        rope_next_slot = slot_of(i + 2, rope_key_);
      } else {
        rope_offset = offset;
      }
    }
  }

 private:
  // The bytes of the token at cache byte offset `offset`, or the zero token (offset -1).
  __device__ const uint8_t* token(int64_t offset) const { return offset >= 0 ? cache_ + offset : kFp8ZeroToken; }

  // The thread's bytes of slab k: the loads stay in flight until the slab converts.
  __device__ RawSlab load_slab(const uint8_t* token, int k) const {
    const uint8_t* src = token + k * C::kSlabCols + part_ * 16 * kWords;
    RawSlab raw;
#pragma unroll
    for (int w = 0; w < kWords; ++w) raw.words[w] = device::load_nc_16(src + 16 * w);
    raw.scale = device::load_nc_f32(token + kFp8ScaleOffset + 4 * (k / 2));  // a scale covers two slabs
    return raw;
  }

  // The 128-byte lines of a token (16-byte aligned: up to 6 lines) into L2, shared by the
  // key's threads: byte offsets 128j, and the last byte for the last line.
  __device__ void prefetch_token_l2(const uint8_t* token) const {
#pragma unroll
    for (int line = part_; line < 6; line += kThreadsPerKey) {
      device::prefetch_l2(token + (line < 5 ? 128 * line : kFp8TokenBytes - 1));
    }
  }

  // The stage's half `half` is free: in this CTA, and with a peer in both (its consumers arrive
  // here too, at cluster scope, before this CTA's st.async overwrite their copy).
  __device__ void wait_free(int stage, int half, uint32_t parity) {
    if constexpr (kShare == 2) {
      device::sm90::mbarrier_wait_cluster(&sm_.empty[stage][half], parity);
    } else {
      device::sm90::mbarrier_wait(&sm_.empty[stage][half], parity);
    }
  }

  // Fills `stage` with the current tile (this thread's converting key: token `bytes`, the next
  // tile's `next_bytes`): RoPE and mask from `rope_token` (its RoPE key, `rope_valid`), slab k
  // from raw (loaded ahead). On return raw holds the next tile's first slabs.
  __device__ void fill_tile(int stage, const uint8_t* bytes, const uint8_t* next_bytes, const uint8_t* rope_token,
                            bool rope_valid, RawSlab (&raw)[kLookahead]) {
    namespace dev = mlakit::device::sm90;
    const uint32_t ballot = __ballot_sync(0xffffffffu, rope_valid);
    const uint32_t parity = ((phases_ >> stage) & 1u) ^ 1u;
    phases_ ^= 1u << stage;
    wait_free(stage, C::kLowSlabs, parity);
    publish_valid_mask(sm_, stage, ballot);  // read before the low half's release, too
#pragma unroll
    for (int k = 0; k < C::kNopeSlabs; ++k) {
      if (k == C::kFirstHighSlab) {
        // The stage's other half (slabs 4..8) is free too: RoPE first (slab 8, by cp.async).
        wait_free(stage, C::kHighSlabs, parity);
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int chunk = 4 * rope_half_ + c;
          device::cp_async_16(&sm_.kv[stage][C::kNopeSlabs][rope_key_ * 128 + ((chunk ^ (rope_key_ & 7)) * 16)],
                              rope_token + kFp8RopeOffset + chunk * 16);
        }
        device::cp_async_mbarrier_arrive_noinc(&sm_.full[stage][C::kNopeSlabs]);
      }
      // Slab k + kLookahead: of this tile, or of the next one.
      const int ahead = k + kLookahead;
      const RawSlab loaded =
          ahead < C::kNopeSlabs ? load_slab(bytes, ahead) : load_slab(next_bytes, ahead - C::kNopeSlabs);
      if constexpr (kL1Lookahead > 0) {
        const int far = k + kL1Lookahead;
        device::prefetch_l1((far < C::kNopeSlabs ? bytes : next_bytes) + (far % C::kNopeSlabs) * C::kSlabCols +
                            part_ * 16 * kWords);
      }
      store_dequantized(stage, k, raw[0]);
#pragma unroll
      for (int j = 0; j + 1 < kLookahead; ++j) raw[j] = raw[j + 1];
      raw[kLookahead - 1] = loaded;
      // No proxy fence here: it would also wait for the loads in flight (MEMBAR); the
      // consumers fence after their wait (acquire), before wgmma reads the slab.
      __syncwarp();
      if (threadIdx.x % 32 == 0) {
        if constexpr (kShare == 2) {
          dev::mbarrier_arrive_expect_tx(&sm_.full[stage][k], kPeerSlabBytes / 4);  // a quarter per warp
        } else {
          dev::mbarrier_arrive(&sm_.full[stage][k]);
        }
      }
    }
  }

  // The thread's values of slab k, dequantized, into its chunks of its key's swizzled row (and
  // of the peer's copy).
  __device__ void store_dequantized(int stage, int k, const RawSlab& raw) {
    namespace dev = mlakit::device::sm90;
    const uint32_t row_offset = static_cast<uint32_t>((stage * C::kSlabs + k) * C::kSlabBytes + key_ * 128);
    const uint32_t row = dev::smem_u32(&sm_.kv[0][0][0]) + row_offset;
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const uint4& w = raw.words[c / 2];
      const uint4 v = device::dequantize_e4m3x8_bf16(c % 2 == 0 ? make_uint2(w.x, w.y) : make_uint2(w.z, w.w), raw.scale);
      const uint32_t chunk_offset = static_cast<uint32_t>(((part_ * kChunks + c) ^ (key_ & 7)) * 16);
      dev::st_shared_16(row + chunk_offset, v);
      if constexpr (kShare == 2) {
        dev::st_async_16(peer_kv_ + row_offset + chunk_offset, v,
                         peer_full_ + static_cast<uint32_t>((stage * C::kSlabs + k) * sizeof(uint64_t)));
      }
    }
  }

  const MlaDecodeParams& p_;
  Sm90DecodeSmem& sm_;
  const uint8_t* cache_;
  const int tile_, rank_, key_, part_, rope_key_, rope_half_;
  uint32_t peer_kv_ = 0, peer_full_ = 0;  // the peer's kv[0][0] and full[0][0] (shared::cluster)
  uint32_t phases_ = 0;  // bit s: parity of stage s's current lap (kept across segments)
};

}  // namespace mlakit::detail::sm90
