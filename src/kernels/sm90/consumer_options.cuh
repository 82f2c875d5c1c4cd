// What varies between the kernels that run the Hopper seesaw consumers (seesaw_consumer.cuh):
// where the cache tiles come from, consumer 1's order within a pair, and which row statistics
// the store writes. Each kernel names its choice in one options type (C++17 has no class-type
// template parameters), next to its kernel, e.g.
//
//   struct DenseDecodeConsumer {
//     using Params = DenseDecodeParams;                       // the operation (mla_params.h)
//     using Elem = __nv_bfloat16;                             // q, cache and P dtype
//     static constexpr KeyTiles kTiles = KeyTiles::kTma;      // KeyTiles below
//     static constexpr PairOrder kOrder = PairOrder::kPvA1DuringSoftmaxB;
//     static constexpr bool kMaxLogits = false;               // also write max_logits
//     static constexpr int kScoreSlabs = 8;                   // optional: S over slabs 0..7 only
//   };
#pragma once

#include <type_traits>

#include "kernels/sm90/mla_config.cuh"

namespace mlakit::detail::sm90 {

// How a stage's cache tile arrives, and so how the consumer waits for it and what it masks.
enum class KeyTiles {
  // TMA boxes of a paged cache (the dense decode), completing per slab group: S streams
  // behind the tile's load; keys are masked by position alone (no mask code at all: the
  // dense decode's registers are tight). A stage's tile can be bad (an out-of-range block id).
  kTma,
  // Gathered rows (st.shared or cp.async by a gathering producer: the generic proxy), one
  // barrier per tile, with the producer's valid-slot mask (the FP8 sparse decode).
  kGathered,
  // Gathered rows whose low half (slabs 0..3) also completes on its own barrier
  // (Sm90MlaConfig::kGatheredLowHalfBarrier), so S starts there while slabs 4..8 still
  // land (the sparse prefill, whose tile B lands on its consumer's critical path).
  kGatheredHalves,
};

// Consumer 1's order within a pair of tiles.
enum class PairOrder {
  // S_B is issued first; once P_A is published, P_A V_A,1 runs while softmax B is computed
  // (the dense decode).
  kPvA1DuringSoftmaxB,
  // Consumer 1 takes the P_A hand-off and issues P_A V_A,1 before S_B, so P_A V_A,1 runs while
  // a late tile B lands. Measured on the H200 (2026-11-22): FP8 sparse decode h_q 64 topk 2048
  // 257 vs 270 us, h_q 128 neutral; the sparse prefill 8% slower (S_B, on its critical path,
  // starts later).
  kPvA1First,
  // Consumer 0 publishes m_A as soon as its row max is known, before its exponentials, and
  // consumer 1 runs softmax B as soon as S_B is done instead of after the P_A hand-off: the
  // two softmaxes overlap rather than follow each other; P_A V_A,1 and P_B V_B,1 come after
  // (the sparse prefill, where the tile-B chain S_B -> softmax B -> P_B V_B,0 sets the pair).
  kSoftmaxBFirst,
};

template <class Options>
inline constexpr bool kGatheredTiles = Options::kTiles != KeyTiles::kTma;

// Slabs of S = Q K^T: an options type may name kScoreSlabs (8 for d_qk 512, whose K slab 8 would
// hold zeros: its k-steps are skipped rather than multiplied, and nobody writes the slab but
// P); every slab (9: d_qk 576) otherwise.
template <class Options, class = void>
struct ScoreSlabsOf {
  static constexpr int value = Sm90MlaConfig::kSlabs;
};
template <class Options>
struct ScoreSlabsOf<Options, std::void_t<decltype(Options::kScoreSlabs)>> {
  static constexpr int value = Options::kScoreSlabs;
};
template <class Options>
inline constexpr int kScoreSlabs = ScoreSlabsOf<Options>::value;

}  // namespace mlakit::detail::sm90
