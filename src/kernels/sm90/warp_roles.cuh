// The CTA shape the Hopper MHA kernels share: a producer warpgroup (only its first warp
// works: TMA copies) and consumer warpgroups (wgmma). The producer gives its registers back
// with setmaxnreg and the consumers take them; the launch opts into the shared memory first.
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

// Runs produce(lane) on the producer warp and consume(consumer, thread in its warpgroup) on
// the consumer warpgroups, each after its register change. The producer warpgroup's other
// three warps return at once.
template <int kProducerRegs, int kConsumerRegs, class Produce, class Consume>
__device__ __forceinline__ void run_warp_roles(Produce&& produce, Consume&& consume) {
  const int warpgroup = static_cast<int>(threadIdx.x) / dev::kWarpgroupThreads;
  if (warpgroup == 0) {
    dev::setmaxnreg_dec<kProducerRegs>();
    if (threadIdx.x < dev::kWarpSize) produce(static_cast<int>(threadIdx.x));
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
