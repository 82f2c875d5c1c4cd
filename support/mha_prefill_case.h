// Host-side dense MHA prefill problems (include/mlakit/mha_prefill.h) for tests and the
// benchmark: a varlen batch of (Lq, Lk) sequences, random q, k ~ N(0, 1) and v ~ N(0, 1) / 10
// (clamped), bf16 or fp16, any GQA ratio and head-dim pair, over stored buffers that make a
// wrong read or write visible:
//   - every q / k / v row in no sequence (rows past cu_seqlens_*[b], the "tails") is NaN, and
//     so are the stored rows past the tensors (kGuardRows of them) and the padding of padded
//     views: a kernel that lets one of them into a result shows NaN;
//   - out and lse are views of larger buffers (guard rows past total_q, optional head / token /
//     lse padding): everything outside the rows of a sequence must keep the caller's poison.
// Layouts: contiguous, padded (16-byte rows kept), q / k / v as slices of one packed
// [total, h_q + 2 h_kv, d] qkv buffer, and per-tensor offsets / paddings for alignment tests.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "mlakit/mha_prefill.h"

namespace mlakit::support {

// Stored layout of one [total, heads, d] view inside its buffer, in elements.
struct MhaViewPad {
  int64_t offset = 0;     // the view starts this many elements into its buffer
  int64_t head_pad = 0;   // head stride = d + head_pad
  int64_t token_pad = 0;  // token stride = heads * head stride + token_pad
};

struct MhaPrefillSpec {
  std::vector<int32_t> lq, lk;     // per-sequence query / key lengths (b = lq.size() = lk.size())
  int64_t tail_q = 0, tail_k = 0;  // rows of q / out and of k / v past cu_seqlens_*[b] (in no sequence)
  int h_q = 8, h_kv = 8;
  int d_qk = 128, d_v = 128;
  DType dtype = DType::kBF16;
  bool causal = false;
  std::optional<float> softmax_scale = std::nullopt;  // unset: 1 / sqrt(d_qk)
  bool with_lse = true;
  // q, k and v as slices of one [total, h_q + 2 h_kv, d] buffer (heads q | k | v): needs
  // d_qk == d_v, lq == lk and tail_q == tail_k; the pads below are then not used for q, k, v.
  bool packed_qkv = false;
  MhaViewPad q_pad, k_pad, v_pad, out_pad;
  int64_t lse_pad = 0;       // lse row stride = total_q + lse_pad
  int max_seqlen_slack = 0;  // max_seqlen_q / _k = the longest length + this
  // > 0: key j of a sequence of length Lk is scaled by 1 + key_ramp * j / (Lk - 1), so that the
  // largest logits move across key tiles (the online softmax must rescale).
  double key_ramp = 0;
  uint64_t seed = 1;
};

// Per-sequence query and key lengths of a varlen batch (b = lq.size() = lk.size()).
struct MhaSequenceLengths {
  std::vector<int32_t> lq, lk;
};

// A spec of the batch `lengths` with these heads, head dims, mask and seed (1 is the spec's
// default); every other field keeps its default.
MhaPrefillSpec mha_prefill_spec(const MhaSequenceLengths& lengths, int h_q, int h_kv, int d_qk, int d_v, bool causal,
                                uint64_t seed = 1);

// `b` short sequences drawn from `seed`: query lengths 0 to 90, each key length the query's
// -10 to +40 (at least 0).
MhaSequenceLengths random_short_sequences(int b, uint32_t seed);

// Padding of every view (inputs, out, lse) that keeps 16-byte aligned rows.
void pad_all_views(MhaPrefillSpec* spec);

// One line naming the spec's fields (for failure messages).
std::string describe(const MhaPrefillSpec& spec);

// " <name>_pad=(offset,head_pad,token_pad)", or "" for a view without padding (describe's
// words for one view).
std::string describe_pad(const char* name, const MhaViewPad& pad);

// (query, key) pairs of the batch where the query sees the key (bottom-right causal alignment).
double visible_pairs(const MhaPrefillSpec& spec);

// Float64 multiply-adds of the reference: h_q * (d_qk + d_v) * visible (query, key) pairs.
double reference_macs(const MhaPrefillSpec& spec);

inline constexpr int64_t kMhaGuardRows = 64;  // stored NaN / poison rows past each tensor

// The NaN the cases store where no data is (bf16 0x7fc0, fp16 0x7e00), and 16-bit values of
// the dtype as bits and back (rounded to nearest even).
uint16_t half_nan_bits(DType dtype);
uint16_t to_half_bits(float x, DType dtype);
float from_half_bits(uint16_t bits, DType dtype);

struct HostMhaPrefillCase {
  MhaPrefillSpec spec;
  std::vector<int32_t> cu_q, cu_k;  // [b + 1]
  int64_t total_q = 0, total_k = 0;
  int max_seqlen_q = 0, max_seqlen_k = 0;
  // View layouts in their buffers (packed_qkv: q, k and v all index `q`'s buffer).
  struct View {
    int64_t offset = 0, token_stride = 0, head_stride = 0;
    // Where element (token t, head h, column d) is stored.
    int64_t at(int64_t t, int h, int d) const { return offset + t * token_stride + h * head_stride + d; }
    // Elements of a buffer holding `total` tokens and the kMhaGuardRows guard rows past them.
    int64_t stored_elements(int64_t total) const { return offset + (total + kMhaGuardRows) * token_stride; }
  } q_view, k_view, v_view, out_view;
  int64_t lse_stride = 0;  // lse [h_q, total_q]: element (h, t) at h * lse_stride + t
  // Stored buffers (bf16 / fp16 bits); packed_qkv: q holds q, k and v, and k, v are empty.
  std::vector<uint16_t> q, k, v;
  int64_t out_stored = 0, lse_stored = 0;  // elements of the out / lse buffers to allocate

  int64_t b() const { return static_cast<int64_t>(spec.lq.size()); }
  int64_t out_at(int64_t t, int h, int d) const { return out_view.at(t, h, d); }
  int64_t lse_at(int h, int64_t t) const { return h * lse_stride + t; }
  // Rows of out / lse that belong to a sequence: [0, cu_q[b]).
  int64_t rows_in_sequences() const { return cu_q.back(); }
  // Arguments over buffers holding this case's stored layouts (host or device copies). With
  // packed_qkv k_buf and v_buf are not used. lse_buf null or !spec.with_lse: no lse.
  MhaPrefillArgs args(void* q_buf, void* k_buf, void* v_buf, void* cu_q_buf, void* cu_k_buf, void* out_buf,
                      void* lse_buf) const;
};

// The layout of a [total, heads, d] view padded by `pad`.
HostMhaPrefillCase::View padded_view(const MhaViewPad& pad, int heads, int d);

HostMhaPrefillCase make_mha_prefill_case(const MhaPrefillSpec& spec);

// The float64 reference, contiguous: out [total_q, h_q, d_v] float32 (unrounded) and lse
// [h_q, total_q]; rows in no sequence NaN. Throws std::runtime_error if the reference fails.
struct MhaPrefillReference {
  std::vector<float> out, lse;
};
MhaPrefillReference run_mha_prefill_reference(const HostMhaPrefillCase& c, int num_threads = 0);

// One call's downloaded buffers against the reference (docs/contract.md, Accuracy): "" when they
// pass, else the first thing that failed. out_stored: the whole out buffer (c.out_stored
// elements); lse_stored: the whole lse buffer, or null when the call had none. Every element
// outside the rows of a sequence (tails, guard rows, padding) must still hold the poison bits;
// rows that see no key must be exactly +-0 with lse +inf; the rest within the accuracy rule.
std::string check_mha_prefill_outputs(const HostMhaPrefillCase& c, const MhaPrefillReference& ref,
                                      const std::vector<uint16_t>& out_stored,
                                      const std::vector<uint32_t>* lse_stored, uint16_t out_poison,
                                      uint32_t lse_poison);

}  // namespace mlakit::support
