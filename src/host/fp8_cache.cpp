// GPU entry points of the FP8 MLA cache tools: validation, then one launch.
#include "mlakit/fp8_cache.h"

#include <string>

#include "common/fp8_cache_row.h"
#include "host/device.h"
#include "host/fp8_cache_args.h"
#if MLAKIT_WITH_CUDA
#include "kernels/portable/fp8_cache_launch.h"
#endif

namespace mlakit {
namespace {

constexpr int64_t kRowLen = detail::kFp8NopeDim + detail::kFp8RopeDim;

Status device_and_pointers(const char* op, std::initializer_list<std::pair<const char*, const void*>> pointers,
                           int* device) {
  detail::DeviceInfo dev;
  MLAKIT_RETURN_IF_ERROR(detail::current_device_info(op, &dev));
  for (const auto& [name, ptr] : pointers) {
    if (ptr != nullptr) MLAKIT_RETURN_IF_ERROR(detail::check_device_pointer(op, name, ptr, dev.ordinal));
  }
  *device = dev.ordinal;
  return Status::ok();
}

#if MLAKIT_WITH_CUDA
Status cuda_status(const char* op, cudaError_t err) {
  if (err == cudaSuccess) return Status::ok();
  return Status(StatusCode::kCudaError, std::string(op) + ": " + cudaGetErrorString(err));
}
#endif

}  // namespace

Status quantize_mla_cache_fp8(const TensorRef& src, const TensorRef& dst, cudaStream_t stream) {
  constexpr const char* kOp = "quantize_mla_cache_fp8";
  detail::TensorRows s, d;
  MLAKIT_RETURN_IF_ERROR(
      detail::validate_fp8_convert(kOp, src, DType::kBF16, kRowLen, dst, DType::kUInt8, kMlaFp8TokenBytes, &s, &d));
  int device = 0;
  MLAKIT_RETURN_IF_ERROR(device_and_pointers(kOp, {{"src", src.data}, {"dst", dst.data}}, &device));
#if MLAKIT_WITH_CUDA
  return cuda_status(kOp, detail::launch_quantize_mla_fp8(static_cast<const uint16_t*>(s.data), s.stride,
                                                          static_cast<uint8_t*>(d.data), d.stride, s.rows, stream));
#else
  (void)stream;
  return detail::built_without_cuda(kOp);
#endif
}

Status dequantize_mla_cache_fp8(const TensorRef& src, const TensorRef& dst, cudaStream_t stream) {
  constexpr const char* kOp = "dequantize_mla_cache_fp8";
  detail::TensorRows s, d;
  MLAKIT_RETURN_IF_ERROR(
      detail::validate_fp8_convert(kOp, src, DType::kUInt8, kMlaFp8TokenBytes, dst, DType::kBF16, kRowLen, &s, &d));
  int device = 0;
  MLAKIT_RETURN_IF_ERROR(device_and_pointers(kOp, {{"src", src.data}, {"dst", dst.data}}, &device));
#if MLAKIT_WITH_CUDA
  return cuda_status(kOp, detail::launch_dequantize_mla_fp8(static_cast<const uint8_t*>(s.data), s.stride,
                                                            static_cast<uint16_t*>(d.data), d.stride, s.rows, stream));
#else
  (void)stream;
  return detail::built_without_cuda(kOp);
#endif
}

Status append_mla_cache_fp8(const TensorRef& tokens, const TensorRef& slots, const TensorRef& cache,
                            cudaStream_t stream) {
  constexpr const char* kOp = "append_mla_cache_fp8";
  detail::Fp8AppendArgs a;
  MLAKIT_RETURN_IF_ERROR(detail::validate_fp8_append(kOp, tokens, slots, cache, &a));
  int device = 0;
  MLAKIT_RETURN_IF_ERROR(
      device_and_pointers(kOp, {{"tokens", tokens.data}, {"slots", slots.data}, {"cache", cache.data}}, &device));
#if MLAKIT_WITH_CUDA
  return cuda_status(kOp, detail::launch_append_mla_fp8(static_cast<const uint16_t*>(a.tokens.data), a.tokens.stride,
                                                        a.slots, a.tokens.rows, a.cache, a.block_stride, a.page_stride,
                                                        a.page_size, a.num_blocks, stream));
#else
  (void)stream;
  return detail::built_without_cuda(kOp);
#endif
}

}  // namespace mlakit
