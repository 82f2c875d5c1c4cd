// Host-side construction of dense MLA decode problems for tests, the main job and the
// benchmark: random q and paged cache, shuffled block tables, NaN in every cache slot no
// sequence owns, garbage in block-table entries past a sequence's length.
//
// Values follow FlashMLA's tests, the scale the accuracy rule's absolute tolerance (docs/contract.md) is meant for:
// q ~ N(0, 1) and cache ~ N(0, 1) / 10, both clamped to [-1, 1]. (With cache values ~ N(0, 1)
// the bf16 rounding of P alone moves outputs of short sequences by ~1e-3.)
#pragma once

#include <cstdint>
#include <optional>
#include <limits>
#include <vector>

#include "mlakit/mla_decode.h"

namespace mlakit::support {

struct DecodeCaseSpec {
  std::vector<int32_t> seqlens;  // b = seqlens.size()
  int s_q = 1;
  int h_q = 128;
  int h_kv = 1;
  int page_size = 64;
  bool causal = false;
  DType dtype = DType::kBF16;
  std::optional<float> softmax_scale = std::nullopt;  // unset: 1 / sqrt(d_qk)
  int spare_blocks = 3;  // cache blocks owned by no sequence (NaN-filled)
  uint64_t seed = 1;
};

struct HostDecodeCase {
  DecodeCaseSpec spec;
  int64_t b = 0;
  int64_t num_blocks = 0;
  int64_t max_blocks_per_seq = 0;
  std::vector<uint16_t> q;            // [b, s_q, h_q, 576] 16-bit patterns
  std::vector<uint16_t> kv;           // [num_blocks, page_size, h_kv, 576]
  std::vector<int32_t> block_table;   // [b, max_blocks_per_seq]
  std::vector<int32_t> seqlens;       // [b]

  MlaDecodeProblem problem() const;
  int64_t out_elems() const;   // b * s_q * h_q * 512
  int64_t lse_elems() const;   // b * h_q * s_q
  // Arguments over the given buffers (host or device copies of this case's tensors).
  MlaDecodeArgs args(void* q_ptr, void* kv_ptr, void* table_ptr, void* seqlens_ptr,
                     void* out_ptr, void* lse_ptr) const;
};

HostDecodeCase make_decode_case(const DecodeCaseSpec& spec);

// Lengths: all equal to `mean` (fixed), or normal(mean, mean / 2) clamped to [min_len, ...].
std::vector<int32_t> fixed_lengths(int64_t b, int32_t len);
std::vector<int32_t> varlen_lengths(int64_t b, int32_t mean, int32_t min_len, uint64_t seed);

// Runs the CPU reference of `c` into fresh buffers; `out` unrounded (float32), as docs/contract.md
// compares against the float64 computation, not its bf16/fp16 rounding.
struct ReferenceResult {
  std::vector<float> out;
  std::vector<float> lse;
};
ReferenceResult run_reference(const HostDecodeCase& c, int num_threads = 0);

// FLOPs and bytes of the docs/benchmarking.md counting rules for a dense decode.
double decode_flops(const HostDecodeCase& c);
double decode_bytes(const HostDecodeCase& c);

}  // namespace mlakit::support
