// Public entry points of the dense MLA decode: validation, plan layout, dispatch.
#include "mlakit/mla_decode.h"

#include <string>

#include "host/check.h"
#include "host/decode_layout.h"
#include "host/device.h"
#include "host/mla_decode_validate.h"
#include "host/output_check.h"
#if MLAKIT_WITH_CUDA
#include "dispatch/mla_decode_dispatch.h"
#endif

namespace mlakit {
namespace {

using detail::invalid;

Status check_seqlens(const char* op, const TensorRef& seqlens, int64_t b, int device) {
  using namespace detail;
  MLAKIT_RETURN_IF_ERROR(check_vector(op, "cache_seqlens", seqlens, DType::kInt32, "b", b));
  MLAKIT_RETURN_IF_ERROR(check_row_alignment(op, "cache_seqlens", seqlens, 4));
  // b = 0: frameworks hand out a null pointer for an empty device array; nothing is read.
  if (has_no_elements(seqlens)) return Status::ok();
  return check_device_pointer(op, "cache_seqlens", seqlens.data, device);
}

}  // namespace

Status mla_decode_workspace_size(const MlaDecodeProblem& problem, std::size_t* bytes,
                                 const MlaDecodeOptions& options) {
  constexpr const char* kOp = "mla_decode_workspace_size";
  if (bytes == nullptr) return invalid(kOp, "bytes: expected a non-null pointer, got null");
  MLAKIT_RETURN_IF_ERROR(detail::validate_decode_problem(kOp, problem));
  detail::DeviceInfo dev;
  MLAKIT_RETURN_IF_ERROR(detail::current_supported_device(kOp, &dev));
  MlaDecodePlan layout;
  MLAKIT_RETURN_IF_ERROR(detail::make_decode_layout(problem, dev, &layout, options.kernel, kOp));
  *bytes = layout.workspace_bytes;
  return Status::ok();
}

Status mla_decode_plan(const MlaDecodeProblem& problem, const TensorRef& cache_seqlens,
                       void* workspace, std::size_t workspace_bytes, cudaStream_t stream,
                       MlaDecodePlan* plan, const MlaDecodeOptions& options) {
  constexpr const char* kOp = "mla_decode_plan";
  if (plan == nullptr) return invalid(kOp, "plan: expected a non-null pointer, got null");
  MLAKIT_RETURN_IF_ERROR(detail::validate_decode_problem(kOp, problem));
  detail::DeviceInfo dev;
  MLAKIT_RETURN_IF_ERROR(detail::current_supported_device(kOp, &dev));
  MLAKIT_RETURN_IF_ERROR(check_seqlens(kOp, cache_seqlens, problem.b, dev.ordinal));
  MlaDecodePlan layout;
  MLAKIT_RETURN_IF_ERROR(detail::make_decode_layout(problem, dev, &layout, options.kernel, kOp));
  MLAKIT_RETURN_IF_ERROR(detail::attach_workspace(kOp, workspace, workspace_bytes, dev.ordinal, &layout));
  MLAKIT_RETURN_IF_ERROR(detail::check_disjoint(kOp, {detail::buffer_range("workspace", workspace, workspace_bytes)},
                                                {detail::tensor_range("cache_seqlens", cache_seqlens)}));
#if MLAKIT_WITH_CUDA
  if (!detail::is_empty_problem(problem)) {
    MLAKIT_RETURN_IF_ERROR(
        detail::dispatch_decode_plan(layout, static_cast<const int32_t*>(cache_seqlens.data), stream));
  }
#else
  (void)stream;
#endif
  *plan = layout;
  return Status::ok();
}

Status mla_decode(const MlaDecodeArgs& args, const MlaDecodePlan& plan, cudaStream_t stream) {
  constexpr const char* kOp = "mla_decode";
  MlaDecodeProblem problem;
  MLAKIT_RETURN_IF_ERROR(detail::validate_mla_decode_args(kOp, args, &problem));
  detail::DeviceInfo dev;
  MLAKIT_RETURN_IF_ERROR(detail::current_supported_device(kOp, &dev));
  MLAKIT_RETURN_IF_ERROR(detail::validate_mla_decode_device_args(kOp, args, problem, plan, dev.ordinal));
  if (detail::is_empty_problem(problem)) return Status::ok();  // the empty result: nothing to write
#if MLAKIT_WITH_CUDA
  return detail::dispatch_mla_decode(args, plan, detail::resolve_softmax_scale(args.softmax_scale, problem.d_qk),
                                     stream);
#else
  (void)stream;
  return detail::built_without_cuda(kOp);
#endif
}

}  // namespace mlakit
