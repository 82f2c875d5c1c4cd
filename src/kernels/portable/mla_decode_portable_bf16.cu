#include "kernels/portable/mla_decode_portable_impl.cuh"

namespace mlakit::detail {
template cudaError_t launch_mla_decode_portable<__nv_bfloat16>(const DenseDecodeParams&, cudaStream_t);
}  // namespace mlakit::detail
