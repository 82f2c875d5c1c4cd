// Hopper (sm_90a) MHA prefill forward: a query tile of 128 rows of one head of one sequence
// per CTA against all of its visible keys.
//
// Roles (384 threads, one CTA per SM): warpgroup 0 gives its registers back and one warp of
// it produces (producer.cuh: Q once, K and V tiles by TMA through two stages each);
// warpgroups 1 and 2 consume 64 rows each (consumer.cuh). Barriers (config.cuh):
// q_full, k_full / v_full (the producer's arrival plus the TMA bytes), k_empty / v_empty
// (lane 0 of each of the 8 consumer warps after its wgmma reads), v_landed (the producer's
// own wait for the one tile whose rows past the sequence it zeroes). Grid: work_tile; the
// tail split's pieces and their combine: common/mha_prefill_tiling.h, tail_combine.cuh.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include "kernels/sm90/launch.h"
#include "kernels/sm90/mha_prefill/config.cuh"
#include "kernels/sm90/mha_prefill/consumer.cuh"
#include "kernels/sm90/mha_prefill/producer.cuh"
#include "kernels/sm90/mha_prefill/tail_combine.cuh"
#include "kernels/sm90/mha_prefill/work_tile.cuh"
#include "kernels/sm90/tail_split_launch.cuh"
#include "kernels/sm90/warp_roles.cuh"

namespace mlakit::detail::mha_sm90 {

template <class C, typename Elem>
__global__ void __launch_bounds__(C::kThreads, 1)
    mha_prefill_sm90_kernel(const __grid_constant__ MhaPrefillParams p, const __grid_constant__ MhaPrefillMaps maps) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  const WorkTile w = work_tile<C>(p);
  if (!w.has_rows) return;  // uniform over the CTA: nobody waits on anybody yet
  extern __shared__ uint8_t smem_raw[];
  Smem<C>& sm = setup_shared_memory<C>(smem_raw);
  sm90::run_warp_roles<C::kProducerRegs, C::kConsumerRegs, /*kProducerWarps=*/1>(
      [&](int, int lane) {
        if (w.n_blocks > 0) produce<C>(maps, w, sm, lane);
      },
      [&](int g, int t) { Consumer<C, Elem>(p, sm, w, g, t).run(); });
#endif
}

template <class C, typename Elem>
cudaError_t launch(const MhaPrefillParams& p, const MhaPrefillMaps& maps, cudaStream_t stream) {
  static_assert(kSmemBytes<C> <= 227 * 1024, "the opt-in shared memory of one CTA");
  const int m_tiles = mha_tiles_of(p.max_seqlen_q, C::kBlockM);
  if (m_tiles == 0) return cudaSuccess;  // every sequence empty: nothing to write
  return sm90::launch_with_tail_split(&mha_prefill_sm90_kernel<C, Elem>, dim3(m_tiles, p.h_q, p.b), C::kThreads,
                                     kSmemBytes<C>, &mha_prefill_tail_combine_kernel<C, Elem>,
                                     C::kBlockM / kTailCombineWarps, kTailCombineWarps * 32, stream, p, maps);
}

}  // namespace mlakit::detail::mha_sm90

namespace mlakit::detail {

template <typename Elem>
cudaError_t launch_mha_prefill_sm90(const MhaPrefillParams& p, const MhaPrefillMaps& maps, cudaStream_t stream) {
  using mha_sm90::Config;
  using mha_sm90::launch;
  // Two key-tile widths at d 128 (launch.h, mha_sm90_wide_keys; the maps' boxes follow the
  // same rule), one elsewhere.
  if (p.d_qk == 64) return launch<Config<64, 64, false>, Elem>(p, maps, stream);
  if (p.d_qk == 128) {
    return mha_sm90_wide_keys(p.d_qk, p.causal, p.max_seqlen_k) ? launch<Config<128, 128, true>, Elem>(p, maps, stream)
                                                                : launch<Config<128, 128, false>, Elem>(p, maps, stream);
  }
  if (p.d_qk == 192) return launch<Config<192, 128, false>, Elem>(p, maps, stream);
  return launch<Config<256, 256, false>, Elem>(p, maps, stream);
}

}  // namespace mlakit::detail
