// Device planner of the split-KV decode. One CTA: the schedule of a decoding step is a few
// prefix sums over b and a binary search per part, microseconds even at b = 4096, and
// running it on the device keeps the step free of host synchronisation (CUDA-graph safe).
#include <cub/block/block_scan.cuh>

#include "kernels/schedule/decode_plan_launch.h"

namespace mlakit::detail {
namespace {

constexpr int kPlanThreads = 512;

// Exclusive prefix sums of f(i) for i in [0, b) into out[0..b], chunk by chunk.
template <typename T, typename F>
__device__ void block_exclusive_scan(int64_t b, F f, T* out) {
  using Scan = cub::BlockScan<T, kPlanThreads>;
  __shared__ typename Scan::TempStorage temp;
  T carry = 0;
  for (int64_t base = 0; base < b; base += kPlanThreads) {
    const int64_t i = base + threadIdx.x;
    T value = i < b ? f(i) : T(0);
    T prefix, total;
    Scan(temp).ExclusiveSum(value, prefix, total);
    if (i < b) out[i] = carry + prefix;
    carry += total;
    __syncthreads();  // temp is reused by the next chunk
  }
  if (threadIdx.x == 0) out[b] = carry;
  __syncthreads();  // out[] visible to the whole CTA
}

__global__ void __launch_bounds__(kPlanThreads)
    decode_plan_kernel(SeqLengths len, int64_t b, ScheduleConfig c,
                       int64_t* cost_prefix, int32_t* split_prefix, int32_t* partial_prefix,
                       PartRange* parts) {
  block_exclusive_scan<int64_t>(b, [&](int64_t i) { return sequence_cost(len(i), c); },
                                cost_prefix);
  const int64_t psize = part_size(cost_prefix[b], c);
  auto splits = [&](int64_t i) {
    return sequence_splits(cost_prefix[i], key_blocks(len(i), c.block_n), c, psize);
  };
  block_exclusive_scan<int32_t>(b, splits, split_prefix);
  block_exclusive_scan<int32_t>(b, [&](int64_t i) { return partial_slots(splits(i)); },
                                partial_prefix);
  for (int p = threadIdx.x; p < c.num_parts; p += kPlanThreads) {
    parts[p] = part_range(p, cost_prefix, len, b, c, psize);
  }
}

}  // namespace

cudaError_t launch_decode_plan(const SeqLengths& lengths, int64_t b, const ScheduleConfig& config,
                               int64_t* cost_prefix, int32_t* split_prefix,
                               int32_t* partial_prefix, PartRange* parts, cudaStream_t stream) {
  decode_plan_kernel<<<1, kPlanThreads, 0, stream>>>(lengths, b, config, cost_prefix,
                                                     split_prefix, partial_prefix, parts);
  return cudaGetLastError();
}

}  // namespace mlakit::detail
