// Host-side sparse FP8 MLA decode problems for tests (and later the benchmark): a random
// bf16 cache quantized to the 656-byte format (and its dequantized bf16 twin), indices with
// valid slots, duplicates, -1, slots past the cache and other negatives; the first query
// token of sequence 0 has no valid index at all.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "mlakit/mla_sparse_decode.h"

namespace mlakit::support {

struct SparseCaseSpec {
  int64_t b = 1;
  int s_q = 1;
  int h_q = 16;
  int topk = 64;
  int64_t num_blocks = 4;
  int64_t page_size = 64;
  bool with_topk_length = false;
  bool with_sink = false;
  std::optional<float> softmax_scale = std::nullopt;  // unset: 1 / sqrt(576)
  uint64_t seed = 1;
};

struct HostSparseCase {
  SparseCaseSpec spec;
  std::vector<uint16_t> q;            // [b, s_q, h_q, 576]
  std::vector<uint8_t> cache;         // [num_blocks, page_size, 1, 656]
  std::vector<uint16_t> dequantized;  // [num_blocks, page_size, 1, 576]
  std::vector<int32_t> indices;       // [b, s_q, topk]
  std::vector<int32_t> topk_length;   // [b] when spec.with_topk_length
  std::vector<float> sink;            // [h_q] when spec.with_sink

  MlaSparseDecodeProblem problem() const;
  int64_t out_elems() const;
  int64_t lse_elems() const;
  // Arguments over the given buffers (host or device copies); topk_length / sink pointers
  // are used only when the spec asks for them.
  MlaSparseDecodeArgs args(void* q_ptr, void* cache_ptr, void* indices_ptr, void* topk_length_ptr, void* sink_ptr,
                           void* out_ptr, DType out_dtype, void* lse_ptr) const;
};

HostSparseCase make_sparse_case(const SparseCaseSpec& spec);

// Sets every byte of every cache token that no counted index lists to 0xFF (NaN as e4m3, as
// the float32 scales and as the bf16 RoPE values) and its dequantized twin to NaN, so that a
// kernel reading one shows NaN. Counted: valid slots among the first topk_length[i] (clamped
// to [0, topk]; all topk without topk_length) indices of each row. The reference reads only
// counted tokens, so its results do not change. Call after the last edit of c.indices or
// c.topk_length.
void poison_unlisted_tokens(HostSparseCase& c);

struct SparseReferenceResult {
  std::vector<float> out;  // unrounded
  std::vector<float> lse;
};
SparseReferenceResult run_sparse_reference(HostSparseCase& c);

}  // namespace mlakit::support
