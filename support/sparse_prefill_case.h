// Host-side sparse MLA prefill problems for tests and the benchmark: random bf16 q and kv at
// FlashMLA's scale (q ~ N(0, 1), kv ~ N(0, 1) / 10, clamped to [-1, 1]), indices mixing valid
// rows (uniform, or mostly near the end of kv) with -1, values >= s_kv, other negatives and
// duplicates, one token with no valid index, optional topk_length and attention sink.
//
// What a wrong read would show: kv holds NaN rows past s_kv (stored, outside the tensor) for
// invalid indices to hit; with `strided`, every view is padded: q and kv rows carry NaN past
// d_qk, the indices' padding holds valid rows (reading it changes the result), and the
// outputs' padding must keep the caller's poison.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "mlakit/mla_sparse_prefill.h"

namespace mlakit::support {

struct SparsePrefillSpec {
  int64_t s_q = 1;
  int64_t s_kv = 64;
  int h_q = 16;
  int d_qk = 576;
  int topk = 64;
  double invalid_fraction = 0.2;  // share of invalid entries in the other tokens' indices
  double duplicate_fraction = 0.05;
  int64_t window = 0;             // > 0: valid indices mostly (90%) in the last `window` rows
  int64_t empty_token = 0;        // this token's indices are all invalid (-1: none)
  bool strided = false;
  bool with_topk_length = false;  // values drawn from [0, topk + 3] (past topk: clamped)
  bool with_sink = false;
  LseBase lse_base = LseBase::kBase2;
  std::optional<float> sm_scale = std::nullopt;  // unset: 1 / sqrt(d_qk)
  uint64_t seed = 1;
};

// Indices [s_q, pitch] (pitch >= topk; the padding holds valid rows) following the spec's
// index fields; used alone by the benchmark.
std::vector<int32_t> make_prefill_indices(const SparsePrefillSpec& spec, int64_t pitch);

struct HostSparsePrefillCase {
  SparsePrefillSpec spec;
  // Stored layouts, in elements (the logical sizes unless spec.strided).
  int64_t q_head_pitch = 0, q_token_pitch = 0, kv_pitch = 0, kv_rows_stored = 0, indices_pitch = 0;
  int64_t out_head_pitch = 0, out_token_pitch = 0, stat_pitch = 0;
  std::vector<uint16_t> q;           // [s_q, q_token_pitch] bf16
  std::vector<uint16_t> kv;          // [kv_rows_stored, kv_pitch] bf16, NaN rows past s_kv
  std::vector<int32_t> indices;      // [s_q, indices_pitch]
  std::vector<int32_t> topk_length;  // [s_q] when spec.with_topk_length
  std::vector<float> sink;           // [h_q] when spec.with_sink

  int64_t out_stored() const { return spec.s_q * out_token_pitch; }  // elements of out's buffer
  int64_t stat_stored() const { return spec.s_q * stat_pitch; }     // of max_logits' and lse's
  // Offset of logical element (t, h, d) of out, (t, h) of the statistics, in their buffers.
  int64_t out_at(int64_t t, int h, int d) const { return t * out_token_pitch + h * out_head_pitch + d; }
  int64_t stat_at(int64_t t, int h) const { return t * stat_pitch + h; }
  // Arguments over the given buffers (host or device copies of this case's stored layouts);
  // the topk_length / sink pointers are used only when the spec asks for them.
  MlaSparsePrefillArgs args(void* q_ptr, void* kv_ptr, void* indices_ptr, void* topk_length_ptr, void* sink_ptr,
                            void* out_ptr, void* max_logits_ptr, void* lse_ptr) const;
};

HostSparsePrefillCase make_sparse_prefill_case(const SparsePrefillSpec& spec);

// Sets every stored column of every kv row in [0, s_kv) that no counted index lists to NaN,
// so that a kernel reading one shows NaN. Counted: indices in [0, s_kv) among the first
// topk_length[t] (clamped to [0, topk]; all topk without topk_length) of token t's row (the
// indices' padding is never counted). The reference reads only counted rows, so its results
// do not change. Call after the last edit of c.indices or c.topk_length.
void poison_unlisted_rows(HostSparsePrefillCase& c);

// The float64 reference, contiguous: out [s_q, h_q, 512] unrounded, max_logits and lse [s_q, h_q].
struct SparsePrefillReference {
  std::vector<float> out, max_logits, lse;
};
SparsePrefillReference run_sparse_prefill_reference(const HostSparsePrefillCase& c);

}  // namespace mlakit::support
