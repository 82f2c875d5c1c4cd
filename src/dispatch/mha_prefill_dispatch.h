// Dispatch of the MHA prefill: validated arguments -> the Hopper kernel (when its tensor maps
// can be built) or the portable kernel. Plain C++ interface; implemented in CUDA.
#pragma once

#include "common/mha_prefill_shape.h"
#include "kernels/mha_prefill_params.h"
#include "mlakit/mha_prefill.h"

namespace mlakit::detail {

// The kernels' parameters of validated arguments (`scale` resolved); the backward's dispatch
// builds its forward part from the same arguments.
MhaPrefillParams mha_prefill_params(const MhaPrefillArgs& args, const MhaPrefillShape& shape, float scale);

// Arguments validated (validate_mha_prefill_args and the GPU entry's layout and grid rules),
// not an empty problem; `softmax_scale` resolved; `kernel` resolved (kPortable or kSm90).
// `sm90_required`: the caller asked for kSm90 explicitly, so a layout the Hopper kernel
// cannot take is an error instead of a fall-back to the portable kernel. `workspace`: the
// caller's, checked against mha_prefill_workspace_bytes (null where that is 0); the Hopper
// kernel's tail split (planned for `sm_count` SMs) keeps its partial rows there.
Status dispatch_mha_prefill(const MhaPrefillArgs& args, const MhaPrefillShape& shape, float softmax_scale,
                            bool sm90_required, MlaKernel kernel, int sm_count, void* workspace, cudaStream_t stream);

}  // namespace mlakit::detail
