// The end of a Hopper consumer's segment: both consumers' row sums combined through shared
// memory, the output normalised and written (final rows in q's dtype with the LSE and
// max_logits, or float partials with a log2 LSE for the combine), NaN for a segment that met a
// bad block.
#pragma once

#include <cmath>
#include <cstdint>

#include "device/numeric.cuh"
#include "device/sm90/sync.cuh"
#include "device/sm90/wgmma_fragment.cuh"
#include "kernels/attention_rows.cuh"
#include "kernels/sm90/consumer_softmax.cuh"
#include "kernels/sm90/consumer_thread.cuh"
#include "kernels/sm90/mla_config.cuh"

namespace mlakit::detail::sm90 {

// 4 x 4 transpose of 32-bit values across the 4 lanes of a quad: lane q's u[i] becomes lane
// i's former u[q] (two exchange rounds, at distance 2 then 1).
__device__ __forceinline__ void quad_transpose(uint32_t (&u)[4]) {
  const int q = threadIdx.x % 4;
#pragma unroll
  for (int d = 2; d >= 1; d /= 2) {
    const bool upper = (q & d) != 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if (i & d) continue;
      const uint32_t sent = upper ? u[i] : u[i + d];
      const uint32_t got = __shfl_xor_sync(0xffffffffu, sent, d);
      if (upper) {
        u[i] = got;
      } else {
        u[i + d] = got;
      }
    }
  }
}

// Writes consumer me.w's 256 output columns of row tile `tile` of kv head hk for scheduled
// sequence seq (split `split` of it), from its accumulator o and softmax state. on_q_free() is
// called once both consumers' multiplies are done (the Q tile is dead), so the next segment's
// Q copy overlaps the stores. Options: the kernel's consumer options (consumer_options.cuh).
template <class Options, typename OnQFree>
__device__ void store_segment(const typename Options::Params& params, Sm90MlaSmem& sm, ConsumerThread me, int tile,
                              int hk, const float (&o)[Sm90MlaConfig::kOutRegs],
                              const OnlineSoftmax<Options::kMaxLogits>& softmax, bool bad, int seq, int split,
                              OnQFree on_q_free) {
  using C = Sm90MlaConfig;
  using Elem = typename Options::Elem;
  using Params = typename Options::Params;
  constexpr bool kMaxLogits = Options::kMaxLogits;
  using Ops = device::ElemOps<Elem>;
  const AttentionCore& p = params.core;
  float l0 = softmax.l[0], l1 = softmax.l[1];
#pragma unroll
  for (int x = 1; x < 4; x *= 2) {
    l0 += __shfl_xor_sync(0xffffffffu, l0, x);
    l1 += __shfl_xor_sync(0xffffffffu, l1, x);
  }
  if (me.lane % 4 == 0) {
    sm.row_sum[me.w][me.r0] = l0;
    sm.row_sum[me.w][me.r0 + 8] = l1;
    if constexpr (kMaxLogits) {
      sm.max_logit[me.w][me.r0] = softmax.max_logit[0];
      sm.max_logit[me.w][me.r0 + 8] = softmax.max_logit[1];
    }
  }
  // Past this barrier both consumers' multiplies are done (each pair ends with a wait), so
  // the Q tile is dead: the next segment's Q is copied while the outputs go out.
  device::sm90::named_barrier_sync(C::kBarConsumers, C::kConsumerThreads);
  const float sum[2] = {sm.row_sum[0][me.r0] + sm.row_sum[1][me.r0],
                        sm.row_sum[0][me.r0 + 8] + sm.row_sum[1][me.r0 + 8]};
  on_q_free();
  // No plan (sparse prefill) or a plan without splits: every segment is a whole sequence,
  // written directly (and no load waited for).
  bool direct = true;
  int64_t slot_row0 = 0;
  float* partial_out = nullptr;
  float* partial_lse = nullptr;
  if constexpr (Params::kPlanned) {
    const SplitSchedule& plan = params.schedule;
    direct = plan.no_splits || plan.split_prefix[seq + 1] - plan.split_prefix[seq] == 1;
    slot_row0 = (static_cast<int64_t>(direct ? 0 : plan.partial_prefix[seq] + split) * p.h_kv + hk) * p.rows;
    partial_out = plan.partial_out;
    partial_lse = plan.partial_lse;
  }
  // Final rows in q's dtype go out as 16-byte stores when every row starts 16-byte aligned:
  // a quad transpose gives each lane 8 consecutive columns (64 4-byte stores per thread left
  // the store at the end of a segment ~9000 cycles long).
  const bool wide_stores =
      direct && ((reinterpret_cast<uintptr_t>(p.out) |
                  static_cast<uintptr_t>((p.out_stride_b | p.out_stride_s | p.out_stride_h) * sizeof(Elem))) &
                 15) == 0;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = me.r0 + 8 * half;
    const int row_in_range = tile * C::kRows + r;
    const bool row_ok = row_in_range < p.rows;
    const int row = row_ok ? row_in_range : 0;  // padding rows compute on row 0, store nothing
    const bool empty = sum[half] == 0.f;
    const float inv = bad ? NAN : (empty ? 0.f : 1.f / sum[half]);
    const float lse2 = bad ? NAN : (empty ? -INFINITY : softmax.m[half] + log2f(sum[half]));
    const RowCoord rc = row_coord(p, hk, row);
    Elem* out = static_cast<Elem*>(p.out) + seq_offset(p, seq, p.out_stride_b, p.out_stride_s) +
                rc.t * p.out_stride_s + rc.head * p.out_stride_h;
    float* partial = direct ? nullptr : partial_out + (slot_row0 + row) * C::kDv;
    const float scale = inv * (direct ? sink_factor(p, rc.head, lse2 * device::kLn2) : 1.f);
    if (wide_stores) {
      // Column group g (8 columns: 256 w + 8 g + 2 (lane % 4) + {0, 1} in this lane) holds
      // o[4 g + 2 half], o[4 g + 2 half + 1].
#pragma unroll
      for (int m = 0; m < 8; ++m) {
        uint32_t u[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int j = 4 * (4 * m + i) + 2 * half;
          u[i] = Ops::pack(o[j] * scale, o[j + 1] * scale);
        }
        quad_transpose(u);  // lane q: the 8 columns of group 4 m + q
        if (row_ok) {
          const int col = C::kVColsPerConsumer * me.w + 8 * (4 * m + me.lane % 4);
          *reinterpret_cast<uint4*>(out + col) = make_uint4(u[0], u[1], u[2], u[3]);
        }
      }
    } else if (row_ok) {
#pragma unroll
      for (int j = 2 * half; j < C::kOutRegs; j += 4) {
        const int col = C::kVColsPerConsumer * me.w + device::sm90::acc_col(me.lane, j);
        const float v0 = o[j] * scale, v1 = o[j + 1] * scale;
        if (direct) {
          *reinterpret_cast<uint32_t*>(out + col) = Ops::pack(v0, v1);
        } else {
          *reinterpret_cast<float2*>(partial + col) = make_float2(v0, v1);
        }
      }
    }
    if (!row_ok) continue;
    if (me.w == 0 && me.lane % 4 == 0) {
      if (direct) {
        const float to_base = p.lse_base2 ? 1.f : device::kLn2;
        p.lse[seq_offset(p, seq, p.lse_stride_b, p.lse_stride_s) + rc.head * p.lse_stride_h + rc.t * p.lse_stride_s] =
            lse2 == -INFINITY ? INFINITY : lse2 * to_base;
        if (kMaxLogits && p.max_logits != nullptr) {
          p.max_logits[seq_offset(p, seq, p.max_logits_stride_b, p.max_logits_stride_s) +
                       rc.head * p.max_logits_stride_h + rc.t * p.max_logits_stride_s] =
              bad ? NAN : (empty ? -INFINITY : fmaxf(sm.max_logit[0][r], sm.max_logit[1][r]) * to_base);
        }
      } else {
        partial_lse[slot_row0 + row] = lse2;
      }
    }
  }
  // row_sum is rewritten by the next segment.
  device::sm90::named_barrier_sync(C::kBarConsumers, C::kConsumerThreads);
}

}  // namespace mlakit::detail::sm90
