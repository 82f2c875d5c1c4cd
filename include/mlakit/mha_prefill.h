// Dense multi-head attention forward over variable-length sequences: the prefill / training
// attention (docs/contract.md, MHA prefill; FlashAttention's varlen forward, FlashMLA's
// flash_attn_varlen_func). GQA by h_q / h_kv query heads per key/value head.
//
// Per sequence i: queries are rows [cu_seqlens_q[i], cu_seqlens_q[i + 1]) of q, keys and
// values rows [cu_seqlens_k[i], cu_seqlens_k[i + 1]) of k and v (lengths Lq, Lk, either may
// be 0). Query t (0 <= t < Lq) of head h sees keys j < Lk, and with `causal` only those with
// j <= t + Lk - Lq (bottom-right aligned). s = softmax_scale * dot(q_t, k_j) over the kv head
// h / (h_q / h_kv); out = softmax(s) V (float32 accumulation); lse = natural log of sum
// exp(s). A query that sees no key gets out 0 and lse +inf.
//
// Status: the float64 CPU reference (below). The GPU kernels are issue 26's next step; the
// argument rules here are theirs too.
#pragma once

#include <cstdint>
#include <optional>

#include "mlakit/status.h"
#include "mlakit/tensor.h"

namespace mlakit {

struct MhaPrefillArgs {
  TensorRef q;             // [total_q, h_q, d_qk]  bf16 | fp16
  TensorRef k;             // [total_k, h_kv, d_qk] q's dtype; h_q % h_kv == 0
  TensorRef v;             // [total_k, h_kv, d_v]  q's dtype
  TensorRef cu_seqlens_q;  // [b + 1] int32: 0 = cu[0] <= cu[1] <= ... <= cu[b] <= total_q
  TensorRef cu_seqlens_k;  // [b + 1] int32, the same over total_k
  int max_seqlen_q = 0;    // >= every query length (what the GPU scheduler is sized for)
  int max_seqlen_k = 0;    // >= every key length
  bool causal = false;
  // Unset: 1 / sqrt(d_qk). Any finite value is used as given; NaN or an infinity is an error.
  std::optional<float> softmax_scale = std::nullopt;
  TensorRef out;  // [total_q, h_q, d_v] q's dtype (the reference also takes float32); rows
                  // outside every sequence are left as they are
  TensorRef lse;  // optional [h_q, total_q] float32, natural log
};

// (d_qk, d_v) pairs: (64, 64), (128, 128), (192, 128), (256, 256).

namespace reference {
// float64 reference on host memory; also checks what only the data can say (the prefix sums
// ordered and within total_q / total_k, every length within max_seqlen_*).
Status mha_prefill(const MhaPrefillArgs& args, int num_threads = 0);
}  // namespace reference

}  // namespace mlakit
