// Host-side dense MHA prefill backward problems (include/mlakit/mha_prefill.h,
// MhaPrefillBackwardArgs) for the tests: the forward's problem of support/mha_prefill_case.h
// (q, k, v with NaN in every row of no sequence, in padding and in guard rows past the tensors),
// plus what the backward reads beside it, stored so that a wrong read or write shows:
//   - dout [total_q, h_q, d_v] ~ N(0, dout_std^2) inside sequences, NaN in every other stored
//     element; v scaled by v_scale (a power of two);
//   - out, the float64 reference forward's out rounded to the dtype, and lse [h_q, total_q] (the
//     reference's, float32), in the forward case's out / lse layouts: NaN outside the rows of a
//     sequence (and +inf lse where a query sees no key, which the backward must not read);
//   - dq, dk, dv views of larger buffers (guard rows past the tensors, optional padding): every
//     element outside the rows that must be written keeps the caller's poison.
// The float64 reference backward (run once per case) gives dq, dk, dv in float32, and
// check_mha_backward_outputs judges one GPU call's downloaded buffers against it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mlakit/mha_prefill.h"
#include "support/mha_prefill_case.h"

namespace mlakit::support {

struct MhaBackwardSpec {
  // The problem: sequences, heads, head dims, dtype, causal, scale, key ramp, seed, and the
  // layouts of q, k, v (packed or padded) and of the forward's out (`out_pad`) and lse
  // (`lse_pad`). `with_lse` is ignored: the backward always reads the forward's lse.
  MhaPrefillSpec problem;
  MhaViewPad dout_pad, dq_pad, dk_pad, dv_pad;
  // dout ~ N(0, dout_std^2), and v (make_mha_prefill_case's, ~ N(0, 0.01)) times v_scale, a
  // power of two (exact in bf16 and fp16). The accuracy rule's abs 1e-3 is absolute, so these
  // scales decide what it tests. Tensor-core kernels round P and dS to 16 bits for their
  // products (FlashAttention-2's backward, this library's portable one); that moves a
  // cancelling sum such as dv_j = sum_t P_tj dout_t by ~2^-9 * dout_std * sqrt(sum_t P_tj^2),
  // which reaches 1e-3 when many (query, head) rows put their weight on few keys. A float32
  // emulation of such a kernel (P and dS rounded) fails the rule with dout_std 0.1 (FlashMLA's
  // test's choice, whose q and k are 10x smaller, so its softmax is flat) on most of the GPU
  // sweep's cases; with these defaults its worst error is 0.65 of the bound over 500 stress
  // cases (dv of 2 keys seen by 776 rows) and 0.4 over the sweep. dq and dk grow with
  // dout_std * v_scale, and their rounding error (dS) too, most on peaked rows (key ramps,
  // large scales: those cases take v_scale 4); v_scale 8 keeps their RMS near 1.5e-3 and 3e-3,
  // where the elementwise rule still means something.
  float dout_std = 0.01f;
  float v_scale = 8.f;
};

// v_scale of the cases with peaked softmax rows (key ramps, large explicit scales): see above.
inline constexpr float kPeakedRowsVScale = 4.f;

// A spec of the batch `lengths` with these heads, head dims, mask and seed (mha_prefill_spec);
// every other field keeps its default.
MhaBackwardSpec mha_backward_spec(const MhaSequenceLengths& lengths, int h_q, int h_kv, int d_qk, int d_v, bool causal,
                                  uint64_t seed = 1);

// The backward's two modes (MhaPrefillBackwardArgs::deterministic) as the tests name them:
// "deterministic" or "default".
const char* backward_mode_name(bool deterministic);

// Padding of every view (q, k, v, out, lse, dout, dq, dk, dv) that keeps 16-byte aligned rows.
void pad_all_views(MhaBackwardSpec* spec);

// Offsets and paddings of every view that leave rows aligned to 4 bytes but not to 16 (which
// the device entry takes).
void align4_all_views(MhaBackwardSpec* spec);

// Whether the views the Hopper backward copies by TMA (q, k, v, dout) have 16-byte rows (whole
// 8-element offsets and strides); it refuses the others, naming the tensor.
bool tma_copied_rows_aligned(const MhaBackwardSpec& spec);

// One line naming the spec's fields (for failure messages).
std::string describe(const MhaBackwardSpec& spec);

// Float64 multiply-adds of the forward and the backward references together:
// h_q * (5 d_qk + 4 d_v) * visible (query, key) pairs (the forward's d_qk + d_v, the
// backward's dq pass 2 d_qk + d_v and its dk / dv pass 2 d_qk + 2 d_v).
double backward_reference_macs(const MhaBackwardSpec& spec);

struct HostMhaBackwardCase {
  MhaBackwardSpec spec;
  // q, k, v, the prefix sums, total_q / total_k, max_seqlen_*, the out and lse layouts.
  HostMhaPrefillCase fwd;
  HostMhaPrefillCase::View dout_view, dq_view, dk_view, dv_view;
  // Stored buffers: dout and out (bf16 / fp16 bits), lse (float32 bits).
  std::vector<uint16_t> dout, out;
  std::vector<uint32_t> lse;
  int64_t dq_stored = 0, dk_stored = 0, dv_stored = 0;  // elements of the gradient buffers to allocate

  int64_t b() const { return fwd.b(); }
  // Buffers holding this case's stored layouts (host or device copies); with packed_qkv q holds
  // q, k and v and `k`, `v` are not used.
  struct Buffers {
    void* q = nullptr;
    void* k = nullptr;
    void* v = nullptr;
    void* cu_q = nullptr;
    void* cu_k = nullptr;
    void* dout = nullptr;
    void* out = nullptr;
    void* lse = nullptr;
    void* dq = nullptr;
    void* dk = nullptr;
    void* dv = nullptr;
  };
  // This case's own host buffers of the inputs (dq, dk, dv null), for the reference or for
  // arguments over host memory.
  Buffers host_inputs() const;
  // Arguments over `buffers` (deterministic false, kernel kAuto: the caller sets them).
  MhaPrefillBackwardArgs args(const Buffers& buffers) const;
};

// Builds the case and runs the float64 reference forward for its out and lse. Throws
// std::invalid_argument on a spec make_mha_prefill_case refuses, std::runtime_error if the
// reference fails.
HostMhaBackwardCase make_mha_backward_case(const MhaBackwardSpec& spec, int num_threads = 0);

// The same stored q, k, v and dout cut into other sequences: the same b, total_q, total_k and
// max_seqlen_* (what a captured graph keeps), every new sequence inside the rows the old ones
// covered (whose data is finite). The reference forward runs again for out and lse. Throws
// std::invalid_argument when the lengths do not fit.
HostMhaBackwardCase recut_mha_backward_case(const HostMhaBackwardCase& c, const std::vector<int32_t>& lq,
                                            const std::vector<int32_t>& lk, int num_threads = 0);

// The float64 reference backward, contiguous and float32: dq [total_q, h_q, d_qk], dk
// [total_k, h_kv, d_qk], dv [total_k, h_kv, d_v]; rows in no sequence NaN. Throws
// std::runtime_error if the reference fails.
struct MhaBackwardReference {
  std::vector<float> dq, dk, dv;
};
MhaBackwardReference run_mha_backward_reference(const HostMhaBackwardCase& c, int num_threads = 0);

// The downloaded dq, dk and dv buffers of one call (c.dq_stored, c.dk_stored, c.dv_stored
// elements) against the reference: "" when they pass, else the first thing that failed.
// Every element outside the rows that must be written (dq: rows [0, cu_seqlens_q[b]); dk, dv:
// rows [0, cu_seqlens_k[b])) - rows of no sequence, padding, guard rows - must still hold
// `poison`; rows that must be exactly 0 (dq of a query that sees no key, dk and dv of a key no
// query sees: a sequence without queries, or h_q = 0) must be +-0; the rest within the
// backward's accuracy rule (check_half_gradients).
std::string check_mha_backward_outputs(const HostMhaBackwardCase& c, const MhaBackwardReference& ref,
                                       const std::vector<uint16_t>& dq_stored, const std::vector<uint16_t>& dk_stored,
                                       const std::vector<uint16_t>& dv_stored, uint16_t poison);

}  // namespace mlakit::support
