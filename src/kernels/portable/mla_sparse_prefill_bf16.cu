// The whole-sequence (no plan) mode of the portable kernel, for the sparse prefill (bf16).
#include "kernels/portable/mla_decode_portable_impl.cuh"

namespace mlakit::detail {
template cudaError_t launch_mla_portable_whole_sequence<__nv_bfloat16>(const MlaDecodeParams&, cudaStream_t);
}  // namespace mlakit::detail
