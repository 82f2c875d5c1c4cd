// Public GPU entry point of the MHA prefill: validation, layout rules of the kernels, device
// checks, dispatch. The workspace holds the Hopper kernel's tail split (common/mha_prefill_tiling.h).
#include "mlakit/mha_prefill.h"

#include <utility>

#include "common/mha_prefill_tiling.h"
#include "host/check.h"
#include "host/decode_layout.h"
#include "host/device.h"
#include "host/mha_prefill_validate.h"
#include "host/mla_decode_validate.h"
#if MLAKIT_WITH_CUDA
#include "dispatch/mha_prefill_dispatch.h"
#endif

namespace mlakit {
namespace {

constexpr const char* kOp = "mha_prefill";

// The Hopper kernel's tail split (common/mha_prefill_tiling.h); none for the portable kernel.
std::size_t workspace_bytes_of(const MhaPrefillArgs& args, const detail::MhaPrefillShape& s) {
  if (args.kernel == MlaKernel::kPortable) return 0;
  return static_cast<std::size_t>(detail::mha_prefill_workspace_bytes(args.max_seqlen_q, args.max_seqlen_k, s.h_q,
                                                                      s.b, s.d_qk, s.d_v, args.causal));
}

}  // namespace

Status mha_prefill_workspace_size(const MhaPrefillArgs& args, std::size_t* bytes) {
  constexpr const char* kSizeOp = "mha_prefill_workspace_size";
  if (bytes == nullptr) return detail::invalid(kSizeOp, "bytes: expected a pointer, got nullptr");
  detail::MhaPrefillShape shape;
  MLAKIT_RETURN_IF_ERROR(detail::validate_mha_prefill_args(kSizeOp, args, /*allow_float_out=*/false, &shape));
  *bytes = workspace_bytes_of(args, shape);
  return Status::ok();
}

Status mha_prefill(const MhaPrefillArgs& args, void* workspace, std::size_t workspace_bytes, cudaStream_t stream) {
  detail::MhaPrefillShape shape;
  MLAKIT_RETURN_IF_ERROR(detail::validate_mha_prefill_args(kOp, args, /*allow_float_out=*/false, &shape));
  constexpr int64_t kPairBytes = 4;
  MLAKIT_RETURN_IF_ERROR(detail::check_mha_row_alignment(kOp, "q", args.q, kPairBytes));
  MLAKIT_RETURN_IF_ERROR(detail::check_mha_row_alignment(kOp, "k", args.k, kPairBytes));
  MLAKIT_RETURN_IF_ERROR(detail::check_mha_row_alignment(kOp, "v", args.v, kPairBytes));
  MLAKIT_RETURN_IF_ERROR(detail::check_mha_row_alignment(kOp, "out", args.out, kPairBytes));
  if (args.kernel == MlaKernel::kSm90) {  // TMA reads q, k and v in 16-byte rows
    constexpr int64_t kTmaBytes = 16;
    MLAKIT_RETURN_IF_ERROR(detail::check_mha_row_alignment(kOp, "q", args.q, kTmaBytes));
    MLAKIT_RETURN_IF_ERROR(detail::check_mha_row_alignment(kOp, "k", args.k, kTmaBytes));
    MLAKIT_RETURN_IF_ERROR(detail::check_mha_row_alignment(kOp, "v", args.v, kTmaBytes));
  }
  detail::DeviceInfo dev;
  MLAKIT_RETURN_IF_ERROR(detail::current_supported_device(kOp, &dev));
  const std::pair<const char*, const void*> pointers[] = {
      {"q", args.q.data},   {"k", args.k.data},     {"v", args.v.data}, {"cu_seqlens_q", args.cu_seqlens_q.data},
      {"cu_seqlens_k", args.cu_seqlens_k.data}, {"out", args.out.data}, {"lse", args.lse.data}};
  for (const auto& [name, ptr] : pointers) {
    if (ptr != nullptr) MLAKIT_RETURN_IF_ERROR(detail::check_device_pointer(kOp, name, ptr, dev.ordinal));
  }
  detail::DecodeKernelTraits traits;
  MLAKIT_RETURN_IF_ERROR(detail::select_decode_kernel(kOp, dev, args.kernel, &traits, "kernel"));
  const std::size_t needed = workspace_bytes_of(args, shape);
  if (needed > 0) {
    MLAKIT_RETURN_IF_ERROR(detail::check_workspace(kOp, workspace, workspace_bytes, needed, dev.ordinal));
  }
  if (detail::is_empty_problem(shape)) return Status::ok();
  // The kernels' grids are (query tiles, h_q, b): CUDA caps the last two at 65535.
  constexpr int64_t kMaxGridYZ = 65535;
  if (shape.b > kMaxGridYZ) {
    return detail::unsupported(kOp, "cu_seqlens_q.shape[0] (b + 1): expected b <= 65535, got " +
                                        std::to_string(shape.b));
  }
  if (shape.h_q > kMaxGridYZ) {
    return detail::unsupported(kOp, "q.shape[1] (h_q): expected <= 65535, got " + std::to_string(shape.h_q));
  }
#if MLAKIT_WITH_CUDA
  return detail::dispatch_mha_prefill(args, shape, detail::resolve_softmax_scale(args.softmax_scale, shape.d_qk),
                                      args.kernel == MlaKernel::kSm90, traits.kernel, dev.sm_count,
                                      needed > 0 ? workspace : nullptr, stream);
#else
  (void)stream;
  return detail::built_without_cuda(kOp);
#endif
}

}  // namespace mlakit
