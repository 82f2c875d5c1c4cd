// Host-side merge_states problems (include/mlakit/merge.h) for the CPU and GPU tests: N random
// partial states of the same rows, some of them empty, stored so that a wrong read shows:
//   - the states are slices of one stacked buffer [n, rows..., row pitch] whose padding past d
//     is NaN, and an empty state's (LSE -inf or +inf) values are NaN too: merging one in shows;
//   - the LSEs are stored [n, rows] or, with `transposed_lse` and 2+ row dimensions, with the
//     first two row dimensions swapped in memory (an engine's [heads, tokens] LSE passed as its
//     [tokens, heads] view).
// The same case gives the views over host memory (the reference) or a device copy (the GPU).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mlakit/merge.h"

namespace mlakit::support {

struct MergeSpec {
  int num_states = 2;
  std::vector<int64_t> row_shape = {16, 8};  // 1 to 3 row dimensions
  int64_t d = 128;
  int64_t row_pad = 0;  // o's row pitch = d + row_pad (elements)
  DType in_dtype = DType::kBF16;
  DType out_dtype = DType::kBF16;
  LseBase lse_base = LseBase::kNatural;
  LseBase out_lse_base = LseBase::kNatural;
  bool transposed_lse = false;
  double empty_fraction = 0.2;  // of (state, row) pairs, half -inf and half +inf
  int64_t o_offset = 0;         // elements the stacked o starts into its buffer (alignment tests)
  uint64_t seed = 1;
};

std::string describe(const MergeSpec& spec);

struct HostMergeCase {
  MergeSpec spec;
  int64_t rows = 0;
  std::vector<uint8_t> o;   // stacked states, in_dtype, o_offset + n * rows * pitch elements
  std::vector<float> lse;   // n * rows
  int64_t o_state_stride = 0, lse_state_stride = 0;  // elements between states

  explicit HostMergeCase(const MergeSpec& spec);
  // Views of state s over a buffer laid out like `o` / `lse` (host or device).
  TensorRef o_view(const void* base, int s) const;
  TensorRef lse_view(const void* base, int s) const;
  // A contiguous [rows..., d] out in out_dtype and a [rows...] float32 out_lse over `base`.
  TensorRef out_view(void* base, DType dtype) const;
  TensorRef out_lse_view(void* base) const;
  int64_t out_elements() const { return rows * spec.d; }
};

// Arguments over the given buffers: state views for o and lse (kept in `o_views` /
// `lse_views`, which the arguments point to), out and out_lse contiguous.
struct MergeCall {
  std::vector<TensorRef> o_views, lse_views;
  MergeStatesArgs args;
  MergeCall(const HostMergeCase& c, const void* o, const void* lse, void* out, void* out_lse);
  MergeCall(const MergeCall&) = delete;
  MergeCall& operator=(const MergeCall&) = delete;
};

}  // namespace mlakit::support
