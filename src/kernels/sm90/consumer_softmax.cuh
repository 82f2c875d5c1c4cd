// The online softmax of one Hopper consumer's rows: S tile -> P = 2^(S - m) in place, with the
// running reference max m, row sums l and (for max_logits) the true max logit of each of the
// thread's two rows (r0, r0 + 8).
//
// S is a wgmma accumulator (64 x 64 f32, device/sm90/wgmma_fragment.cuh): register i of a
// thread is in row r0 + 8 h, h = (i >> 1) & 1 (acc_row_half(i), spelled out here: through the
// helper ptxas scheduled the prefill differently), and column acc_col(lane, i); the four lanes
// of a quad hold one row.
#pragma once

#include <cmath>
#include <cstdint>

#include "device/numeric.cuh"
#include "device/sm90/sync.cuh"
#include "kernels/sm90/timeline.cuh"

namespace mlakit::detail::sm90 {

template <bool kMaxLogits>
struct OnlineSoftmax {
  // m: the reference max of the exponents (lags the row's max by up to kRescaleSlack; LSE =
  // m + log2(l) holds for any reference); max_logit: the max of this consumer's logits.
  float m[2], l[2], max_logit[2];

  // The reference moves only when a row's max passes it by more than this: P then stays <=
  // 2^kRescaleSlack, and O is rarely rescaled.
  static constexpr float kRescaleSlack = 8.f;

  __device__ void reset() {
    m[0] = m[1] = -INFINITY;
    max_logit[0] = max_logit[1] = -INFINITY;
    l[0] = l[1] = 0.f;
  }

  // S -> scaled logits in place (-inf where visible(i) is false for score register i), with
  // the rows' max (over the quad: every lane of a row gets it).
  template <typename Visible>
  __device__ void scaled_logits(float (&s)[32], float scale_log2, Visible visible, float (&mx)[2]) {
    mx[0] = mx[1] = -INFINITY;
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      const int h = (i >> 1) & 1;
      s[i] = visible(i) ? s[i] * scale_log2 : -INFINITY;
      mx[h] = fmaxf(mx[h], s[i]);
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
      if constexpr (kMaxLogits) max_logit[h] = fmaxf(max_logit[h], mx[h]);
    }
#ifdef MLAKIT_SM90_TIMELINE
    device::sm90::fence_registers(mx);
#endif
    MLAKIT_SM90_STAMP(kConsumerRowMax);
  }

  // The reference max after a tile with row max mx, from the reference ref before it.
  __device__ static void reference_max(const float (&mx)[2], const float (&ref)[2], float (&m_new)[2]) {
#pragma unroll
    for (int h = 0; h < 2; ++h) m_new[h] = mx[h] > ref[h] + kRescaleSlack ? mx[h] : ref[h];
  }

  // Scaled logits -> P = 2^(S - m_new) in place, with this thread's row sums of P.
  __device__ static void exponentiate(float (&s)[32], const float (&m_new)[2], float (&sum)[2]) {
    sum[0] = sum[1] = 0.f;
    // A row with no visible key so far keeps max -inf and every logit -inf: P = 2^-inf = 0.
    const float base[2] = {m_new[0] == -INFINITY ? 0.f : m_new[0], m_new[1] == -INFINITY ? 0.f : m_new[1]};
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      const int h = (i >> 1) & 1;
      s[i] = device::fast_exp2(s[i] - base[h]);
      sum[h] += s[i];
    }
#ifdef MLAKIT_SM90_TIMELINE
    device::sm90::fence_registers(s);  // the stamp after the exponentials, not among them
#endif
    MLAKIT_SM90_STAMP(kConsumerExpDone);
  }

  // Moves the output accumulator o (64 x 256 f32, register j in row r0 + 8 ((j >> 1) & 1)) and
  // l from the reference m to m_new (>= m). o must have no wgmma in flight.
  template <int kRegs>
  __device__ void rescale(float (&o)[kRegs], const float (&m_new)[2]) {
    float f[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      f[h] = m_new[h] == -INFINITY ? 1.f : device::fast_exp2(m[h] - m_new[h]);
      l[h] *= f[h];
      m[h] = m_new[h];
    }
    if (__any_sync(0xffffffffu, f[0] != 1.f || f[1] != 1.f)) {
#pragma unroll
      for (int j = 0; j < kRegs; ++j) o[j] *= ((j >> 1) & 1) ? f[1] : f[0];
    }
  }

  // Adds a tile's row sums, relative to the current reference.
  __device__ void add_sums(const float (&sum)[2]) {
    l[0] += sum[0];
    l[1] += sum[1];
  }
};

}  // namespace mlakit::detail::sm90
