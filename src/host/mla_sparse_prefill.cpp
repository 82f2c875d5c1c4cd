// Public entry point of the sparse MLA prefill: validation, device checks, dispatch. No plan
// and no workspace: the kernel runs each query token's keys in one CTA per row tile.
#include "mlakit/mla_sparse_prefill.h"

#include <string>
#include <utility>

#include "host/decode_layout.h"
#include "host/device.h"
#include "host/mla_decode_validate.h"
#include "host/mla_sparse_prefill_validate.h"
#if MLAKIT_WITH_CUDA
#include "dispatch/mla_sparse_prefill_dispatch.h"
#endif

namespace mlakit {

Status mla_sparse_prefill(const MlaSparsePrefillArgs& args, cudaStream_t stream) {
  constexpr const char* kOp = "mla_sparse_prefill";
  detail::SparsePrefillShape shape;
  MLAKIT_RETURN_IF_ERROR(detail::validate_mla_sparse_prefill_args(kOp, args, /*allow_float_out=*/false, &shape));
  const int rows_per_cta = detail::decode_kernel_traits(MlaKernel::kPortable).rows_per_tile;
  MLAKIT_RETURN_IF_ERROR(detail::validate_mla_sparse_prefill_kernel_args(kOp, args, shape, rows_per_cta));
  detail::DeviceInfo dev;
  MLAKIT_RETURN_IF_ERROR(detail::current_supported_device(kOp, &dev));
  const std::pair<const char*, const void*> pointers[] = {
      {"q", args.q.data},           {"kv", args.kv.data},         {"indices", args.indices.data},
      {"topk_length", args.topk_length.data}, {"attn_sink", args.attn_sink.data}, {"out", args.out.data},
      {"max_logits", args.max_logits.data},   {"lse", args.lse.data}};
  for (const auto& [name, ptr] : pointers) {
    if (ptr != nullptr) MLAKIT_RETURN_IF_ERROR(detail::check_device_pointer(kOp, name, ptr, dev.ordinal));
  }
  detail::DecodeKernelTraits traits;
  MLAKIT_RETURN_IF_ERROR(detail::select_decode_kernel(kOp, dev, args.kernel, &traits, "kernel"));
  if (detail::is_empty_problem(shape)) return Status::ok();  // the empty result (and no empty grid to launch)
#if MLAKIT_WITH_CUDA
  return detail::dispatch_mla_sparse_prefill(args, shape, detail::resolve_softmax_scale(args.sm_scale, shape.d_qk),
                                             traits.kernel, stream);
#else
  (void)stream;
  return detail::built_without_cuda(kOp);
#endif
}

}  // namespace mlakit
