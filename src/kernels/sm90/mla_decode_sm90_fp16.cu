#include "kernels/sm90/mla_decode_sm90_impl.cuh"

namespace mlakit::detail {
template cudaError_t launch_mla_decode_sm90<__half>(const DenseDecodeParams&, const CUtensorMap&, int, const CUtensorMap*,
                                                                cudaStream_t);
}  // namespace mlakit::detail
