// Dispatch of the MHA prefill backward: validated arguments -> the portable kernels
// (preprocess, main, postprocess) over the caller's workspace. Plain C++ interface;
// implemented in CUDA.
#pragma once

#include "common/mha_backward_tiling.h"
#include "common/mha_prefill_shape.h"
#include "mlakit/mha_prefill.h"

namespace mlakit::detail {

// Arguments validated (validate_mha_prefill_backward_args and the GPU entry's layout rules),
// b >= 1; `softmax_scale` resolved; `workspace` holds `layout.bytes` bytes (may be null when
// that is 0); `bulk_dq`: the device has bulk reductions (sm90 and later: dQ by bulk
// reductions, MhaBackwardConfig); `hopper`: the device is compute capability 9.x, where kAuto
// takes the Hopper main kernel for the problems and layouts it serves; `sm_count`: the device's
// SMs (the Hopper kernel's launch order).
Status dispatch_mha_backward(const MhaPrefillBackwardArgs& args, const MhaPrefillShape& shape, float softmax_scale,
                             const MhaBackwardWorkspace& layout, bool bulk_dq, bool hopper, int sm_count,
                             void* workspace, cudaStream_t stream);

}  // namespace mlakit::detail
