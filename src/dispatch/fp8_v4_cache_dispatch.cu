#include "dispatch/cuda_status.h"
#include "dispatch/fp8_v4_cache_dispatch.h"
#include "kernels/portable/fp8_v4_cache_launch.h"

namespace mlakit::detail {

Status dispatch_convert_mla_fp8_v4(const char* op, V4Convert direction, const V4ConvertArgs& args,
                                   cudaStream_t stream) {
  return cuda_status(op, direction == V4Convert::kQuantize ? launch_quantize_mla_fp8_v4(args, stream)
                                                           : launch_dequantize_mla_fp8_v4(args, stream));
}

Status dispatch_append_mla_fp8_v4(const char* op, const V4AppendArgs& args, cudaStream_t stream) {
  return cuda_status(op, launch_append_mla_fp8_v4(args, stream));
}

}  // namespace mlakit::detail
