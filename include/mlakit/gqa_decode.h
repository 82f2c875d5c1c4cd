// GQA / MHA decode over a paged, optionally quantized KV cache: the decoding attention of a
// serving engine for non-MLA models (docs/contract.md, GQA decode), with this step's new
// keys and values appended to the cache and rotary embedding applied in the same call.
//
// Usage per decoding step (the MLA decode's pattern, include/mlakit/mla_decode.h):
//   1. gqa_decode_workspace_size(problem, &bytes)  once, allocate `bytes` of device memory;
//   2. gqa_decode_plan(problem, cache_seqlens, ws, bytes, stream, &plan)  once per step: the
//      split-KV schedule is computed on the device from device-resident lengths;
//   3. gqa_decode(args, plan, stream)  for every layer of the step.
// Nothing allocates or synchronises the host; all three can be captured in a CUDA graph.
// reference::gqa_decode is the float64 CPU reference on host memory.
//
// Semantics, per batch entry i of length L = cache_seqlens[i] (after this step's append) and
// query token t (0 <= t < s_q) at position pos = L - s_q + t:
//   - k_new / v_new given: token t's new key and value are written at position pos (page
//     block_table[i][pos / page_size], row pos % page_size), k after the rotary embedding,
//     both quantized to the cache's format, before the attention reads the cache.
//   - Visible keys: [first, last] with last = causal ? pos : L - 1 and first = window > 0 ?
//     max(0, last - window + 1) : 0 (nothing visible when L - s_q + t < 0 under causal).
//   - Logit of key j: s = softmax_scale * dot(q_t, k_j) (q_t after the rotary embedding,
//     computed in float32 by the shared rotary code and rounded to q's dtype, the input of the
//     kernels' matrix units; k_j dequantized); softcap > 0: s = softcap * tanh(s / softcap); ALiBi: s += slope[h] *
//     (j - pos).
//   - out = softmax(s) V; lse = natural log of sum(exp(s)); a row with no visible key: out 0,
//     lse +inf.
//   - finished[i] nonzero: batch entry i is skipped: out, lse and the cache are left as they are.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

#include "mlakit/status.h"
#include "mlakit/stream.h"
#include "mlakit/tensor.h"

namespace mlakit {

// How rotary embedding pairs the first rotary_dim columns of a head: NeoX rotates (c, c +
// rotary_dim / 2), GPT-J (2c, 2c + 1), c < rotary_dim / 2, by the angle pos * theta^(-2c /
// rotary_dim).
enum class RopeStyle : int32_t {
  kNone = 0,
  kNeox = 1,
  kGptj = 2,
};

struct RotaryEmbedding {
  RopeStyle style = RopeStyle::kNone;
  double theta = 10000.0;  // > 0
  int rotary_dim = 0;      // 0: the head dim d; else even and <= d
};

// One of the two caches (keys or values).
//   values: [num_blocks, page_size, h_kv, d]: q's dtype, int8 or float8 e4m3.
//   scale:  float32 dequantization scales (dequantized = stored * scale), empty for q's dtype:
//           [num_blocks, page_size, h_kv] one per (token, kv head) (int8 and fp8), or [1] one
//           per tensor (fp8). Appended rows get their per-(token, head) scale computed: max|x| /
//           127 (int8, stored = x / scale rounded to nearest even) or max|x| / 448 (fp8,
//           stored = e4m3(x / scale), saturating); an all-zero row stores scale 0. With one
//           scale per tensor the given scale is used: stored = e4m3(x / scale) (a zero scale
//           stores zeros). Rules shared with the GPU append: src/common/gqa_cache_quant.h.
struct GqaPagedCache {
  TensorRef values;
  TensorRef scale;
};

struct GqaDecodeArgs {
  TensorRef q;                // [b, s_q, h_q, d]      bf16 | fp16; s_q 1..8, d 64 | 128 | 256
  GqaPagedCache k_cache;      // the keys (read; written where k_new is given)
  GqaPagedCache v_cache;      // the values: same shape, dtype and scale layout as k_cache
  TensorRef block_table;      // [b, max_blocks_per_seq] int32
  TensorRef cache_seqlens;    // [b] int32 >= 0, lengths after this step (>= s_q with k_new)
  TensorRef k_new;            // optional [b, s_q, h_kv, d] q's dtype, with v_new
  TensorRef v_new;            // optional [b, s_q, h_kv, d] q's dtype, with k_new
  RotaryEmbedding rope;       // applied to q and k_new (position = cache position)
  TensorRef alibi_slopes;     // optional [h_q] float32
  TensorRef finished;         // optional [b] uint8: nonzero = skip this batch entry
  TensorRef out;              // [b, s_q, h_q, d] q's dtype (written)
  TensorRef lse;              // optional [b, h_q, s_q] float32, natural log (written)
  // Unset: 1 / sqrt(d). Any finite value is used as given; NaN or an infinity is an error.
  std::optional<float> softmax_scale = std::nullopt;
  bool causal = false;        // token t sees positions <= L - s_q + t (ignored when s_q == 1)
  int window = 0;             // > 0: only the last `window` positions a token sees
  float softcap = 0.f;        // > 0: logit soft-capping; 0: none
};

// What the plan depends on; layers whose problems are equal share one plan. b or s_q of 0
// is an empty problem (nothing to append or compute; the plan and the decode launch
// nothing). causal / window must equal the arguments' (they bound the keys scheduled per
// sequence).
struct GqaDecodeProblem {
  int64_t b = 0;      // batch entries
  int s_q = 1;        // query tokens per entry, 0..8
  int h_q = 0;        // query heads
  int h_kv = 1;       // kv heads, h_q % h_kv == 0
  int d = 128;        // head dim: 64, 128 or 256
  bool causal = false;
  int window = 0;
};

// Result of gqa_decode_plan. Plain data: copy it freely, reuse it for every layer of a step.
struct GqaDecodePlan {
  GqaDecodeProblem problem;
  int device = -1;          // CUDA device ordinal the plan was made on
  int num_parts = 0;        // CTAs per (kv head, row tile) sharing the batch's KV work
  int block_n = 0;          // scheduling granularity, in keys
  int overhead_blocks = 0;  // scheduling cost of one sequence piece, in blocks
  int rows_per_tile = 0;    // query rows (token x head pairs) per CTA
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
  // Byte offsets of the workspace's regions (the MLA decode plan's layout, d_v = d).
  std::size_t part_ranges_offset = 0;
  std::size_t split_prefix_offset = 0;
  std::size_t partial_prefix_offset = 0;
  std::size_t cost_prefix_offset = 0;
  std::size_t partial_out_offset = 0;
  std::size_t partial_lse_offset = 0;
  int64_t partial_slots = 0;
};

// Bytes of device workspace gqa_decode_plan / gqa_decode need for `problem` on the current
// device. Independent of sequence lengths.
Status gqa_decode_workspace_size(const GqaDecodeProblem& problem, std::size_t* bytes);

// Computes the split-KV schedule for `cache_seqlens` ([b] int32 on the device, the lengths
// after this step's append) into `workspace` (256-byte aligned, >= the queried size) on
// `stream`, and fills `plan`.
Status gqa_decode_plan(const GqaDecodeProblem& problem, const TensorRef& cache_seqlens, void* workspace,
                       std::size_t workspace_bytes, cudaStream_t stream, GqaDecodePlan* plan);

// Appends k_new / v_new (if given) and runs the attention for one layer on the GPU.
// `args.cache_seqlens` must hold the lengths the plan was made from (not re-checked: that
// would need a host synchronisation). Data rules the host cannot check (docs/contract.md):
// a length above the table's capacity reads no page past it (those rows are NaN); a length
// below s_q with k_new appends only the tokens at positions >= 0.
Status gqa_decode(const GqaDecodeArgs& args, const GqaDecodePlan& plan, cudaStream_t stream);

namespace reference {

// The GQA decode on host memory (every tensor on the host), float64 throughout; out may be
// q's dtype or float32 (the unrounded result accuracy checks compare against). With k_new /
// v_new it writes them into the host caches first, as the GPU kernel does. num_threads 0 =
// hardware concurrency. Every argument is validated first (errors name it); nothing is
// written on an error. Data it reads on the host is checked too: a length outside [0, table
// width * page_size] (or below s_q with k_new) and two appended tokens on one cache slot are
// InvalidArgument; a block id outside [0, num_blocks) is never dereferenced (an append there
// is dropped, a row that would read it is NaN, as the MLA reference does).
Status gqa_decode(const GqaDecodeArgs& args, int num_threads = 0);

}  // namespace reference

}  // namespace mlakit
