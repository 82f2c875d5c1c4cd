// The GQA decode kernels for bf16 queries (every cache format and head dim).
#include "kernels/gqa/gqa_decode_instances.cuh"

namespace mlakit::detail {
template cudaError_t launch_gqa_decode<__nv_bfloat16>(const GqaDecodeParams&, GqaCacheFormat, cudaStream_t);
}  // namespace mlakit::detail
