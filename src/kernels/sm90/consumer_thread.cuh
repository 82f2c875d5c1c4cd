// Who a Hopper consumer thread is: threads 128..383 of the CTA are consumers 0 and 1
// (warpgroups 1 and 2), each holding two rows of the 64-row wgmma accumulators.
#pragma once

namespace mlakit::detail::sm90 {

struct ConsumerThread {
  int w;     // consumer 0 or 1
  int t;     // 0..255 over both consumers
  int lane;  // lane in its warp
  int r0;    // its accumulator rows are r0 and r0 + 8: 16 (warp in the warpgroup) + lane / 4
  __device__ ConsumerThread()
      : w(threadIdx.x / 128 - 1),
        t(threadIdx.x - 128),
        lane(threadIdx.x % 32),
        r0(16 * ((threadIdx.x % 128) / 32) + (threadIdx.x % 32) / 4) {}
};

}  // namespace mlakit::detail::sm90
