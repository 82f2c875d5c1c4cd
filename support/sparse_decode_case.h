// Host-side sparse FP8 MLA decode problems for tests (and later the benchmark): a random bf16
// cache quantized to the V3.2 (656-byte) or V4 (584-byte, blocks padded to a multiple of 576
// bytes as FlashMLA pads them) format, with its dequantized bf16 twin, and indices with valid
// slots, duplicates, -1, slots past the cache and other negatives; the first query token of
// sequence 0 has no valid index in the first cache. Optionally a second cache of the same
// layout, its own page size, indices and lengths.
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
  std::optional<float> softmax_scale = std::nullopt;  // unset: 1 / sqrt(d_qk)
  uint64_t seed = 1;
  bool v4 = false;  // DeepSeek V4: d_qk 512 over the 584-byte cache
  // The second cache (extra_topk 0: none).
  int extra_topk = 0;
  int64_t extra_num_blocks = 4;
  int64_t extra_page_size = 64;
  bool with_extra_topk_length = false;
};

// One cache with its index list.
struct HostSparseCache {
  int64_t num_blocks = 0;
  int64_t page_size = 0;
  int64_t block_bytes = 0;            // the block stride
  std::vector<uint8_t> bytes;         // [num_blocks, block_bytes]
  std::vector<uint16_t> dequantized;  // [num_blocks * page_size, d_qk]
  std::vector<int32_t> indices;       // [b, s_q, topk]
  std::vector<int32_t> lengths;       // [b] when the spec asks for them
  int topk = 0;
  int64_t tokens() const { return num_blocks * page_size; }
  // The cache as the decode takes it: [num_blocks, page_size, 1, token bytes] over `data`.
  TensorRef tensor(void* data, bool v4) const;
};

struct HostSparseCase {
  SparseCaseSpec spec;
  std::vector<uint16_t> q;  // [b, s_q, h_q, d_qk]
  HostSparseCache main;
  HostSparseCache extra;    // extra.topk 0: none
  std::vector<float> sink;  // [h_q] when spec.with_sink

  int d_qk() const { return spec.v4 ? 512 : 576; }
  bool has_extra() const { return spec.extra_topk > 0; }
  MlaSparseDecodeProblem problem() const;
  int64_t out_elems() const;
  int64_t lse_elems() const;
  // Arguments over the given buffers (host or device copies) of the first cache; topk_length /
  // sink pointers are used only when the spec asks for them. with_extra adds the second cache's.
  MlaSparseDecodeArgs args(void* q_ptr, void* cache_ptr, void* indices_ptr, void* topk_length_ptr, void* sink_ptr,
                           void* out_ptr, DType out_dtype, void* lse_ptr) const;
  void with_extra(MlaSparseDecodeArgs* a, void* cache_ptr, void* indices_ptr, void* lengths_ptr) const;
};

HostSparseCase make_sparse_case(const SparseCaseSpec& spec);

// Sets every byte of every cache token that no counted index lists, and every padding byte, to
// 0xFF (NaN as e4m3, as float32 and UE8M0 scales and as the bf16 RoPE values) and its
// dequantized twin to NaN, so that a kernel reading one shows NaN. Counted: valid slots among
// the first lengths[i] (clamped to [0, topk]; all topk without lengths) indices of each row, of
// each cache. The reference reads only counted tokens, so its results do not change. Call after
// the last edit of the indices or lengths.
void poison_unlisted_tokens(HostSparseCase& c);

struct SparseReferenceResult {
  std::vector<float> out;  // unrounded
  std::vector<float> lse;
};
SparseReferenceResult run_sparse_reference(HostSparseCase& c);

}  // namespace mlakit::support
