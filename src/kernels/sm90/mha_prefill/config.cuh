// Tile constants and the shared-memory map of the Hopper MHA prefill kernel
// (src/kernels/sm90/mha_prefill/kernel.cuh; docs/kernels/mha_prefill_sm90.md).
#pragma once

#include <cstdint>

#include "device/sm90/swizzle.cuh"
#include "device/sm90/sync.cuh"
#include "device/sm90/warpgroup.cuh"
#include "kernels/sm90/launch.h"
#include "kernels/sm90/warp_roles.cuh"

namespace mlakit::detail::mha_sm90 {

namespace dev = mlakit::device::sm90;

// One instance per (d_qk, d_v) and key-tile width (launch.h: two at d 128, mha_sm90_wide_keys).
// A CTA owns kBlockM query rows of one head of one sequence:
// warpgroup 0 is the producer (one thread issues the TMA loads), warpgroups 1 and 2 the
// consumers of 64 rows each. Key tiles of kBlockN rows stream through kStages stages of K
// and of V. Column slabs are 64 wide (128 bytes: the 128-byte swizzle span).
template <int kDqkT, int kDvT, bool kWideKeysT>
struct Config {
  static constexpr int kDqk = kDqkT;
  static constexpr int kDv = kDvT;
  static constexpr int kRowsPerConsumer = 64;  // the M of one wgmma
  static constexpr int kBlockM = mha_sm90_block_m(kDqk);
  static constexpr int kConsumers = kBlockM / kRowsPerConsumer;
  // Keys per tile: as many as the registers allow (S kBlockN / 2 + P kBlockN / 4 + O d_v / 2
  // per thread; launch.h).
  static constexpr int kBlockN = mha_sm90_block_n(kDqk, kDv, kWideKeysT);
  static constexpr int kProducerRegs = 24;
  static constexpr int kConsumerRegs = kConsumers == 2 ? 240 : 160;
  static constexpr int kThreads = sm90::WarpRoles<kConsumers, kProducerRegs, kConsumerRegs>::kThreads;

  static constexpr int kSlabCols = dev::kSwizzleRowBytes / 2;  // 16-bit elements
  static constexpr int kQkSlabs = kDqk / kSlabCols;
  static constexpr int kVSlabs = kDv / kSlabCols;
  static constexpr int kQSlabBytes = kBlockM * dev::kSwizzleRowBytes;
  static constexpr int kKvSlabBytes = kBlockN * dev::kSwizzleRowBytes;
  static constexpr int kConsumerQOffset = kRowsPerConsumer * dev::kSwizzleRowBytes;  // consumer g's rows

  static constexpr uint32_t kQBytes = kQkSlabs * kQSlabBytes;
  static constexpr uint32_t kKBytes = kQkSlabs * kKvSlabBytes;
  static constexpr uint32_t kVBytes = kVSlabs * kKvSlabBytes;

  // As many K / V stages as the shared memory holds beside Q, at most 4: 3 at d 128, 2 at
  // d 192 and 256, 4 at d 64 (227 KiB opt-in, less the alignment slack and the barriers).
  static constexpr int kSmemBudget = 227 * 1024 - 1024 - 256;
  static constexpr int kStagesThatFit = (kSmemBudget - static_cast<int>(kQBytes)) / static_cast<int>(kKBytes + kVBytes);
  static constexpr int kStages = kStagesThatFit < 4 ? kStagesThatFit : 4;

  static_assert(kBlockM % kRowsPerConsumer == 0 && (kConsumers == 2 || kConsumers == 3), "consumer warpgroups");
  static_assert(kStages >= 2, "double buffering at least");
  static_assert(kDqk % kSlabCols == 0 && kDv % kSlabCols == 0, "head dims are whole slabs");
  static_assert(kBlockN % 16 == 0 && kBlockN <= 256, "one wgmma N and whole k16 steps of P.V");
  static_assert(kKvSlabBytes % 1024 == 0 && kConsumerQOffset % 1024 == 0, "swizzle atoms stay aligned");
};

template <class C>
struct Smem {
  uint8_t q[C::kQkSlabs][C::kQSlabBytes];
  uint8_t k[C::kStages][C::kQkSlabs][C::kKvSlabBytes];
  uint8_t v[C::kStages][C::kVSlabs][C::kKvSlabBytes];
  uint64_t q_full;
  uint64_t k_full[C::kStages], k_empty[C::kStages];
  uint64_t v_full[C::kStages], v_empty[C::kStages];
  uint64_t v_landed;  // the partial last V tile, before the producer zeroes its rows past the sequence
};

// Dynamic shared memory of an instance: the map plus 1 KiB to align it to the swizzle atom.
template <class C>
inline constexpr int kSmemBytes = static_cast<int>(sizeof(Smem<C>)) + 1024;

// Arrivals that free a K or V stage: lane 0 of every consumer warp, after its wgmma wait.
template <class C>
inline constexpr uint32_t kEmptyArrivals = C::kConsumers * dev::kWarpsPerWarpgroup;

// Aligns the map to 1024 bytes (by pointer arithmetic: the compiler keeps the shared address
// space) and initialises the barriers; every thread returns after a CTA barrier.
template <class C>
__device__ __forceinline__ Smem<C>& setup_shared_memory(uint8_t* raw) {
  const uint32_t misalignment = dev::smem_u32(raw) & 1023u;
  auto& sm = *reinterpret_cast<Smem<C>*>(raw + ((1024u - misalignment) & 1023u));
  if (threadIdx.x == 0) {
    dev::mbarrier_init(&sm.q_full, 1);
    for (int s = 0; s < C::kStages; ++s) {
      dev::mbarrier_init(&sm.k_full[s], 1);
      dev::mbarrier_init(&sm.v_full[s], 1);
      dev::mbarrier_init(&sm.k_empty[s], kEmptyArrivals<C>);
      dev::mbarrier_init(&sm.v_empty[s], kEmptyArrivals<C>);
    }
    dev::mbarrier_init(&sm.v_landed, 1);
    dev::fence_mbarrier_init();
  }
  __syncthreads();
  return sm;
}

}  // namespace mlakit::detail::mha_sm90
