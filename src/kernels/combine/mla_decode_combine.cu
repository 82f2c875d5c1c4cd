// Launcher of the combine kernel, one instantiation per dtype.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/combine/mla_decode_combine.cuh"
#include "kernels/combine/mla_decode_combine_launch.h"

namespace mlakit::detail {

template <typename Elem>
cudaError_t launch_mla_decode_combine(const CombineParams& params, cudaStream_t stream) {
  // A plan without splits (and so without empty sequences): the attention kernel wrote every
  // output; the combine would only read the split counts and return. Checked here because
  // the dispatch starts the combine after every planned attention launch.
  if (params.schedule.no_splits) return cudaSuccess;
  using C = portable::CombineConfig;
  const int row_groups = min((params.core.rows + C::kWarps - 1) / C::kWarps, C::kMaxRowGroups);
  dim3 grid(static_cast<unsigned>(params.core.b), params.core.h_kv, row_groups);
  portable::mla_decode_combine_kernel<Elem><<<grid, portable::CombineConfig::kThreads, 0, stream>>>(params);
  return cudaGetLastError();
}

template cudaError_t launch_mla_decode_combine<__nv_bfloat16>(const CombineParams&, cudaStream_t);
template cudaError_t launch_mla_decode_combine<__half>(const CombineParams&, cudaStream_t);

}  // namespace mlakit::detail
