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
// On the GPU (compute capability 8.0 or newer): mha_prefill_workspace_size once, allocate that
// many bytes of device memory, then mha_prefill per call. Asynchronous on `stream`, allocates
// nothing, synchronises nothing on the host, graph-capturable; the sequence lengths are read
// on the device only. Every tensor's rows must be 4-byte aligned (data pointer and token / head
// strides even, in elements). Kernels: the Hopper kernel (TMA, wgmma, warp-specialised; needs
// q, k and v rows 16-byte aligned: pointers 16-byte aligned, strides multiples of 8) on
// compute capability 9.0, the portable kernel elsewhere and for any layout the Hopper kernel
// cannot take.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

#include "mlakit/mla_kernel.h"
#include "mlakit/status.h"
#include "mlakit/stream.h"
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
  // kAuto: the Hopper kernel where it applies (see above), else the portable one; kSm90 where
  // it does not apply is an error naming the reason; kPortable forces the portable kernel.
  MlaKernel kernel = MlaKernel::kAuto;
};

// (d_qk, d_v) pairs: (64, 64), (128, 128), (192, 128), (256, 256).

// Bytes of device workspace mha_prefill needs for these arguments (shapes and options only, not
// the lengths). Today's kernels need none (0): the size is queried so that callers are ready
// for a scheduler that keeps state there.
Status mha_prefill_workspace_size(const MhaPrefillArgs& args, std::size_t* bytes);

// Validates every argument (errors name it), then runs on `stream`. Data the host cannot see
// (the prefix sums' values) must follow the rules above: cu_seqlens ordered, starting at 0,
// within total_q / total_k, every length within max_seqlen_*; a length above max_seqlen_q
// leaves the rows past it unwritten. b = 0, total_q = 0 or h_q = 0 is the empty problem.
Status mha_prefill(const MhaPrefillArgs& args, void* workspace, std::size_t workspace_bytes, cudaStream_t stream);

namespace reference {
// float64 reference on host memory; also checks what only the data can say (the prefix sums
// ordered and within total_q / total_k, every length within max_seqlen_*).
Status mha_prefill(const MhaPrefillArgs& args, int num_threads = 0);
}  // namespace reference

}  // namespace mlakit
