// The Hopper MHA backward for fp16 q, k, v.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/sm90/mha_backward/kernel.cuh"

namespace mlakit::detail {
template cudaError_t launch_mha_backward_sm90<__half>(const MhaBackwardParams&, const MhaBackwardMaps&, cudaStream_t);
}  // namespace mlakit::detail
