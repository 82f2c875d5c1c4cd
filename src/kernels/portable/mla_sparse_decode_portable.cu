// Launcher of the portable split-KV sparse FP8 decode (bf16, its only dtype: docs/contract.md).
#include <cuda_bf16.h>

#include "kernels/portable/mla_decode_portable_impl.cuh"

namespace mlakit::detail {

cudaError_t launch_mla_sparse_decode_portable(const SparseDecodeParams& params, cudaStream_t stream) {
  return portable::launch_split_kv<__nv_bfloat16>(params, stream);
}

}  // namespace mlakit::detail
