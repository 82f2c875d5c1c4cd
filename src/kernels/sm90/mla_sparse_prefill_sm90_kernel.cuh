// Hopper (sm_90a) sparse MLA prefill: the dense decode's seesaw consumers over tiles that the
// gathering producer fills from each query token's index list. Grid (s_q * row tiles): CTA
// x is row tile x % row_tiles of token x / row_tiles (the row tiles of a token are adjacent,
// so the second one finds the gathered rows in L2); 384 threads, one CTA per SM. No plan, no
// split: every token's keys run in one CTA, outputs written directly (out, max_logits, lse).
// q_map (q_by_tma): q as a 4D map {d_qk, h_q, 1, s_q} (make_sparse_prefill_q_tensor_map), the Q tile by
// TMA; else by cp.async.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include "device/special_registers.cuh"
#include "device/sm90/sync.cuh"
#include "device/sm90/warpgroup.cuh"
#include "kernels/sm90/mla_config.cuh"
#include "kernels/sm90/seesaw_consumer.cuh"
#include "kernels/sm90/gather_producer.cuh"

namespace mlakit::detail::sm90 {

// The sparse prefill's consumers: gathered bf16 rows landing in halves, softmax B first
// (consumer_options.cuh), max_logits written; S over the slabs that hold d_qk (9 for 576, 8 for 512).
template <typename ElemT, int kSlabsOfQk>
struct SparsePrefillConsumer {
  using Params = SparsePrefillParams;
  using Elem = ElemT;
  static constexpr KeyTiles kTiles = KeyTiles::kGatheredHalves;
  static constexpr PairOrder kOrder = PairOrder::kSoftmaxBFirst;
  static constexpr bool kMaxLogits = true;
  static constexpr int kScoreSlabs = kSlabsOfQk;
};

// kScoreSlabs: the launcher's choice from d_qk (576: 9, 512: 8).
template <typename Elem, int kScoreSlabs>
__global__ void __launch_bounds__(Sm90MlaConfig::kThreads, 1)
    mla_sparse_prefill_sm90_kernel(const __grid_constant__ SparsePrefillParams p, const __grid_constant__ CUtensorMap q_map,
                                   const bool q_by_tma) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  namespace dev = mlakit::device::sm90;
  using C = Sm90MlaConfig;
  extern __shared__ uint8_t smem_raw[];
  MLAKIT_SM90_TIMELINE_RESET();  // published by setup_shared_memory's barrier
  Sm90MlaSmem& sm = setup_shared_memory(smem_raw, [](int slab) { return gathered_halves_full_count(slab); });
  const int row_tiles = (p.core.rows + C::kRows - 1) / C::kRows;
  const int seq = static_cast<int>(blockIdx.x / row_tiles), tile = static_cast<int>(blockIdx.x % row_tiles);
  const int L = p.core.lengths(seq);
  if (threadIdx.x < dev::kWarpgroupThreads) {  // warpgroup 0: the producer
    dev::setmaxnreg_dec<C::kProducerRegs>();
    produce_gathered<Elem, kScoreSlabs>(p, tile, seq, L, sm);
    // CTAs run in waves of one per SM: the CTA that starts when one of this wave's ends takes
    // about item blockIdx.x + SM count.
    const int64_t next = static_cast<int64_t>(blockIdx.x) + device::nsmid();
    if (next < static_cast<int64_t>(gridDim.x)) {
      prefetch_q_rows_l2(p.core, static_cast<int>(next / row_tiles), 0, static_cast<int>(next % row_tiles) * C::kRows,
                         C::kRows, threadIdx.x, dev::kWarpgroupThreads);
    }
  } else {
    dev::setmaxnreg_inc<C::kConsumerRegs>();
    SeesawConsumer<SparsePrefillConsumer<Elem, kScoreSlabs>> consumer(p, sm, tile, 0, q_by_tma ? &q_map : nullptr);
    consumer.run_segment(seq, L, 0, L, 0);
  }
#endif
}

}  // namespace mlakit::detail::sm90
