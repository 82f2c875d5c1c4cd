// Public GPU entry point of merge_states: validation, device checks, dispatch.
#include "mlakit/merge.h"

#include <string>

#include "host/check.h"
#include "host/device.h"
#include "host/merge_validate.h"
#if MLAKIT_WITH_CUDA
#include "dispatch/merge_dispatch.h"
#endif

namespace mlakit {
namespace {

constexpr const char* kOp = "merge_states";

// The pointer is aligned to the tensor's element size (strides are in elements, so every
// element then is).
Status check_element_alignment(const char* name, const TensorRef& t) {
  return detail::check_row_alignment(kOp, name, t, static_cast<int>(dtype_size(t.dtype)));
}

}  // namespace

Status merge_states(const MergeStatesArgs& args, cudaStream_t stream) {
  detail::MergeLayout layout;
  MLAKIT_RETURN_IF_ERROR(detail::validate_merge_states(kOp, args, &layout));
  // The kernel loads whole elements (the reference also takes unaligned host arrays).
  for (int i = 0; i < args.num_states; ++i) {
    MLAKIT_RETURN_IF_ERROR(check_element_alignment(("o[" + std::to_string(i) + "]").c_str(), args.o[i]));
    MLAKIT_RETURN_IF_ERROR(check_element_alignment(("lse[" + std::to_string(i) + "]").c_str(), args.lse[i]));
  }
  MLAKIT_RETURN_IF_ERROR(check_element_alignment("out", args.out));
  if (!args.out_lse.empty()) MLAKIT_RETURN_IF_ERROR(check_element_alignment("out_lse", args.out_lse));
  if (layout.rows == 0) return Status::ok();  // nothing to write: no device needed
  detail::DeviceInfo dev;
  MLAKIT_RETURN_IF_ERROR(detail::current_supported_device(kOp, &dev));
  for (int i = 0; i < args.num_states; ++i) {
    const std::string o_name = "o[" + std::to_string(i) + "]", lse_name = "lse[" + std::to_string(i) + "]";
    MLAKIT_RETURN_IF_ERROR(detail::check_device_pointer(kOp, o_name.c_str(), args.o[i].data, dev.ordinal));
    MLAKIT_RETURN_IF_ERROR(detail::check_device_pointer(kOp, lse_name.c_str(), args.lse[i].data, dev.ordinal));
  }
  MLAKIT_RETURN_IF_ERROR(detail::check_device_pointer(kOp, "out", args.out.data, dev.ordinal));
  if (layout.out_lse != nullptr) {
    MLAKIT_RETURN_IF_ERROR(detail::check_device_pointer(kOp, "out_lse", layout.out_lse, dev.ordinal));
  }
#if MLAKIT_WITH_CUDA
  return detail::dispatch_merge_states(kOp, layout, args.o[0].dtype, args.out.dtype, dev.sm_count, stream);
#else
  (void)stream;
  return detail::built_without_cuda(kOp);
#endif
}

}  // namespace mlakit
