// Token-sparse MLA decode over an FP8 cache (docs/contract.md), DeepSeek's sparse attention:
// each query row attends only to the cache tokens its indexer selected. Two cache layouts,
// told apart by the tensors' last dimensions:
//   DeepSeek V3.2: q d_qk 576, a 656-byte token (fp8_cache.h), out = the 512 NoPE values;
//   DeepSeek V4:   q d_qk 512, a 584-byte token (fp8_cache.h, V4 section), out = all 512 values.
// Optionally a second cache of the same layout (extra_kv_cache, its own page size) with its own
// indices: each row attends to the union of both token lists under one softmax.
//
// Per decoding step, like the dense decode: mla_sparse_decode_workspace_size once,
// mla_sparse_decode_plan once per step (the schedule depends on topk / topk_length only),
// mla_sparse_decode_fp8 per layer. GPU kernels: the Hopper one (sm90a: FP8 tokens gathered and
// dequantized into bf16 tiles for wgmma) on compute capability 9.0, the portable one (sm80+)
// elsewhere or when problem.kernel asks for it.
#pragma once

#include <optional>

#include "mlakit/mla_decode.h"
#include "mlakit/status.h"
#include "mlakit/tensor.h"

namespace mlakit {

// What the plan depends on. b, s_q or h_q of 0 is an empty problem: nothing is launched.
struct MlaSparseDecodeProblem {
  int64_t b = 0;
  int s_q = 1;
  int h_q = 0;
  int topk = 0;  // indices per query token, >= 1
  // Indices per query token into the second cache (extra_indices' last dimension), 0 without one.
  int extra_topk = 0;
  // Which kernel the plan is made for (kAuto: the Hopper kernel on compute capability 9.0,
  // the portable one elsewhere); the workspace size and the plan must be asked with the same.
  MlaKernel kernel = MlaKernel::kAuto;
};

struct MlaSparseDecodeArgs {
  TensorRef q;            // [b, s_q, h_q, d_qk]           bf16; d_qk 576 (V3.2) or 512 (V4)
  TensorRef kv_cache;     // V3.2: [num_blocks, page_size, 1, 656] FP8-with-scale bytes (uint8 / fp8_e4m3 / int8);
                          // V4:   [num_blocks, page_size, 1, 584] bytes, stride[1] == 584 (fp8_cache.h)
  TensorRef indices;      // [b, s_q, topk]                int32: slot = block * page_size + offset;
                          //   -1 and any slot outside [0, num_blocks * page_size) are skipped
  TensorRef topk_length;  // optional [b] int32: only the first topk_length[i] indices of sequence i count
  // Optional second cache, same layout as kv_cache (its own num_blocks and page_size), with its
  // indices [b, s_q, extra_topk] int32 (slots into extra_kv_cache) and optional
  // extra_topk_length [b] int32; given together (extra_topk_length only with them).
  TensorRef extra_kv_cache;
  TensorRef extra_indices;
  TensorRef extra_topk_length;
  TensorRef attn_sink;    // optional [h_q] float32: out *= 1 / (1 + exp(sink - lse)), lse unchanged
  TensorRef out;          // [b, s_q, h_q, 512]            bf16 (or float32 for the reference)
  TensorRef lse;          // [b, h_q, s_q]                 float32, natural log (both caches' keys)
  std::optional<float> softmax_scale = std::nullopt;  // unset: 1 / sqrt(d_qk); NaN / inf: InvalidArgument (as MlaDecodeArgs)
  bool causal = false;    // must be false (the indices already say what is visible)
};

Status mla_sparse_decode_workspace_size(const MlaSparseDecodeProblem& problem, std::size_t* bytes);

// topk_length: the same optional [b] int32 device tensor the decode will get (empty: every
// row has topk indices); likewise extra_topk_length for the second cache (problem.extra_topk > 0).
Status mla_sparse_decode_plan(const MlaSparseDecodeProblem& problem, const TensorRef& topk_length,
                              const TensorRef& extra_topk_length, void* workspace, std::size_t workspace_bytes,
                              cudaStream_t stream, MlaDecodePlan* plan);
// Without a second cache's lengths.
Status mla_sparse_decode_plan(const MlaSparseDecodeProblem& problem, const TensorRef& topk_length,
                              void* workspace, std::size_t workspace_bytes, cudaStream_t stream,
                              MlaDecodePlan* plan);

Status mla_sparse_decode_fp8(const MlaSparseDecodeArgs& args, const MlaDecodePlan& plan, cudaStream_t stream);

namespace reference {
// float64 attention over the dequantized cache(s) (docs/contract.md). Rows with no valid index:
// out 0, lse +inf. Duplicated indices count twice.
Status mla_sparse_decode_fp8(const MlaSparseDecodeArgs& args, int num_threads = 0);
}  // namespace reference

}  // namespace mlakit
