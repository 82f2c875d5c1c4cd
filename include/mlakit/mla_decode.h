// Dense MLA decode over a paged KV cache (docs/contract.md, Dense decode).
//
// Usage per decoding step (see README):
//   1. mla_decode_workspace_size(problem, &bytes)  once, allocate `bytes` of device memory;
//   2. mla_decode_plan(problem, cache_seqlens, ws, bytes, stream, &plan)  once per step: the
//      split-KV schedule is computed on the device from device-resident lengths;
//   3. mla_decode(args, plan, stream)  for every layer of the step.
// Nothing here allocates or synchronises the host; all three steps can be captured in a
// CUDA graph (the plan only records offsets into the caller's workspace).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

#include "mlakit/mla_kernel.h"
#include "mlakit/status.h"
#include "mlakit/stream.h"
#include "mlakit/tensor.h"

namespace mlakit {

// What the plan depends on. Layers whose problems are equal share one plan. b, s_q or h_q
// of 0 is an empty problem: its plan and decode launch nothing.
struct MlaDecodeProblem {
  int64_t b = 0;   // sequences in the batch
  int s_q = 1;     // query tokens per sequence, <= 1024 (> 1: speculative / MTP decoding)
  int h_q = 0;     // query heads
  int h_kv = 1;    // latent KV heads; h_q % h_kv == 0
  int d_qk = 576;  // query/key head dim (512 NoPE + 64 RoPE)
  int d_v = 512;   // value head dim: the first d_v columns of each cache row
};


// Optional choices of mla_decode_workspace_size / mla_decode_plan.
struct MlaDecodeOptions {
  // kAuto: kSm90 on compute capability 9.0, kPortable elsewhere. kSm90 on another GPU is an
  // UnsupportedArchitecture error. A kSm90 plan runs the portable kernel for page sizes the
  // Hopper kernel does not tile (neither a multiple of 64 nor 16 or 32).
  MlaKernel kernel = MlaKernel::kAuto;
};

// Result of mla_decode_plan. Plain data: copy it freely, reuse it for every layer of a step.
struct MlaDecodePlan {
  MlaDecodeProblem problem;
  MlaKernel kernel = MlaKernel::kPortable;
  int device = -1;          // CUDA device ordinal the plan was made on
  int num_parts = 0;        // CTAs per (kv head, row tile) sharing the batch's KV work
  int block_n = 0;          // scheduling granularity, in keys
  int overhead_blocks = 0;  // scheduling cost of one sequence piece, in blocks
  int rows_per_tile = 0;    // query rows (token x head pairs) per CTA
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
  // Byte offsets of the regions of the workspace (see docs/design.md, "Workspace").
  std::size_t part_ranges_offset = 0;    // int32 [num_parts, 8]: per-CTA work ranges
  std::size_t split_prefix_offset = 0;   // int32 [b + 1]: prefix sums of per-sequence splits
  std::size_t partial_prefix_offset = 0; // int32 [b + 1]: prefix sums of partial-result slots
  std::size_t cost_prefix_offset = 0;    // int64 [b + 1]: planner scratch
  std::size_t partial_out_offset = 0;    // float [partial_slots, h_kv, rows, d_v]
  std::size_t partial_lse_offset = 0;    // float [partial_slots, h_kv, rows] (log2 domain)
  int64_t partial_slots = 0;             // capacity of the partial regions, in splits
  int64_t sparse_topk = 0;               // sparse decode plans: the topk they were made for; 0: dense
  // Sparse decode plans: made with a topk_length tensor. The decode must get one exactly when
  // its plan did (a plan of uniform lengths may hold whole sequences per part, below).
  bool sparse_topk_length = false;
  // Sparse decode plans with a second cache: its topk (0: none) and whether extra_topk_length was given.
  int64_t sparse_extra_topk = 0;
  bool sparse_extra_topk_length = false;
  // Every scheduled sequence lies whole in one part (one split each, none empty): the
  // attention kernel writes every output directly and the combine kernel is not launched.
  // Set by sparse decode plans made without topk_length whose parts hold whole sequences
  // (docs/design.md, "Sparse decode on the same machinery"); false otherwise.
  bool no_splits = false;
};

struct MlaDecodeArgs {
  TensorRef q;              // [b, s_q, h_q, d_qk]             bf16 | fp16
  TensorRef kv_cache;       // [num_blocks, page_size, h_kv, d_qk]  same dtype as q
  TensorRef block_table;    // [b, max_blocks_per_seq]          int32
  TensorRef cache_seqlens;  // [b]                              int32, >= 0
  TensorRef out;            // [b, s_q, h_q, d_v]               q's dtype (written)
  TensorRef lse;            // [b, h_q, s_q]                    float32, natural log (written)
  // Logit scale. Unset (std::nullopt, the default): 1 / sqrt(d_qk). Any finite value is used
  // as given (zero and negative ones too, as in FlashMLA); NaN or an infinity is an
  // InvalidArgument error naming softmax_scale.
  std::optional<float> softmax_scale = std::nullopt;
  bool causal = false;      // ignored when s_q == 1
};

// Bytes of device workspace mla_decode_plan / mla_decode need for `problem` on the current
// device. Independent of sequence lengths.
Status mla_decode_workspace_size(const MlaDecodeProblem& problem, std::size_t* bytes,
                                 const MlaDecodeOptions& options = {});

// Computes the split-KV schedule for `cache_seqlens` ([b] int32 on the device) into
// `workspace` (256-byte aligned, >= the queried size) on `stream`, and fills `plan`.
Status mla_decode_plan(const MlaDecodeProblem& problem, const TensorRef& cache_seqlens,
                       void* workspace, std::size_t workspace_bytes, cudaStream_t stream,
                       MlaDecodePlan* plan, const MlaDecodeOptions& options = {});

// Runs the attention for one layer. `args.cache_seqlens` must hold the lengths the plan was
// made from (not re-checked: that would need a host synchronisation).
Status mla_decode(const MlaDecodeArgs& args, const MlaDecodePlan& plan, cudaStream_t stream);

}  // namespace mlakit
