// The portable MHA prefill kernel for bf16 (all four head-dim pairs).
#include "kernels/portable/mha_prefill_kernel.cuh"

namespace mlakit::detail {
template cudaError_t launch_mha_prefill_portable<__nv_bfloat16>(const MhaPrefillParams&, cudaStream_t);
}  // namespace mlakit::detail
