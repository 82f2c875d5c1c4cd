// GPU entry points of the FP8 MLA cache tools (the V3.2 and the V4 cache): validation, then one
// launch.
#include "mlakit/fp8_cache.h"

#include <initializer_list>
#include <utility>

#include "common/fp8_cache_row.h"
#include "host/device.h"
#include "host/fp8_cache_args.h"
#include "host/fp8_v4_cache_args.h"
#if MLAKIT_WITH_CUDA
#include "dispatch/fp8_cache_dispatch.h"
#include "dispatch/fp8_v4_cache_dispatch.h"
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

}  // namespace

Status quantize_mla_cache_fp8(const TensorRef& src, const TensorRef& dst, cudaStream_t stream) {
  constexpr const char* kOp = "quantize_mla_cache_fp8";
  detail::TensorRows s, d;
  MLAKIT_RETURN_IF_ERROR(
      detail::validate_fp8_convert(kOp, src, DType::kBF16, kRowLen, dst, DType::kUInt8, kMlaFp8TokenBytes, &s, &d));
  int device = 0;
  MLAKIT_RETURN_IF_ERROR(device_and_pointers(kOp, {{"src", src.data}, {"dst", dst.data}}, &device));
#if MLAKIT_WITH_CUDA
  return detail::dispatch_quantize_mla_fp8(kOp, s, d, stream);
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
  return detail::dispatch_dequantize_mla_fp8(kOp, s, d, stream);
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
  return detail::dispatch_append_mla_fp8(kOp, a, stream);
#else
  (void)stream;
  return detail::built_without_cuda(kOp);
#endif
}

namespace {

// quantize_mla_cache_fp8_v4 and dequantize_mla_cache_fp8_v4: one path, the direction apart.
Status convert_v4(const char* op, detail::V4Convert direction, const TensorRef& src, const TensorRef& dst,
                  cudaStream_t stream) {
  detail::V4ConvertArgs a;
  MLAKIT_RETURN_IF_ERROR(detail::validate_v4_convert(op, direction, src, dst, &a));
  int device = 0;
  MLAKIT_RETURN_IF_ERROR(device_and_pointers(op, {{"src", src.data}, {"dst", dst.data}}, &device));
#if MLAKIT_WITH_CUDA
  return detail::dispatch_convert_mla_fp8_v4(op, direction, a, stream);
#else
  (void)stream;
  return detail::built_without_cuda(op);
#endif
}

}  // namespace

Status quantize_mla_cache_fp8_v4(const TensorRef& src, const TensorRef& dst, cudaStream_t stream) {
  return convert_v4("quantize_mla_cache_fp8_v4", detail::V4Convert::kQuantize, src, dst, stream);
}

Status dequantize_mla_cache_fp8_v4(const TensorRef& src, const TensorRef& dst, cudaStream_t stream) {
  return convert_v4("dequantize_mla_cache_fp8_v4", detail::V4Convert::kDequantize, src, dst, stream);
}

Status append_mla_cache_fp8_v4(const TensorRef& tokens, const TensorRef& slots, const TensorRef& cache,
                               cudaStream_t stream) {
  constexpr const char* kOp = "append_mla_cache_fp8_v4";
  detail::V4AppendArgs a;
  MLAKIT_RETURN_IF_ERROR(detail::validate_v4_append(kOp, tokens, slots, cache, &a));
  int device = 0;
  MLAKIT_RETURN_IF_ERROR(
      device_and_pointers(kOp, {{"tokens", tokens.data}, {"slots", slots.data}, {"cache", cache.data}}, &device));
#if MLAKIT_WITH_CUDA
  return detail::dispatch_append_mla_fp8_v4(kOp, a, stream);
#else
  (void)stream;
  return detail::built_without_cuda(kOp);
#endif
}

}  // namespace mlakit
