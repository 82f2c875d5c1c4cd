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
// the lengths, no device query): without causal, room for the Hopper kernel to split the
// query tiles of its last wave over their keys (up to 132 pieces of 128 rows, 192 at d_qk
// 64, of d_v float32 values and an LSE: 8.3 MiB at d_v 128); 0 with causal, few keys or
// kernel = kPortable. Which tiles split depends on the GPU's SM count: a fixed call repeats its
// bits on one GPU, another GPU model may differ in the last bits.
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

// Backward of the forward above (FlashAttention's varlen backward): the gradients dq, dk, dv of
// a loss L given dout = dL/dout, from the forward's inputs and its saved out and lse (used as
// given, not recomputed). Same sequences, visibility (causal bottom-right), GQA mapping and
// softmax_scale as the forward. Per sequence, query head h, query t, visible key j (kv head
// hk = h / (h_q / h_kv)):
//   s_tj  = scale * dot(q_t, k_j)        P_tj = exp(s_tj - lse_t)   (lse of the given tensor)
//   D_t   = rowsum(dout_t * out_t)       (from the given out, as FlashAttention precomputes it)
//   dP_tj = dot(dout_t, v_j)             dS_tj = P_tj * (dP_tj - D_t)
//   dq_t  = scale * sum_j dS_tj k_j      dk_j = scale * sum_t dS_tj q_t      dv_j = sum_t P_tj dout_t
// dk and dv of a kv head are summed over the h_q / h_kv query heads that share it. A query
// that sees no key gets dq 0 (its lse, +inf from the forward, is not read); a key row of a
// sequence that no query sees (a sequence without queries) gets dk = dv = 0; rows of dq, dk,
// dv outside every sequence are left as they are. Every row inside a sequence is written, so
// total_q = 0 or h_q = 0 (the forward's empty problem: no query) still zeroes the dk / dv rows
// inside sequences; b = 0 writes nothing.
struct MhaPrefillBackwardArgs {
  TensorRef dout;          // [total_q, h_q, d_v]  q's dtype: dL/dout
  TensorRef q;             // [total_q, h_q, d_qk] bf16 | fp16 (as the forward)
  TensorRef k;             // [total_k, h_kv, d_qk] q's dtype; h_q % h_kv == 0
  TensorRef v;             // [total_k, h_kv, d_v]  q's dtype
  TensorRef out;           // [total_q, h_q, d_v]  the forward's out, q's dtype (the reference
                           // also takes float32: the reference forward's unrounded out)
  TensorRef lse;           // [h_q, total_q] float32, natural log: the forward's lse (required)
  TensorRef cu_seqlens_q;  // [b + 1] int32, as the forward
  TensorRef cu_seqlens_k;  // [b + 1] int32, as the forward
  int max_seqlen_q = 0;    // >= every query length
  int max_seqlen_k = 0;    // >= every key length
  bool causal = false;
  // Unset: 1 / sqrt(d_qk). Any finite value is used as given; NaN or an infinity is an error.
  std::optional<float> softmax_scale = std::nullopt;
  // The GPU kernels' mode whose dq, dk and dv are bitwise identical from run to run (without
  // it the order of their float32 accumulation may vary between runs). The reference is always
  // deterministic (its results do not depend on num_threads either) and ignores the flag.
  bool deterministic = false;
  TensorRef dq;  // [total_q, h_q, d_qk] q's dtype (the reference also takes float32)
  TensorRef dk;  // [total_k, h_kv, d_qk] q's dtype (the reference also takes float32)
  TensorRef dv;  // [total_k, h_kv, d_v]  q's dtype (the reference also takes float32)
  // kSm90: the Hopper main kernel ((d_qk, d_v) = (64, 64), (128, 128) and (192, 128) on compute
  // capability 9.x, both modes; kUnsupported naming `kernel` for other head dims,
  // kInvalidArgument naming the tensor when q, k, v or dout rows are not 16-byte aligned);
  // kPortable: the portable kernels (every GPU of compute capability 8.0 or newer); kAuto: the
  // Hopper kernel where kSm90 would run, the portable ones otherwise. The reference ignores it.
  MlaKernel kernel = MlaKernel::kAuto;
};

// On the GPU: mha_prefill_backward_workspace_size, allocate that many bytes of device memory
// (it holds dq's float32 accumulator: [total_q, h_q, d_qk], at d (64, 64), (128, 128) and (192, 128)
// as many 64-row query tiles as total_q / 64 + b for the Hopper kernel; D = rowsum(dout *
// out) [h_q, total_q]; and in the deterministic mode one ordering counter per (sequence,
// query head, query tile); without causal, where the Hopper kernel may run, room for it to run
// its last wave's key tiles in pieces: 132 slots of 128 keys x (d_qk + d_v) floats, 16.5 MiB
// at d 128), then mha_prefill_backward per call. The size depends on the shapes and the
// options only (total_q, h_q, h_kv, d_qk, d_v, b, max_seqlen_q, causal, deterministic,
// kernel), not on the lengths or the device. dk and dv repeat their bits on one GPU; the split
// depends on the SM count, so another GPU model may differ in their last bits.
// Asynchronous on `stream`, allocates nothing, synchronises nothing on the host,
// graph-capturable; the prefix sums are read on the device only. Rows of every tensor 4-byte
// aligned as the forward's. Data rules as the forward's: a length above max_seqlen_q /
// max_seqlen_k leaves the gradients of the rows past it unspecified (never a write outside
// the tensors).
Status mha_prefill_backward_workspace_size(const MhaPrefillBackwardArgs& args, std::size_t* bytes);
Status mha_prefill_backward(const MhaPrefillBackwardArgs& args, void* workspace, std::size_t workspace_bytes,
                            cudaStream_t stream);

namespace reference {
// float64 reference of the backward on host memory; checks the prefix sums and lengths like
// reference::mha_prefill. Outputs must not overlap each other or any input.
Status mha_prefill_backward(const MhaPrefillBackwardArgs& args, int num_threads = 0);
}  // namespace reference

}  // namespace mlakit
