// Tile constants, the shared-memory map and the barriers of the Hopper MHA backward
// (src/kernels/sm90/mha_backward/kernel.cuh; docs/kernels/mha_backward_sm90.md).
//
// A CTA owns kBlockN = 128 keys of one kv head of one sequence and runs every query tile
// (kBlockM = 64 rows) of every query head of its group that sees them: dK and dV of its keys
// stay in registers (two consumer warpgroups, 64 keys each), dQ of each query tile is added
// into the float32 accumulator of the workspace (common/mha_backward_tiling.h). Head dims
// (d_qk, d_v) = (64, 64), (128, 128) and (192, 128); at d_qk 192 the 96 + 64 dK / dV
// accumulators leave room for the scores of half a tile only (two 32-row halves) and for one
// dS buffer.
#pragma once

#include <cstdint>

#include "common/mha_backward_tiling.h"
#include "device/sm90/swizzle.cuh"
#include "device/sm90/sync.cuh"
#include "device/sm90/warpgroup.cuh"
#include "kernels/sm90/warp_roles.cuh"

namespace mlakit::detail::mha_bwd_sm90 {

namespace dev = mlakit::device::sm90;

template <int kDqkT, int kDvT>
struct Config {
  static constexpr int kDqk = kDqkT;
  static constexpr int kDv = kDvT;
  static constexpr int kConsumers = 2;
  static constexpr int kKeysPerConsumer = 64;  // the M of S^T = K Q^T, one wgmma
  static constexpr int kBlockN = kConsumers * kKeysPerConsumer;
  // Query rows per tile: the workspace's dQ slots (common/mha_backward_tiling.h).
  static constexpr int kBlockM = kMhaBackwardSm90QueryRows;
  // S^T and dP^T per tile in kHalves products of kHalfRows queries each.
  static constexpr int kHalves = kDqk > 128 ? 2 : 1;
  static constexpr int kHalfRows = kBlockM / kHalves;
  static constexpr int kStages = 2;  // Q / dO tiles
  static constexpr int kProducerRegs = 40;
  static constexpr int kConsumerRegs = 232;
  static constexpr int kThreads = sm90::WarpRoles<kConsumers, kProducerRegs, kConsumerRegs>::kThreads;

  static constexpr int kSlabCols = dev::kSwizzleRowBytes / 2;  // 16-bit elements per slab row
  static constexpr int kQkSlabs = kDqk / kSlabCols;
  static constexpr int kVSlabs = kDv / kSlabCols;
  static constexpr int kKvSlabBytes = kBlockN * dev::kSwizzleRowBytes;   // 128 key rows
  static constexpr int kQSlabBytes = kBlockM * dev::kSwizzleRowBytes;    // 64 query rows
  static constexpr int kConsumerKeyOffset = kKeysPerConsumer * dev::kSwizzleRowBytes;  // consumer g's rows
  static constexpr uint32_t kKBytes = kQkSlabs * kKvSlabBytes;
  static constexpr uint32_t kVBytes = kVSlabs * kKvSlabBytes;
  static constexpr uint32_t kQBytes = kQkSlabs * kQSlabBytes;
  static constexpr uint32_t kDoBytes = kVSlabs * kQSlabBytes;
  // dS [query][key] for dQ = dS K (the SS product's A, K-major): one 64-key slab per consumer.
  static constexpr int kDsSlabBytes = kBlockM * dev::kSwizzleRowBytes;
  // dS buffers: two, by tile parity, so a consumer stores the next tile's dS while the other's
  // dQ product may still read this one's; at d_qk 192 one (shared memory), freed by ds_empty.
  static constexpr int kDsBuffers = kDqk > 128 ? 1 : 2;
  // dQ columns per consumer g: K slab g (the main accumulator, 64 columns; at d_qk 64 half g
  // of the one slab, 32 columns) and, at d_qk 192, half g of slab 2 (the tail, 32 columns):
  // mha_backward_dq_part_column.
  static constexpr int kDqMainCols = mha_backward_dq_main_columns(kDqk);
  static constexpr int kDqTailCols = (kDqk - kConsumers * kDqMainCols) / kConsumers;
  // Byte offset in sm.k of consumer g's main dQ columns (the B operand of its dQ product).
  static constexpr uint32_t dq_main_cols_offset(int g) {
    return g * kDqMainCols / kSlabCols * kKvSlabBytes + g * kDqMainCols % kSlabCols * 2;
  }
  static constexpr int kDqCols = kDqMainCols + kDqTailCols;
  // dQ staging per consumer: its kBlockM x kDqCols float32 accumulators in fragment order, as
  // its part of the tile's dq_accum slot (common/mha_backward_tiling.h): one bulk reduction
  // adds both parts.
  static constexpr int kDqStageBytes = kBlockM * kDqCols * 4;

  static_assert(mha_backward_hopper_dims(kDqk, kDv) && kDqk % kSlabCols == 0 && kDv % kSlabCols == 0,
                "this kernel serves d (64, 64), (128, 128) and (192, 128) (the portable one the rest)");
  static_assert(kBlockM == 64, "one m64 wgmma of dQ per query tile");
  static_assert(kHalfRows % 16 == 0, "whole k16 steps of dV, dK per half");
  static_assert(kDqTailCols == 0 || kDqTailCols == 32, "the tail is half a slab (d_qk 192)");
  static_assert(kDqMainCols == kSlabCols || kDqMainCols == kSlabCols / 2, "whole or half slabs: n64 or n32");
  static_assert(kDqCols * kConsumers == kDqk, "the consumers' parts make the slot's block");
  static_assert(mha_backward_dq_part_column(kDqk, 1, 0) ==
                        dq_main_cols_offset(1) / kKvSlabBytes * kSlabCols + dq_main_cols_offset(1) % kKvSlabBytes / 2 &&
                    mha_backward_dq_part_column(kDqk, 1, kDqMainCols - 1) == 2 * kDqMainCols - 1 &&
                    (kDqTailCols == 0 || mha_backward_dq_part_column(kDqk, 1, kDqMainCols) == kConsumers * kSlabCols +
                                                                                                   kDqTailCols),
                "the slot parts' columns (mha_backward_dq_part_column) are the ones the consumers compute");
};

template <class C>
struct Smem {
  uint8_t k[C::kQkSlabs][C::kKvSlabBytes];
  uint8_t v[C::kVSlabs][C::kKvSlabBytes];
  uint8_t q[C::kStages][C::kQkSlabs][C::kQSlabBytes];
  uint8_t dout[C::kStages][C::kVSlabs][C::kQSlabBytes];
  uint8_t ds[C::kDsBuffers][C::kConsumers][C::kDsSlabBytes];  // [tile parity (two buffers)][key slab]
  alignas(16) uint8_t dq[C::kConsumers][C::kDqStageBytes];
  // Per query row of a stage: lse in base 2 (+inf past the sequence: P = 0) and D =
  // rowsum(dout * out) (0 past the sequence), written by the producer warp's lanes.
  float lse2[C::kStages][C::kBlockM];
  float row_dot[C::kStages][C::kBlockM];
  uint64_t kv_full;                 // K and V landed (their rows past the sequence zeroed)
  uint64_t kv_landed;               // the producer's own wait before zeroing
  uint64_t q_full[C::kStages];      // Q, dO, lse2, D of a query tile in place (rows past the sequence zeroed)
  uint64_t q_empty[C::kStages][C::kConsumers];  // every thread of consumer g is done with them
  uint64_t q_landed;                // the producer's own wait before zeroing (a partial tile)
  uint64_t dq_full;                 // both consumers' dQ of the tile staged (every thread of both)
  uint64_t dq_empty;                // the writer's add has read the staging (the writer's lane 0)
  uint64_t ds_empty;                // one dS buffer (d_qk 192): both consumers' dQ products read it
};

template <class C>
inline constexpr int kSmemBytes = static_cast<int>(sizeof(Smem<C>)) + 1024;

// Every thread that touches a stage's lse2 / D arrives on its barriers itself: the producer's
// 32 lanes (which store them) on q_full, each consumer's 128 threads (which read them) on
// their q_empty. One lane arriving for its warp after __syncwarp is ordered too, but
// compute-sanitizer racecheck does not follow it and reports the exchange (docs/design.md).
template <class C>
inline constexpr uint32_t kFullArrivals = dev::kWarpSize;
template <class C>
inline constexpr uint32_t kEmptyArrivals = dev::kWarpgroupThreads;

// The dQ staging, by the same rule: every consumer thread arrives on dq_full after its stores;
// the writer's one issuing lane on dq_empty after its add has read them.
template <class C>
inline constexpr uint32_t kStagedArrivals = C::kConsumers * dev::kWarpgroupThreads;
template <class C>
inline constexpr uint32_t kAddReadArrivals = 1;
// Every consumer thread arrives on ds_empty after its wait for its dQ product.
template <class C>
inline constexpr uint32_t kDsReadArrivals = C::kConsumers * dev::kWarpgroupThreads;

template <class C>
__device__ __forceinline__ Smem<C>& setup_shared_memory(uint8_t* raw) {
  const uint32_t misalignment = dev::smem_u32(raw) & 1023u;
  auto& sm = *reinterpret_cast<Smem<C>*>(raw + ((1024u - misalignment) & 1023u));
  if (threadIdx.x == 0) {
    dev::mbarrier_init(&sm.kv_full, 1);
    dev::mbarrier_init(&sm.kv_landed, 1);
    dev::mbarrier_init(&sm.q_landed, 1);
    for (int s = 0; s < C::kStages; ++s) {
      dev::mbarrier_init(&sm.q_full[s], kFullArrivals<C>);
      for (int g = 0; g < C::kConsumers; ++g) dev::mbarrier_init(&sm.q_empty[s][g], kEmptyArrivals<C>);
    }
    dev::mbarrier_init(&sm.dq_full, kStagedArrivals<C>);
    dev::mbarrier_init(&sm.dq_empty, kAddReadArrivals<C>);
    if constexpr (C::kDsBuffers == 1) dev::mbarrier_init(&sm.ds_empty, kDsReadArrivals<C>);
    dev::fence_mbarrier_init();
  }
  __syncthreads();
  return sm;
}

}  // namespace mlakit::detail::mha_bwd_sm90
