// Validation of the MHA prefill arguments (shapes, dtypes, strides, options), shared by the
// CPU reference and the GPU entry point to come; the prefix sums' values are device data
// that only the reference can read (it checks them itself).
#pragma once

#include <cstdint>

#include "common/mha_prefill_shape.h"
#include "mlakit/mha_prefill.h"

namespace mlakit::detail {

// (d_qk, d_v) one of (64, 64), (128, 128), (192, 128), (256, 256).
bool is_supported_head_dims(int d_qk, int d_v);

Status validate_mha_prefill_args(const char* op, const MhaPrefillArgs& args, bool allow_float_out,
                                 MhaPrefillShape* shape);

}  // namespace mlakit::detail
