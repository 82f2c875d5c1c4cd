// Merging partial attention states (docs/contract.md, Merging states): the step that combines
// attention computed over disjoint parts of one key set, e.g. the shards of a sequence's KV
// cache held by several GPUs (context parallelism), a shared prefix and a per-request suffix
// (cascade attention), or the splits of a split-KV kernel.
//
// N states of the same rows: state i is (o_i [rows..., d], lse_i [rows...]). Per row, with the
// LSEs in one base (natural or base 2, stated by the caller):
//   lse = log(sum_i exp(lse_i)),   o = sum_i o_i * exp(lse_i - lse)
// computed stably (the largest LSE subtracted first), accumulated in float32 on the GPU and in
// float64 in the reference. An LSE of -inf or +inf marks an empty state: it contributes
// nothing and its o is never read, so it may hold anything (NaN too). A row whose states are
// all empty gets o = 0 and lse = +inf. A NaN LSE is not a state: the row's o and lse are NaN
// (an error upstream shows instead of being merged away).
//
// The result is order-independent up to float rounding, and merging in groups gives the same
// result as merging at once (also up to rounding), so states can be merged as they arrive.
#pragma once

#include <cstdint>

#include "mlakit/lse_base.h"
#include "mlakit/status.h"
#include "mlakit/stream.h"
#include "mlakit/tensor.h"

namespace mlakit {

// States one call merges: a list of more states can be merged in groups (see above).
inline constexpr int kMaxMergeStates = 128;

struct MergeStatesArgs {
  // num_states tensors [rows..., d]: 1 to 3 row dimensions (e.g. [tokens, heads, d] or
  // [b, s_q, h_q, d]), bf16 | fp16 | fp32, every state the same dtype, shape and strides
  // (views of one stacked tensor, or equally allocated outputs); the last dimension
  // contiguous, other strides free.
  const TensorRef* o = nullptr;
  // num_states tensors [rows...] float32, each the same shape as its o without the d, every
  // state the same strides (any: a [heads, tokens] LSE is passed as its transposed view).
  const TensorRef* lse = nullptr;
  int num_states = 0;  // 1 .. kMaxMergeStates
  LseBase lse_base = LseBase::kNatural;

  // [rows..., d] bf16 | fp16 | fp32 (any of them, whatever o's dtype). Either disjoint from
  // every input, or exactly one of the o tensors (same pointer, dtype and strides: in place).
  TensorRef out;
  // Optional [rows...] float32, in out_lse_base. Disjoint from every input and from out, or
  // exactly one of the lse tensors (in place).
  TensorRef out_lse;
  LseBase out_lse_base = LseBase::kNatural;
};

// Validates every argument (errors name it: "merge_states: o[2].shape[1]: expected 16, got
// 8"), then merges on `stream`: asynchronous, allocates nothing, graph-capturable; the device
// pointers on the current device, each aligned to its element size. No rows, or d = 0 without
// out_lse: nothing to write, Ok (d = 0 with out_lse: the merged LSEs alone).
Status merge_states(const MergeStatesArgs& args, cudaStream_t stream);

namespace reference {
// The same on host memory, in float64 (out rounded to its dtype once).
Status merge_states(const MergeStatesArgs& args);
}  // namespace reference

}  // namespace mlakit
