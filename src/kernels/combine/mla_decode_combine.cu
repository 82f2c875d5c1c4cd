// Launcher of the combine kernel, one instantiation per dtype.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/combine/mla_decode_combine.cuh"
#include "kernels/combine/mla_decode_combine_launch.h"

namespace mlakit::detail {

template <typename Elem, int kDv>
cudaError_t launch_mla_decode_combine(const CombineParams& params, cudaStream_t stream) {
  // A plan without splits (and so without empty sequences): the attention kernel wrote every
  // output; the combine would only read the split counts and return. Checked here because
  // the dispatch starts the combine after every planned attention launch.
  if (params.schedule.no_splits) return cudaSuccess;
  using C = portable::CombineConfig;
  const int row_groups = min((params.core.rows + C::kWarps - 1) / C::kWarps, C::kMaxRowGroups);
  dim3 grid(static_cast<unsigned>(params.core.b), params.core.h_kv, row_groups);
  portable::mla_decode_combine_kernel<Elem, kDv><<<grid, portable::CombineConfig::kThreads, 0, stream>>>(params);
  return cudaGetLastError();
}

#define MLAKIT_COMBINE_INSTANCE(Elem, DV) \
  template cudaError_t launch_mla_decode_combine<Elem, DV>(const CombineParams&, cudaStream_t);
MLAKIT_COMBINE_INSTANCE(__nv_bfloat16, 512)
MLAKIT_COMBINE_INSTANCE(__half, 512)
// The GQA decode's head dims.
MLAKIT_COMBINE_INSTANCE(__nv_bfloat16, 64)
MLAKIT_COMBINE_INSTANCE(__half, 64)
MLAKIT_COMBINE_INSTANCE(__nv_bfloat16, 128)
MLAKIT_COMBINE_INSTANCE(__half, 128)
MLAKIT_COMBINE_INSTANCE(__nv_bfloat16, 256)
MLAKIT_COMBINE_INSTANCE(__half, 256)
#undef MLAKIT_COMBINE_INSTANCE

}  // namespace mlakit::detail
