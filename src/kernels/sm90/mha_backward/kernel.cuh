// Hopper (sm_90a) MHA prefill backward, main kernel: 128 keys of one kv head of one sequence
// per CTA against every query tile of every query head of the group that sees them
// (docs/kernels/mha_backward_sm90.md). Before it: D by the portable row kernel, which also
// zeroes dq_accum's slots; after it: dq from the slots (dq_slots.cu).
//
// Roles (384 threads, one CTA per SM): warpgroup 0 gives its registers back; its first warp
// produces (producer.cuh: K, V once; Q, dO, lse, D per query tile through two stages), lane 0
// of its second adds each tile's staged dQ (dq_writer.cuh); warpgroups 1 and 2 consume 64
// keys each (consumer.cuh). Barriers (config.cuh): kv_full, q_full / q_empty per stage,
// kv_landed / q_landed (the producer's own waits before zeroing rows past a sequence),
// dq_full / dq_empty (the dQ staging), ds_empty (d_qk 192: the one dS buffer); named barriers
// between the consumers (consumer.cuh). Without causal the last wave's key tiles may run in
// pieces over their query tiles, summed by tail_combine.cuh (common/mha_backward_tiling.h).
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include "kernels/sm90/launch.h"
#include "kernels/sm90/mha_backward/config.cuh"
#include "kernels/sm90/mha_backward/consumer.cuh"
#include "kernels/sm90/mha_backward/dq_writer.cuh"
#include "kernels/sm90/mha_backward/producer.cuh"
#include "kernels/sm90/mha_backward/tail_combine.cuh"
#include "kernels/sm90/mha_backward/work.cuh"
#include "kernels/sm90/tail_split_launch.cuh"
#include "kernels/sm90/warp_roles.cuh"

namespace mlakit::detail::mha_bwd_sm90 {

template <class C, typename Elem>
__global__ void __launch_bounds__(C::kThreads, 1)
    mha_backward_sm90_kernel(const __grid_constant__ MhaBackwardParams p, const __grid_constant__ MhaBackwardMaps maps) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  const BackwardWork w = backward_work<C>(p);
  if (!w.has_keys) return;  // uniform over the CTA: nobody waits on anybody yet
  extern __shared__ uint8_t smem_raw[];
  Smem<C>& sm = setup_shared_memory<C>(smem_raw);
  sm90::run_warp_roles<C::kProducerRegs, C::kConsumerRegs, /*kProducerWarps=*/2>(
      [&](int warp, int lane) {
        if (warp == 0) {
          produce<C>(p, maps, w, sm, lane);
        } else if (lane == 0) {
          write_dq<C>(p, w, sm);
        }
      },
      [&](int g, int t) { Consumer<C, Elem>(p, sm, w, g, t).run(); });
#endif
}

template <class C, typename Elem>
cudaError_t launch(const MhaBackwardParams& p, const MhaBackwardMaps& maps, cudaStream_t stream) {
  static_assert(kSmemBytes<C> <= 227 * 1024, "the opt-in shared memory of one CTA");
  static_assert(C::kBlockN == kMhaBackwardSm90KeyRows, "the key tiles the host plans the tail split with");
  const int key_tiles = mha_tiles_of(p.max_seqlen_k, C::kBlockN);  // no int overflow near 2^31
  if (key_tiles == 0) return cudaSuccess;  // no key anywhere: dk and dv are empty
  return sm90::launch_with_tail_split(&mha_backward_sm90_kernel<C, Elem>, dim3(key_tiles, p.h_kv, p.b), C::kThreads,
                                     kSmemBytes<C>, &mha_backward_tail_combine_kernel<C, Elem>,
                                     C::kBlockN / kTailCombineWarps, kTailCombineWarps * 32, stream, p, maps);
}

}  // namespace mlakit::detail::mha_bwd_sm90

namespace mlakit::detail {

template <typename Elem>
cudaError_t launch_mha_backward_sm90(const MhaBackwardParams& params, const MhaBackwardMaps& maps,
                                     cudaStream_t stream) {
  if (params.d_qk == 64 && params.d_v == 64) {
    return mha_bwd_sm90::launch<mha_bwd_sm90::Config<64, 64>, Elem>(params, maps, stream);
  }
  if (params.d_qk == 128 && params.d_v == 128) {
    return mha_bwd_sm90::launch<mha_bwd_sm90::Config<128, 128>, Elem>(params, maps, stream);
  }
  if (params.d_qk == 192 && params.d_v == 128) {
    return mha_bwd_sm90::launch<mha_bwd_sm90::Config<192, 128>, Elem>(params, maps, stream);
  }
  return cudaErrorInvalidValue;  // mha_sm90_backward_supported rules the rest out
}

}  // namespace mlakit::detail
