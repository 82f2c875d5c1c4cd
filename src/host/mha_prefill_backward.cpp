// Public GPU entry point of the MHA prefill backward: validation, layout rules of the kernels,
// device checks, the workspace, dispatch (include/mlakit/mha_prefill.h).
#include <string>
#include <utility>

#include "common/mha_backward_tiling.h"
#include "host/check.h"
#include "host/decode_layout.h"
#include "host/device.h"
#include "host/mha_prefill_validate.h"
#include "host/mla_decode_validate.h"
#include "mlakit/mha_prefill.h"
#if MLAKIT_WITH_CUDA
#include "dispatch/mha_backward_dispatch.h"
#endif

namespace mlakit {
namespace {

constexpr const char* kOp = "mha_prefill_backward";

// The kernel request: kPortable runs the portable kernels; kSm90 the Hopper main kernel where
// it serves the problem (the dispatch says why not otherwise); kAuto the Hopper one where it
// serves the problem and the layout on a Hopper GPU, the portable ones otherwise.
Status check_kernel_request(const char* op, MlaKernel kernel) {
  if (kernel == MlaKernel::kAuto || kernel == MlaKernel::kPortable || kernel == MlaKernel::kSm90) {
    return Status::ok();
  }
  return detail::invalid(op, "kernel: expected kAuto, kPortable or kSm90, got " +
                                 std::to_string(static_cast<int>(kernel)));
}

detail::MhaBackwardWorkspace workspace_of(const MhaPrefillBackwardArgs& args, const detail::MhaPrefillShape& s) {
  const detail::MhaBackwardWorkspace w =
      detail::mha_backward_workspace(s.b, s.total_q, s.h_q, s.d_qk, s.d_v, args.max_seqlen_q, args.deterministic);
  // The tail split only where the Hopper kernel may run: its dims, its dq slots, not kPortable.
  if (w.dq_slots == 0 || args.kernel == MlaKernel::kPortable) return w;
  return detail::mha_backward_add_tail_split(w, s.d_qk, s.d_v, s.h_kv > 0 ? s.h_q / s.h_kv : 0, args.max_seqlen_q,
                                             args.causal);
}

}  // namespace

Status mha_prefill_backward_workspace_size(const MhaPrefillBackwardArgs& args, std::size_t* bytes) {
  constexpr const char* kSizeOp = "mha_prefill_backward_workspace_size";
  if (bytes == nullptr) return detail::invalid(kSizeOp, "bytes: expected a pointer, got nullptr");
  detail::MhaPrefillShape shape;
  MLAKIT_RETURN_IF_ERROR(detail::validate_mha_prefill_backward_args(kSizeOp, args, /*allow_float=*/false, &shape));
  MLAKIT_RETURN_IF_ERROR(check_kernel_request(kSizeOp, args.kernel));
  *bytes = static_cast<std::size_t>(workspace_of(args, shape).bytes);
  return Status::ok();
}

Status mha_prefill_backward(const MhaPrefillBackwardArgs& args, void* workspace, std::size_t workspace_bytes,
                            cudaStream_t stream) {
  detail::MhaPrefillShape shape;
  MLAKIT_RETURN_IF_ERROR(detail::validate_mha_prefill_backward_args(kOp, args, /*allow_float=*/false, &shape));
  MLAKIT_RETURN_IF_ERROR(check_kernel_request(kOp, args.kernel));
  constexpr int64_t kPairBytes = 4;  // every kernel moves two 16-bit values at a time at least
  const std::pair<const char*, const TensorRef*> rows[] = {{"dout", &args.dout}, {"q", &args.q},   {"k", &args.k},
                                                           {"v", &args.v},       {"out", &args.out}, {"dq", &args.dq},
                                                           {"dk", &args.dk},     {"dv", &args.dv}};
  for (const auto& [name, t] : rows) MLAKIT_RETURN_IF_ERROR(detail::check_mha_row_alignment(kOp, name, *t, kPairBytes));
  detail::DeviceInfo dev;
  MLAKIT_RETURN_IF_ERROR(detail::current_supported_device(kOp, &dev));
  if (args.kernel == MlaKernel::kSm90 && dev.cc_major != 9) {
    return Status(StatusCode::kUnsupportedArchitecture,
                  std::string(kOp) + ": kernel: kSm90 needs a GPU of compute capability 9.x, this one is " +
                      std::to_string(dev.cc_major) + "." + std::to_string(dev.cc_minor));
  }
  // sm90 adds dQ by bulk reductions (a staging area in shared memory); older GPUs by atomics.
  const bool bulk_dq = dev.cc_major >= 9;
  const int smem = detail::mha_backward_smem_bytes(shape.d_qk, shape.d_v, bulk_dq);
  if (dev.max_smem_per_block_optin < smem) {
    return Status(StatusCode::kUnsupportedArchitecture,
                  std::string(kOp) + ": q.shape[2], v.shape[2] (d_qk, d_v) = (" + std::to_string(shape.d_qk) + ", " +
                      std::to_string(shape.d_v) + "): the backward kernel needs " + std::to_string(smem) +
                      " bytes of shared memory per block, this GPU allows " +
                      std::to_string(dev.max_smem_per_block_optin));
  }
  const std::pair<const char*, const void*> pointers[] = {
      {"dout", args.dout.data}, {"q", args.q.data},     {"k", args.k.data},
      {"v", args.v.data},       {"out", args.out.data}, {"lse", args.lse.data},
      {"cu_seqlens_q", args.cu_seqlens_q.data},         {"cu_seqlens_k", args.cu_seqlens_k.data},
      {"dq", args.dq.data},     {"dk", args.dk.data},   {"dv", args.dv.data}};
  for (const auto& [name, ptr] : pointers) {
    if (ptr != nullptr) MLAKIT_RETURN_IF_ERROR(detail::check_device_pointer(kOp, name, ptr, dev.ordinal));
  }
  const detail::MhaBackwardWorkspace layout = workspace_of(args, shape);
  if (layout.bytes > 0) {
    MLAKIT_RETURN_IF_ERROR(detail::check_workspace(kOp, workspace, workspace_bytes,
                                                   static_cast<std::size_t>(layout.bytes), dev.ordinal));
  }
  // b = 0: no sequence, nothing to write. total_q = 0 or h_q = 0 still zeroes dk and dv of the
  // keys inside sequences (the kernels run with no query rows).
  if (shape.b == 0) return Status::ok();
#if MLAKIT_WITH_CUDA
  return detail::dispatch_mha_backward(args, shape, detail::resolve_softmax_scale(args.softmax_scale, shape.d_qk),
                                       layout, bulk_dq, /*hopper=*/dev.cc_major == 9, dev.sm_count, workspace,
                                       stream);
#else
  (void)stream;
  return detail::built_without_cuda(kOp);
#endif
}

}  // namespace mlakit
