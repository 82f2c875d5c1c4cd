// A validated merge of partial attention states (include/mlakit/merge.h) as plain data: what
// the host's validation produces, the CPU reference reads and the GPU kernel takes as its
// parameters. Row dimensions are padded to three (leading sizes 1, strides 0), so every
// consumer indexes rows one way.
#pragma once

#include <cstdint>

namespace mlakit::detail {

inline constexpr int kMergeRowDims = 3;
// The public kMaxMergeStates (the host asserts they agree): 2 x 128 pointers keep the kernel's
// parameters under the 4 KiB every CUDA version accepts.
inline constexpr int kMergeStateCapacity = 128;

struct MergeLayout {
  int num_states = 0;
  int64_t d = 0;                            // elements per row
  int64_t rows = 0;                         // row_shape[0] * row_shape[1] * row_shape[2]
  int64_t row_shape[kMergeRowDims] = {};    // [r0, r1, r2]
  int64_t o_stride[kMergeRowDims] = {};     // elements; the same for every state
  int64_t lse_stride[kMergeRowDims] = {};   // elements; the same for every state
  int64_t out_stride[kMergeRowDims] = {};
  int64_t out_lse_stride[kMergeRowDims] = {};
  // 1 for base-2 inputs, log2(e) for natural ones: the weights are exp2((lse_i - max) * this).
  float lse_to_log2 = 1.f;
  // The merged LSE is formed in the inputs' base; this converts it to the output's (1, log2(e)
  // or ln 2): the same base gives back a lone state's LSE exactly.
  float lse_to_out_base = 1.f;
  void* out = nullptr;      // [rows, d] in the output dtype
  float* out_lse = nullptr;  // [rows] or nullptr
  const void* o[kMergeStateCapacity] = {};
  const float* lse[kMergeStateCapacity] = {};
};

}  // namespace mlakit::detail
