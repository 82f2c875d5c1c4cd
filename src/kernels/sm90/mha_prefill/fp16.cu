// The Hopper MHA prefill for fp16 (src/kernels/sm90/mha_prefill/kernel.cuh), every head-dim pair.
#include <cuda_fp16.h>

#include "kernels/sm90/mha_prefill/kernel.cuh"

namespace mlakit::detail {
template cudaError_t launch_mha_prefill_sm90<__half>(const MhaPrefillParams&, const MhaPrefillMaps&, cudaStream_t);
}  // namespace mlakit::detail
