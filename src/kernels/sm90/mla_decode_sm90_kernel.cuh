// Hopper (sm_90a) split-KV dense MLA decode kernel.
//
// Grid (row tiles, h_kv, num_parts), 384 threads, 1 CTA per SM. A CTA owns kRows = 64 query
// rows of one kv head (one wgmma M) and walks the (sequence, key block) range of its part,
// like the portable kernel, writing final or partial results for the combine kernel.
//
// Warp roles (warpgroup = 128 threads):
//   WG0          producer (paged_tma_producer.cuh): block-table lookups and TMA loads of 64-key
//                cache tiles, tile j of a segment into stage j % 2, warp w loading box w
//                (one warp for pages of 64 keys or more, 2 / 4 for pages of 32 / 16);
//                setmaxnreg.dec.
//   WG1, WG2     consumers 0 and 1 (seesaw_consumer.cuh): seesaw over pairs of tiles, each
//                computing S of its own tile and P·V of both tiles for its half of the
//                output columns; setmaxnreg.inc.
// Barrier protocol: full[s][slab] (count = producer warps: one arrive each + TMA bytes via
// expect_tx per box),
// empty[s][half] (V slabs 0..3 / slabs 4..8, one arrival per last reader after its last wgmma
// reading that half: empty_count in mla_config.cuh). The consumer of stage s waits
// full[s][*] with parity starting at 0, the producer waits empty[s][*] with parity starting at
// 1 (first lap passes). Shared-memory map: mla_config.cuh.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include "device/sm90/sync.cuh"
#include "device/sm90/warpgroup.cuh"
#include "kernels/sm90/mla_config.cuh"
#include "kernels/sm90/seesaw_consumer.cuh"
#include "kernels/sm90/paged_tma_producer.cuh"

namespace mlakit::detail::sm90 {

// The dense decode's consumers: TMA tiles of the paged cache, the seesaw's default order.
template <typename ElemT>
struct DenseDecodeConsumer {
  using Params = DenseDecodeParams;
  using Elem = ElemT;
  static constexpr KeyTiles kTiles = KeyTiles::kTma;
  static constexpr PairOrder kOrder = PairOrder::kPvA1DuringSoftmaxB;
  static constexpr bool kMaxLogits = false;
};

template <typename Elem>
__global__ void __launch_bounds__(Sm90MlaConfig::kThreads, 1)
    mla_decode_sm90_kernel(const __grid_constant__ DenseDecodeParams p, const __grid_constant__ CUtensorMap kv_map,
                           const int box_rows, const __grid_constant__ CUtensorMap q_map, const bool q_by_tma) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  namespace dev = mlakit::device::sm90;
  using C = Sm90MlaConfig;
  extern __shared__ uint8_t smem_raw[];
  MLAKIT_SM90_TIMELINE_RESET();  // published by setup_shared_memory's barrier
  if (threadIdx.x == 0) MLAKIT_SM90_CTA_SPAN(false);
  const int producers = producer_warps(box_rows);  // each arrives once per slab group
  Sm90MlaSmem& sm = setup_shared_memory(smem_raw, [producers](int) { return producers; });
  if (threadIdx.x < dev::kWarpgroupThreads) {  // warpgroup 0: the producer
    dev::setmaxnreg_dec<C::kProducerRegs>();
    if (threadIdx.x / dev::kWarpSize < producers) produce(p, kv_map, box_rows, sm);
  } else {
    dev::setmaxnreg_inc<C::kConsumerRegs>();
    SeesawConsumer<DenseDecodeConsumer<Elem>> consumer(p, sm, blockIdx.x, blockIdx.y, q_by_tma ? &q_map : nullptr);
    consumer.run_part(p.schedule.part_ranges[blockIdx.z]);
    if (threadIdx.x == dev::kWarpgroupThreads) MLAKIT_SM90_CTA_SPAN(true);  // consumer 0's first thread
  }
#endif
}

}  // namespace mlakit::detail::sm90
