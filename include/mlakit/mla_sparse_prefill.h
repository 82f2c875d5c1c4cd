// Token-sparse MLA prefill (docs/contract.md): every query token attends to its own `topk`
// selected rows of a bf16 KV tensor. No batch dimension: callers pack sequences along s_q /
// s_kv. Statistics are base 2 by default (FlashMLA's convention); `lse_base` makes the choice
// explicit.
//
// mla_sparse_prefill runs on any GPU of compute capability 8.0 or newer (the portable kernel;
// the Hopper kernel follows, issue 5). It takes no workspace and no plan: one CTA per (query
// token, 32 heads) covers all of the token's topk keys. Asynchronous on `stream`, allocates
// nothing, graph-capturable. Layout needs beyond docs/contract.md: q and kv rows 16-byte aligned (row
// strides multiples of 8 elements), out rows 4-byte aligned (even strides).
#pragma once

#include <cstdint>
#include <optional>

#include "mlakit/lse_base.h"
#include "mlakit/mla_decode.h"
#include "mlakit/status.h"
#include "mlakit/stream.h"
#include "mlakit/tensor.h"

namespace mlakit {

// lse_base below: kBase2 gives lse = log2(sum 2^P) and max_logits = max P with
// P = q.k * sm_scale * log2(e); kNatural the same quantities multiplied by ln(2).

struct MlaSparsePrefillArgs {
  TensorRef q;            // [s_q, h_q, d_qk]   bf16, d_qk 576 or 512
  TensorRef kv;           // [s_kv, 1, d_qk]    bf16; V = the first d_v columns
  TensorRef indices;      // [s_q, 1, topk]     int32; < 0 or >= s_kv: skipped
  TensorRef topk_length;  // optional [s_q] int32: only the first topk_length[i] indices count
  TensorRef attn_sink;    // optional [h_q] float32 (natural-log units): out *= 1 / (1 + exp(sink - lse_e))
  TensorRef out;          // [s_q, h_q, d_v]    bf16 (or float32 for the reference)
  TensorRef max_logits;   // [s_q, h_q]         float32 (-inf for a row with no valid index)
  TensorRef lse;          // [s_q, h_q]         float32 (+inf for a row with no valid index)
  // Logit scale before the log2(e) factor; unset: 1 / sqrt(d_qk); NaN / inf: InvalidArgument.
  std::optional<float> sm_scale = std::nullopt;
  int d_v = 512;
  LseBase lse_base = LseBase::kBase2;
  // kAuto: the Hopper kernel on compute capability 9.0, the portable one elsewhere; kSm90 on
  // another GPU is an UnsupportedArchitecture error.
  MlaKernel kernel = MlaKernel::kAuto;
};

// Validates every argument (InvalidArgument / Unsupported naming it), then launches on
// `stream`. Indices < 0 or >= s_kv (and those past topk_length[i]) are never dereferenced; a
// row with none valid gets out 0, max_logits -inf, lse +inf. UnsupportedArchitecture below
// sm80, NoDevice without a GPU.
Status mla_sparse_prefill(const MlaSparsePrefillArgs& args, cudaStream_t stream);

namespace reference {
// float64 reference on host memory.
Status mla_sparse_prefill(const MlaSparsePrefillArgs& args, int num_threads = 0);
}  // namespace reference

}  // namespace mlakit
