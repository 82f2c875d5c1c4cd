// Validation of merge_states' arguments (include/mlakit/merge.h), shared by the GPU entry and
// the CPU reference so that both accept and reject the same inputs with the same messages.
#pragma once

#include "common/merge_layout.h"
#include "mlakit/merge.h"
#include "mlakit/status.h"

namespace mlakit::detail {

// Checks every argument (each error names it: "o[2].shape[1]", "out_lse") and fills `layout`
// (pointers, padded row shape and strides, base factors). Rows or d of 0 pass: the layout
// then holds rows * d == 0 and nothing is to be done.
Status validate_merge_states(const char* op, const MergeStatesArgs& args, MergeLayout* layout);

}  // namespace mlakit::detail
