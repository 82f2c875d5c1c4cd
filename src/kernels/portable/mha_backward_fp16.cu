// The portable MHA prefill backward's main kernel for fp16 (all four head-dim pairs).
#include "kernels/portable/mha_backward_kernel.cuh"

namespace mlakit::detail {
template cudaError_t launch_mha_backward_main_portable<__half>(const MhaBackwardParams&, cudaStream_t);
}  // namespace mlakit::detail
