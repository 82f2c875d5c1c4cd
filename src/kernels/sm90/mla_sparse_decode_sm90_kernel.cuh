// Hopper (sm_90a) sparse FP8 MLA decode: the dense decode's split-KV walk and seesaw
// consumers over tiles that the FP8 gathering producer (fp8_gather_producer.cuh) dequantizes
// from each (batch entry, query token)'s index lists, for a token layout (V3.2 or V4). Grid (row tiles, 1, num_parts) of the
// sparse plan, 384 threads, one CTA per SM; partial results go to the dense decode's combine.
// q_map (q_by_tma): the dense decode's map over q, each segment's Q tile by TMA; else cp.async.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "device/sm90/sync.cuh"
#include "device/sm90/warpgroup.cuh"
#include "kernels/sm90/mla_config.cuh"
#include "kernels/sm90/seesaw_consumer.cuh"
#include "kernels/sm90/fp8_gather_producer.cuh"

namespace mlakit::detail::sm90 {

// The sparse decode's consumers: bf16 rows dequantized by the FP8 gathering producer, P_A V_A,1
// first (consumer_options.cuh); V4 tokens (d_qk 512): S over slabs 0..7 only.
template <Fp8TokenLayout kLayout>
struct SparseDecodeConsumer {
  using Params = SparseDecodeParams;
  using Elem = __nv_bfloat16;
  static constexpr KeyTiles kTiles = KeyTiles::kGathered;
  static constexpr PairOrder kOrder = PairOrder::kPvA1First;
  static constexpr bool kMaxLogits = false;
  static constexpr int kScoreSlabs = kLayout == Fp8TokenLayout::kV4 ? Sm90MlaConfig::kNopeSlabs : Sm90MlaConfig::kSlabs;
};

template <Fp8TokenLayout kLayout>
__global__ void __launch_bounds__(Sm90MlaConfig::kThreads, 1)
    mla_sparse_decode_sm90_kernel(const __grid_constant__ SparseDecodeParams p, const __grid_constant__ CUtensorMap q_map,
                                  const bool q_by_tma) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  namespace dev = mlakit::device::sm90;
  using C = Sm90MlaConfig;
  extern __shared__ uint8_t smem_raw[];
  MLAKIT_SM90_TIMELINE_RESET();  // published by setup_shared_memory's barrier
  if (threadIdx.x == 0) MLAKIT_SM90_CTA_SPAN(false);
  Sm90MlaSmem& sm = setup_shared_memory(smem_raw, [](int slab) { return gathered_full_count(slab); });
  const PartRange& range = p.schedule.part_ranges[blockIdx.z];
  if (threadIdx.x < dev::kWarpgroupThreads) {  // warpgroup 0: the producer
    dev::setmaxnreg_dec<C::kFp8ProducerRegs>();
    Fp8GatherProducer<kLayout> producer(p, sm, blockIdx.x);
    for_each_segment(p.core, p.schedule, range, [&](int seq, int L, int key_begin, int key_end, int) {
      producer.run_segment(seq, L, key_begin, key_end);
    });
  } else {
    dev::setmaxnreg_inc<C::kFp8ConsumerRegs>();
    SeesawConsumer<SparseDecodeConsumer<kLayout>> consumer(p, sm, blockIdx.x, 0, q_by_tma ? &q_map : nullptr);
    consumer.run_part(range);
    if (threadIdx.x == dev::kWarpgroupThreads) MLAKIT_SM90_CTA_SPAN(true);  // consumer 0's first thread
  }
#endif
}

}  // namespace mlakit::detail::sm90
