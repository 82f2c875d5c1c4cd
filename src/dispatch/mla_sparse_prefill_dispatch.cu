#include "dispatch/mla_sparse_prefill_dispatch.h"

#include <cuda_bf16.h>

#include "common/decode_schedule.h"
#include "dispatch/cuda_status.h"
#include "dispatch/mla_sparse_prefill_params.h"
#include "kernels/portable/launch.h"
#include "kernels/sm90/launch.h"

namespace mlakit::detail {

Status dispatch_mla_sparse_prefill(const MlaSparsePrefillArgs& a, const SparsePrefillShape& shape, float sm_scale,
                                   MlaDecodeKernel kernel, cudaStream_t stream) {
  const MlaDecodeParams params = sparse_prefill_params(a, shape, sm_scale);
  return cuda_status("mla_sparse_prefill", kernel == MlaDecodeKernel::kSm90
                                               ? launch_mla_sparse_prefill_sm90<__nv_bfloat16>(params, stream)
                                               : launch_mla_portable_whole_sequence<__nv_bfloat16>(params, stream));
}

}  // namespace mlakit::detail
