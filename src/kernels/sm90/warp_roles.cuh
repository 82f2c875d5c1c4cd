// The CTA shape the Hopper MHA kernels share: a producer warpgroup (its first warp or warps
// work: TMA copies, the backward's dQ writer) and consumer warpgroups (wgmma). The producer
// gives its registers back with setmaxnreg and the consumers take them; the launch opts into
// the shared memory first.
#pragma once

#include <cuda_runtime.h>

#include "device/sm90/sync.cuh"
#include "device/sm90/warpgroup.cuh"

namespace mlakit::detail::sm90 {

namespace dev = mlakit::device::sm90;

// Threads and registers of a CTA of one producer and `kConsumers` consumer warpgroups.
template <int kConsumers, int kProducerRegs, int kConsumerRegs>
struct WarpRoles {
  static constexpr int kThreads = (1 + kConsumers) * dev::kWarpgroupThreads;
  // setmaxnreg moves registers within the CTA's launch allocation (65536 / threads, rounded
  // down to 8): the consumers can take only what the producer gives back.
  static constexpr int kLaunchRegs = (65536 / kThreads) / 8 * 8;
  static_assert((kProducerRegs + kConsumers * kConsumerRegs) * dev::kWarpgroupThreads <= kLaunchRegs * kThreads,
                "setmaxnreg: the consumers' registers come from the producer's");
};

// Runs produce(warp, lane) on the first kProducerWarps warps of the producer warpgroup (its
// other warps return at once) and consume(consumer, thread in its warpgroup) on the consumer
// warpgroups, each after its register change.
template <int kProducerRegs, int kConsumerRegs, int kProducerWarps, class Produce, class Consume>
__device__ __forceinline__ void run_warp_roles(Produce&& produce, Consume&& consume) {
  static_assert(kProducerWarps >= 1 && kProducerWarps <= dev::kWarpsPerWarpgroup, "warps of the producer warpgroup");
  const int warpgroup = static_cast<int>(threadIdx.x) / dev::kWarpgroupThreads;
  if (warpgroup == 0) {
    dev::setmaxnreg_dec<kProducerRegs>();
    if (threadIdx.x < kProducerWarps * dev::kWarpSize) {
      if constexpr (kProducerWarps == 1) {
        produce(0, static_cast<int>(threadIdx.x));  // warp 0: the lane is the thread (the compiler does not fold % 32)
      } else {
        produce(static_cast<int>(threadIdx.x) / dev::kWarpSize, static_cast<int>(threadIdx.x) % dev::kWarpSize);
      }
    }
  } else {
    dev::setmaxnreg_inc<kConsumerRegs>();
    consume(warpgroup - 1, static_cast<int>(threadIdx.x) % dev::kWarpgroupThreads);
  }
}

// Launches `kernel` with `smem_bytes` of dynamic shared memory, opted into first (above 48
// KiB a kernel must ask for it).
template <class Kernel, class... Args>
cudaError_t launch_with_shared_memory(Kernel kernel, dim3 grid, int threads, int smem_bytes, cudaStream_t stream,
                                      const Args&... args) {
  const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
  if (err != cudaSuccess) return err;
  kernel<<<grid, threads, smem_bytes, stream>>>(args...);
  return cudaGetLastError();
}

}  // namespace mlakit::detail::sm90
