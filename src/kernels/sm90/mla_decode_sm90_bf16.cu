#include "kernels/sm90/mla_decode_sm90_impl.cuh"

namespace mlakit::detail {
template cudaError_t launch_mla_decode_sm90<__nv_bfloat16>(const DenseDecodeParams&, const CUtensorMap&, int, const CUtensorMap*,
                                                                cudaStream_t);
}  // namespace mlakit::detail
