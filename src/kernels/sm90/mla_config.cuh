// Tiling, shared-memory map and the segment arithmetic of the Hopper dense decode, shared by
// its producer and consumer roles (docs/kernels/mla_decode_sm90.md).
#pragma once

#include <cstdint>

#include "device/sm90/swizzle.cuh"
#include "device/sm90/sync.cuh"
#include "device/sm90/warpgroup.cuh"
#include "kernels/attention_rows.cuh"
#include "kernels/mla_params.h"

namespace mlakit::detail::sm90 {

struct Sm90MlaConfig {
  static constexpr int kRows = 64;    // query rows per CTA (wgmma M)
  static constexpr int kKeys = 64;    // keys per cache tile (= scheduling block); S is 64 x 64
  static constexpr int kDqk = 576;
  static constexpr int kDv = 512;
  static constexpr int kSlabCols = 64;  // 128 bytes of bf16: one 128B-swizzle row
  static constexpr int kSlabs = kDqk / kSlabCols;  // 8 NoPE slabs (also V) + 1 RoPE slab
  static constexpr int kNopeSlabs = kDv / kSlabCols;
  static constexpr int kSlabBytes = kKeys * device::sm90::kSwizzleRowBytes;
  static constexpr int kStages = 2;   // tile A of a pair in stage 0, tile B in stage 1
  static constexpr int kThreads = 384;
  static constexpr int kConsumerThreads = 256;
  static constexpr int kProducerRegs = 40;
  static constexpr int kConsumerRegs = 232;
  // The FP8 sparse decode's producer dequantizes and keeps raw slabs in flight in registers
  // (fp8_gather_producer.cuh: 2 slabs need 72, 4 need 88); its consumers fit in 208 (no
  // spill in the pair loop; below 208 they spill there).
  static constexpr int kFp8ProducerRegs = 88;
  static constexpr int kFp8ConsumerRegs = 208;
  static constexpr int kVColsPerConsumer = kDv / 2;  // O columns of one consumer
  // f32 registers per thread of a consumer's 64 x 256 output accumulator (wgmma m64n256).
  static constexpr int kOutRegs = kVColsPerConsumer / 2;
  static constexpr int kQkSteps = kDqk / 16;
  static constexpr int kPvSteps = kKeys / 16;
  // The one named barrier (id 0 is __syncthreads), synced by all 256 consumer threads
  // whenever either uses it: Q loaded, row sums, segment end. compute-sanitizer racecheck
  // follows a named barrier only when both consumers take part in each of its uses (with
  // bar.arrive, or with a barrier one consumer uses alone, it reported hazards on ordered
  // exchanges), so everything else is an mbarrier (Sm90MlaSmem::handoff).
  static constexpr uint32_t kBarConsumers = 1;
  // Hand-offs through shared memory (Sm90MlaSmem::handoff, 128 arrivals each): every
  // thread of the writing consumer arrives after its writes, every thread of the reader waits.
  static constexpr int kP0Ready = 0;    // consumer 0 -> 1: P_A in stage 0's slab 8, m_A
  static constexpr int kP1Ready = 1;    // consumer 1 -> 0: P_B in stage 1's slab 8, m_B
  static constexpr int kMaxAReady = 2;  // consumer 0 -> 1: m_A ahead of P_A (PairOrder::kSoftmaxBFirst)
  static constexpr int kZeroed0 = 3;    // consumer 0 -> its own wgmma: zeroed rows of a partial tile
  static constexpr int kZeroed1 = 4;    // consumer 1's
  static constexpr int kHandoffs = 5;
  // Arrivals that release a half of a stage come from lane 0 of each consumer warp: the lanes
  // that read the producer's per-tile flags (stage_bad, key_valid) and broadcast them, so
  // that each reading thread's own arrival orders its read before the producer's next write.
  static constexpr int kReleasingLanesPerConsumer = 4;

  // The halves of a stage that are released separately (Sm90MlaSmem::empty).
  static constexpr int kLowSlabs = 0;   // V slabs 0..3: consumer 0's P·V columns
  static constexpr int kHighSlabs = 1;  // V slabs 4..7 and slab 8 (RoPE, then P)
  static constexpr int kFirstHighSlab = 4;
  // A gathered tile completes on one barrier, its last slab's (RoPE): every gathering thread's
  // cp.async arrival there fires once all its copies of the tile have landed, and each
  // producer warp's ordinary arrival there (after its last store, and its mask) releases what
  // it stored (gather_producer.cuh, fp8_gather_producer.cuh). The consumer waits once per tile:
  // a wait on a complete barrier costs it ~100 cycles and more, on its critical path.
  static constexpr int kGatheredTileBarrier = kSlabs - 1;
  // Gathering producers that copy by cp.async (the sparse prefill's) also complete the tile's
  // low half (slabs 0..3) on slab 3's barrier, so S can start there (kGatheredHalves).
  static constexpr int kGatheredLowHalfBarrier = kFirstHighSlab - 1;
  // TMA tiles: S streams behind the tile's load in groups of slabs, each group's boxes
  // completing on the barrier of its last slab (one wait per group: a wait costs the consumer
  // ~100 cycles even on a complete barrier). Groups stay within the stage halves. H100, same
  // call, two rounds (b=128 h_q=128 s_q 1 4k / 32k, s_q 2 4k, page 16 4k, us): groups of 1
  // 305.0 / 1936.0 / 503.8 / 347.8 and 301.5 / 1939.1 / 505.6 / 347.3; of 2: 302.1 / 1951.9 /
  // 498.1 / 347.7 and 301.2 / 1932.5 / 497.9 / 348.5; of 3 the same as 2; one per half (5):
  // 305.0 / 1984.5 / 505.2 / 355.9 (S then waits for slabs it could already multiply).
  static constexpr int kSlabGroupSize = 2;
  __host__ __device__ static constexpr int group_last_slab(int slab) {
    return slab < kFirstHighSlab ? min_int(kFirstHighSlab, (slab / kSlabGroupSize + 1) * kSlabGroupSize) - 1
                                 : min_int(kSlabs, kFirstHighSlab + ((slab - kFirstHighSlab) / kSlabGroupSize + 1) *
                                                                        kSlabGroupSize) - 1;
  }
  __host__ __device__ static constexpr int group_first_slab(int last) {
    return last < kFirstHighSlab ? (last / kSlabGroupSize) * kSlabGroupSize
                                 : kFirstHighSlab + ((last - kFirstHighSlab) / kSlabGroupSize) * kSlabGroupSize;
  }
  __host__ __device__ static constexpr int min_int(int a, int b) { return a < b ? a : b; }
  static_assert(kRows == 64, "one wgmma M per CTA");
  static_assert(kSlabs * kSlabCols == kDqk && kNopeSlabs == 8, "V = slabs 0..7, RoPE = slab 8");
  static_assert(kRows * kKeys * 2 == kSlabBytes, "a P tile fits the RoPE slab it replaces");
  // setmaxnreg moves registers within what the CTA was given at launch: __launch_bounds__(384,
  // 1) gives 168 per thread (65536 / 384 rounded down to 8), 64512 in all; a larger total
  // leaves setmaxnreg.inc waiting forever.
  static constexpr int kLaunchRegs = 168 * kThreads;
  // The producer is one warpgroup.
  static_assert(kProducerRegs * device::sm90::kWarpgroupThreads + kConsumerRegs * kConsumerThreads <= kLaunchRegs,
                "register budget");
  static_assert(kFp8ProducerRegs * device::sm90::kWarpgroupThreads + kFp8ConsumerRegs * kConsumerThreads <=
                    kLaunchRegs,
                "register budget");
};

struct Sm90MlaSmem {
  using C = Sm90MlaConfig;
  uint8_t q[C::kSlabs][C::kSlabBytes];
  // Cache tiles; once S of a tile is done its RoPE slab (8) is dead and holds that tile's P
  // ([64 rows][64 keys], the same 8 KB swizzled shape) for the other consumer.
  uint8_t kv[C::kStages][C::kSlabs][C::kSlabBytes];
  float row_max[2][C::kRows];    // running max after tile A / after tile B
  float row_sum[2][C::kRows];
  float max_logit[2][C::kRows];  // each consumer's max logit per row, for max_logits at the store
  uint64_t full[C::kStages][C::kSlabs];  // per slab: S starts on the first slabs of a tile
  // Per stage, two halves released separately: [kLowSlabs] = V slabs 0..3, [kHighSlabs] =
  // slabs 4..8 (empty_count() says who releases what), so a producer refills slabs 0..3 of
  // tile A while consumer 1 still reads slabs 4..8.
  uint64_t empty[C::kStages][2];
  // Element offset of each Q tile row within its sequence, -1 for padding rows: the same in
  // every segment of the CTA (q_tile.cuh).
  int64_t q_row_offset[C::kRows];
  uint64_t q_full;  // the Q tile by TMA (dense decode): one arrival plus the 9 boxes' bytes
  uint64_t handoff[C::kHandoffs];  // the consumers' hand-offs (Sm90MlaConfig::kP0Ready ..)
  int stage_bad[C::kStages];
  alignas(8) uint16_t key_valid[C::kStages][4];  // gathered tiles: valid-slot mask, 16 keys per producer warp
};
inline constexpr int kSm90SmemBytes = sizeof(Sm90MlaSmem) + 1024;  // + alignment slack
static_assert(kSm90SmemBytes <= 232448, "fits the 227 KB opt-in shared memory of sm90");

// Arrivals that free a half of a stage: the last readers of its slabs (seesaw_consumer.cuh).
//   stage 0 (tile A): slabs 0..3: consumer 0 (S_A, P_A V_A,0);  slabs 4..8: consumer 0
//     (S_A) and consumer 1 (P_A V_A,1, reading P_A from slab 8).
//   stage 1 (tile B): slabs 0..3: consumer 1 (S_B) and consumer 0 (P_B V_B,0); slabs 4..8:
//     consumer 1 (S_B, P_B V_B,1) and consumer 0 (P_B V_B,0 reads P_B from slab 8).
// Each consumer's arrival is one per warp (Sm90MlaConfig::kReleasingLanesPerConsumer).
__host__ __device__ constexpr uint32_t empty_count(int stage, int half) {
  return (stage == 0 && half == Sm90MlaConfig::kLowSlabs ? 1 : 2) * Sm90MlaConfig::kReleasingLanesPerConsumer;
}

// The CTA's shared memory (1024-aligned in the dynamic allocation) with its barriers set up by
// thread 0 before a CTA-wide barrier: full[s][slab] expects full_count(slab) arrivals (the
// producer warps for TMA tiles, the gathering threads for gathered ones), empty[s][half]
// empty_count(s, half).
template <typename FullCount>
__device__ __forceinline__ Sm90MlaSmem& setup_shared_memory(uint8_t* raw, FullCount full_count) {
  using C = Sm90MlaConfig;
  // Aligned by pointer arithmetic on raw (not through an integer), so the compiler still sees a
  // shared-memory pointer and the fields' loads and stores are LDS / STS, not generic LD / ST.
  const uint32_t misalignment = device::sm90::smem_u32(raw) & 1023u;
  auto& sm = *reinterpret_cast<Sm90MlaSmem*>(raw + ((1024u - misalignment) & 1023u));
  if (threadIdx.x == 0) {
    for (int s = 0; s < C::kStages; ++s) {
      for (int slab = 0; slab < C::kSlabs; ++slab) device::sm90::mbarrier_init(&sm.full[s][slab], full_count(slab));
      for (int half = 0; half < 2; ++half) device::sm90::mbarrier_init(&sm.empty[s][half], empty_count(s, half));
      sm.stage_bad[s] = 0;
    }
    device::sm90::mbarrier_init(&sm.q_full, 1);
    // A hand-off: every thread of the writing consumer (one warpgroup) arrives.
    for (int h = 0; h < C::kHandoffs; ++h) device::sm90::mbarrier_init(&sm.handoff[h], device::sm90::kWarpgroupThreads);
    device::sm90::fence_mbarrier_init();
  }
  __syncthreads();
  return sm;
}

// Number of 64-key tiles a segment needs for this CTA's rows (producer and consumers must
// agree exactly). Tiles 2i and 2i+1 form pair i; an odd count ends with a lone tile A.
__device__ __forceinline__ int segment_tiles(const AttentionCore& p, int hk, int tile, int L, int key_begin,
                                             int key_end) {
  using C = Sm90MlaConfig;
  const int end = tile_keys_end(p, hk, tile * C::kRows, C::kRows, L, key_end);
  return end > key_begin ? (end - key_begin + C::kKeys - 1) / C::kKeys : 0;
}

}  // namespace mlakit::detail::sm90
