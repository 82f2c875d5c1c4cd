// Validation of dense MLA decode arguments. The host-only part is shared by the GPU entry
// point and the CPU reference; the device part adds what only the GPU path needs.
#pragma once

#include <optional>

#include "mlakit/mla_decode.h"

namespace mlakit::detail {

// dtypes, ranks, shape agreement, contiguity, scale, outputs (own elements, disjoint from
// each other and the inputs); fills `problem` from the shapes.
// `allow_float_out`: `out` may also be float32 (the CPU reference's unrounded output).
Status validate_mla_decode_args(const char* op, const MlaDecodeArgs& args,
                                MlaDecodeProblem* problem, bool allow_float_out = false);

// Alignment the kernels need, pointer locations, and agreement with the plan.
Status validate_mla_decode_device_args(const char* op, const MlaDecodeArgs& args,
                                       const MlaDecodeProblem& problem,
                                       const MlaDecodePlan& plan, int device);

// Unset -> 1/sqrt(d_qk); a set (validated, finite) scale is used as given.
float resolve_softmax_scale(std::optional<float> scale, int d_qk);

}  // namespace mlakit::detail
