// Launcher of the combine step of the split-KV decode, shared by every decode kernel family:
// the dispatch starts it after the attention kernel (kernels/combine/mla_decode_combine.cu).
#pragma once

#include <cuda_runtime.h>

#include "kernels/mla_params.h"

namespace mlakit::detail {

// Merges the partial results of split sequences and writes empty sequences (0, +inf);
// launches nothing when params.schedule.no_splits (no split, no empty sequence). Elem:
// __nv_bfloat16 or __half; kDv: the value width, 512 (MLA) or the GQA head dim 64 / 128 / 256.
template <typename Elem, int kDv = 512>
cudaError_t launch_mla_decode_combine(const CombineParams& params, cudaStream_t stream);

}  // namespace mlakit::detail
