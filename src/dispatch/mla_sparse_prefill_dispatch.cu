#include "dispatch/mla_sparse_prefill_dispatch.h"

#include <cuda_bf16.h>

#include <string>

#include "common/decode_schedule.h"
#include "dispatch/cuda_status.h"
#include "dispatch/mla_sparse_prefill_params.h"
#include "dispatch/tma_tensor.h"
#include "kernels/portable/launch.h"
#include "kernels/sm90/launch.h"

namespace mlakit::detail {

Status dispatch_mla_sparse_prefill(const MlaSparsePrefillArgs& a, const SparsePrefillShape& shape, float sm_scale,
                                   MlaKernel kernel, cudaStream_t stream) {
  const SparsePrefillParams params = sparse_prefill_params(a, shape, sm_scale);
  if (kernel == MlaKernel::kSm90) {
    CUtensorMap q_map;
    std::string why;  // no map (unaligned q): the consumers copy Q by cp.async
    const CUtensorMap* q_by_tma = make_sparse_prefill_q_tensor_map(tma_tensor(a.q), &q_map, &why) ? &q_map : nullptr;
    return cuda_status("mla_sparse_prefill", launch_mla_sparse_prefill_sm90(params, q_by_tma, stream));
  }
  return cuda_status("mla_sparse_prefill", launch_mla_sparse_prefill_portable(params, stream));
}

}  // namespace mlakit::detail
