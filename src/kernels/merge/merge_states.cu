// Instances and launcher of the merge_states kernel.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "kernels/merge/merge_states_kernel.cuh"
#include "kernels/merge/merge_states_launch.h"

namespace mlakit::detail {

template <typename In, typename Out, int kVec>
cudaError_t launch_merge_states(const MergeLayout& layout, int sm_count, cudaStream_t stream) {
  // The smallest power of two of lanes whose kChunksPerLane chunks each cover a row, at most a
  // warp (longer rows take several passes).
  const int64_t chunks = layout.d / kVec;
  int group_shift = 0;
  while (group_shift < 5 && (int64_t{merge::kChunksPerLane} << group_shift) < chunks) ++group_shift;
  const int64_t rows_per_cta = (merge::kThreads / 32) * (int64_t{32} >> group_shift);
  // A grid-stride loop over one wave of resident CTAs.
  const int64_t needed = (layout.rows + rows_per_cta - 1) / rows_per_cta;
  const auto grid = static_cast<unsigned>(std::min<int64_t>(needed, int64_t{sm_count} * merge::kMinCtasPerSm));
  merge::merge_states_kernel<In, Out, kVec><<<grid, merge::kThreads, 0, stream>>>(layout, group_shift);
  return cudaGetLastError();
}

#define MLAKIT_MERGE_INSTANCES(In, Out)                                                                   \
  template cudaError_t launch_merge_states<In, Out, 16 / sizeof(In)>(const MergeLayout&, int, cudaStream_t); \
  template cudaError_t launch_merge_states<In, Out, 1>(const MergeLayout&, int, cudaStream_t);

#define MLAKIT_MERGE_INSTANCES_FROM(In)    \
  MLAKIT_MERGE_INSTANCES(In, float)        \
  MLAKIT_MERGE_INSTANCES(In, __nv_bfloat16) \
  MLAKIT_MERGE_INSTANCES(In, __half)

MLAKIT_MERGE_INSTANCES_FROM(float)
MLAKIT_MERGE_INSTANCES_FROM(__nv_bfloat16)
MLAKIT_MERGE_INSTANCES_FROM(__half)

#undef MLAKIT_MERGE_INSTANCES_FROM
#undef MLAKIT_MERGE_INSTANCES

}  // namespace mlakit::detail
