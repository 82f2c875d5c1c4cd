// Who a Hopper consumer thread is: threads 128..383 of the CTA are consumers 0 and 1
// (warpgroups 1 and 2), each holding two rows of the 64-row wgmma accumulators.
#pragma once

#include "device/sm90/warpgroup.cuh"
#include "device/sm90/wgmma_fragment.cuh"

namespace mlakit::detail::sm90 {

struct ConsumerThread {
  int w;     // consumer 0 or 1
  int t;     // 0..255 over both consumers
  int lane;  // lane in its warp
  int r0;    // its accumulator rows are r0 and r0 + 8 (device::sm90::acc_row)
  __device__ ConsumerThread()
      : w(threadIdx.x / device::sm90::kWarpgroupThreads - 1),
        t(threadIdx.x - device::sm90::kWarpgroupThreads),
        lane(threadIdx.x % device::sm90::kWarpSize),
        r0(device::sm90::acc_row(threadIdx.x % device::sm90::kWarpgroupThreads, 0)) {}
};

}  // namespace mlakit::detail::sm90
