// A consumer warpgroup of the Hopper MHA prefill: 64 query rows of the CTA's tile against
// every key tile the producer streams, online softmax in base 2; the output staged as whole
// rows in the warpgroup's own Q rows of shared memory (free once its last S is done) and
// stored 16 bytes at a time, the LSE directly.
//
// Per key tile i (run last tile first) the warpgroup issues S_i = Q K_i^T (SS wgmma, N =
// kBlockN) and, behind it, O += P_{i-1} V_{i-1} (RS wgmma: P from registers, V N-major), then
// waits for S_i only: the softmax of tile i runs while the tensor cores still work on
// P_{i-1} V_{i-1}. The rescaling of O by the moved row max (the correction) waits for that
// product and is folded into the same pass that hands P_i to the next product.
//
// Fragments (device/sm90/wgmma_fragment.cuh): score register j of a thread is in row
// r0 + 8 ((j >> 1) & 1) (r0 = 16 warp + lane / 4) and column 8 (j >> 2) + 2 (lane % 4) +
// (j & 1); the four lanes of a quad share a row. The RS A-fragment of key block kb (keys
// 16 kb .. 16 kb + 15) is pack(P[8 kb + 2 r], P[8 kb + 2 r + 1]), r < 4.
#pragma once

#include <cmath>
#include <cstdint>

#include "device/numeric.cuh"
#include "device/sm90/swizzle.cuh"
#include "device/sm90/sync.cuh"
#include "device/sm90/wgmma.cuh"
#include "device/sm90/wgmma_fragment.cuh"
#include "kernels/sm90/mha_prefill/config.cuh"
#include "kernels/sm90/mha_prefill/work_tile.cuh"

namespace mlakit::detail::mha_sm90 {

template <class C, typename Elem>
class Consumer {
 public:
  static constexpr int kSRegs = C::kBlockN / 2;
  static constexpr int kORegs = C::kDv / 2;
  static constexpr int kKeySteps = C::kBlockN / 16;  // k16 steps of P V
  static constexpr int kQkSteps = C::kDqk / 16;      // k16 steps of Q K^T
  static constexpr int kStepsPerSlab = C::kSlabCols / 16;

  // g: consumer index (0, 1); t: thread within the warpgroup.
  __device__ Consumer(const MhaPrefillParams& p, Smem<C>& sm, const WorkTile& w, int g, int t)
      : p_(p), sm_(sm), w_(w), g_(g), t_(t), lane_(t % dev::kWarpSize) {
    row0_ = w.m_block * C::kBlockM + g * C::kRowsPerConsumer + dev::acc_row(t, 0);  // the upper row
    first_row_ = w.m_block * C::kBlockM + g * C::kRowsPerConsumer;
    q_desc_base_ = dev::smem_u32(&sm.q[0][0]) + g * C::kConsumerQOffset;
  }

  __device__ void run() {
    if (w_.n_blocks == 0) {  // no key visible to any row: out 0, lse +inf
      store_empty();
      return;
    }
    if (g_ == C::kConsumers - 1) pass_turn();  // consumer 0 issues first
    dev::mbarrier_wait(&sm_.q_full, 0);
    float s[kSRegs];
    uint32_t pfrag[kKeySteps][4];
    float o[kORegs];
    m_[0] = m_[1] = -INFINITY;
    l_[0] = l_[1] = 0.f;

    // The first tile: S alone, then its softmax (nothing to rescale yet).
    wait_k(0);
    wait_turn();
    scores(s, 0);
    pass_turn();
    dev::wgmma_wait<0>();
    dev::fence_registers(s);
    release(&sm_.k_empty[0]);
    float unused[2];
    softmax(s, w_.n_last, unused);
    to_fragments(s, pfrag);

#pragma unroll 1
    for (int it = 1; it < w_.n_blocks; ++it) {
      const int stage = it % C::kStages, prev = (it - 1) % C::kStages;
      wait_k(it);
      dev::mbarrier_wait(&sm_.v_full[prev], ((it - 1) / C::kStages) & 1);
      wait_turn();
      scores(s, it);
      product(o, pfrag, prev, /*accumulate=*/it > 1);
      pass_turn();
      dev::wgmma_wait<1>();  // S_it done; P_{it-1} V_{it-1} may still run
      dev::fence_registers(s);
      release(&sm_.k_empty[stage]);
      float correction[2];
      softmax(s, w_.n_last - it, correction);
      dev::wgmma_wait<0>();
      dev::fence_registers(o);
      dev::fence_registers(pfrag);
      release(&sm_.v_empty[prev]);
      rescale(o, correction);
      to_fragments(s, pfrag);
    }
    const int last = (w_.n_blocks - 1) % C::kStages;
    dev::mbarrier_wait(&sm_.v_full[last], ((w_.n_blocks - 1) / C::kStages) & 1);
    wait_turn();
    product(o, pfrag, last, /*accumulate=*/w_.n_blocks > 1);
    if (g_ != C::kConsumers - 1) pass_turn();  // the last consumer's last turn passes to nobody: balanced
    dev::wgmma_wait<0>();
    dev::fence_registers(o);
    release(&sm_.v_empty[last]);
    store(o);
  }

 private:
  using MmaS = dev::Wgmma<C::kBlockN, Elem>;
  using MmaO = dev::Wgmma<C::kDv, Elem>;

  // Lane 0 of each warp frees a stage once the warp's wgmma reads of it are complete.
  __device__ void release(uint64_t* bar) const {
    if (lane_ == 0) dev::mbarrier_arrive(bar);
  }

  // Turns: the consumers take turns in a ring (0, 1, [2,] 0, ...) to issue their wgmmas, so
  // that one's softmax runs while the tensor cores work on the others' products (ping-pong
  // with two). Named barrier kTurnBarrier + g completes when consumer g waits (bar.sync) and
  // the consumer before it in the ring has passed the turn (bar.arrive): each consumer waits
  // once per turn and passes once after it, but for the last consumer's last turn; the last
  // consumer's arrival at the start gives consumer 0 the first turn. A consumer cannot pass
  // twice before the next one has waited: its next turn comes only after the whole ring's.
  // Barrier 0 is __syncthreads'.
  static constexpr uint32_t kTurnBarrier = 1;
  static constexpr uint32_t kTurnThreads = 2 * dev::kWarpgroupThreads;
  // Consumer g's own barrier (its 128 threads): the output staged before it is stored.
  static constexpr uint32_t kStagingBarrier = kTurnBarrier + C::kConsumers;
  __device__ void wait_turn() const { dev::named_barrier_sync(kTurnBarrier + g_, kTurnThreads); }
  __device__ void pass_turn() const {
    dev::named_barrier_arrive(kTurnBarrier + (g_ + 1 == C::kConsumers ? 0 : g_ + 1), kTurnThreads);
  }

  __device__ void wait_k(int it) const {
    dev::mbarrier_wait(&sm_.k_full[it % C::kStages], (it / C::kStages) & 1);
  }

  // Issues S = Q K^T for run index `it` (its K tile landed: wait_k) and commits it.
  __device__ void scores(float (&s)[kSRegs], int it) {
    const int stage = it % C::kStages;
    const uint64_t q_desc = dev::opaque_desc(dev::make_sw128_desc(q_desc_base_, 16, 1024));
    const uint64_t k_desc = dev::opaque_desc(dev::make_sw128_desc(dev::smem_u32(&sm_.k[stage][0][0]), 16, 1024));
    dev::wgmma_fence();
#pragma unroll
    for (int k = 0; k < kQkSteps; ++k) {
      const uint32_t in_slab = (k % kStepsPerSlab) * 32;
      const int slab = k / kStepsPerSlab;
      MmaS::template ss<0>(s, dev::advance_desc(q_desc, slab * C::kQSlabBytes + in_slab),
                           dev::advance_desc(k_desc, slab * C::kKvSlabBytes + in_slab), k > 0);
    }
    dev::wgmma_commit();
  }

  // Issues O (+)= P V over the V tile of `stage` and commits it.
  __device__ void product(float (&o)[kORegs], const uint32_t (&pfrag)[kKeySteps][4], int stage, bool accumulate) {
    // V [keys][d] is N-major for this product: 8-key groups 1024 bytes apart, 64-column slabs
    // a slab apart (PTX ISA 9.7.15.5.1.2.1; docs/hopper.md).
    const uint64_t v_desc =
        dev::opaque_desc(dev::make_sw128_desc(dev::smem_u32(&sm_.v[stage][0][0]), C::kKvSlabBytes, 1024));
    dev::wgmma_fence();
#pragma unroll
    for (int kb = 0; kb < kKeySteps; ++kb) {
      MmaO::template rs<1>(o, pfrag[kb], dev::advance_desc(v_desc, kb * 16 * dev::kSwizzleRowBytes),
                           accumulate || kb > 0);
    }
    dev::wgmma_commit();
  }

  // The reference max of a row moves only when the row's max passes it by more than this: P
  // then stays <= 2^kRescaleSlack and O is rescaled rarely (LSE = m + log2 l holds for any
  // reference).
  static constexpr float kRescaleSlack = 8.f;

  // Scores of key tile n -> P = 2^(scale_log2 * s - m) in place; m_, l_ updated;
  // `correction` gets the factor 2^(m_old - m_new) by which O must be scaled (per row half).
  // The mask and the scale are uniform branches outside the per-element loops.
  __device__ void softmax(float (&s)[kSRegs], int n, float (&correction)[2]) {
    const int key0 = n * C::kBlockN;
    // Tiles with no key past the sequence and none past the causal diagonal for any of this
    // warpgroup's rows need no mask (all but the first one or two run).
    const bool masked = key0 + C::kBlockN > w_.k_len ||
                        (p_.causal && key0 + C::kBlockN - 1 > first_row_ + w_.k_len - w_.q_len);
    const float scale = p_.scale_log2;
    float exp_scale = scale;
    float mx[2];
    if (scale > 0.f) {  // logits in the scores' order: the max of the raw scores, one FFMA each
      if (masked) mask(s, key0);
      row_max(s, mx);
      mx[0] *= scale;
      mx[1] *= scale;
    } else {  // a zero or negative scale: scale first (-inf must stay -inf), then mask
#pragma unroll
      for (int j = 0; j < kSRegs; ++j) s[j] *= scale;
      if (masked) mask(s, key0);
      row_max(s, mx);
      exp_scale = 1.f;
    }
    float base[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float m_new = mx[h] > m_[h] + kRescaleSlack ? mx[h] : m_[h];
      // A row that has seen no key keeps m = -inf: its P are 2^-inf = 0 and O stays 0.
      correction[h] = m_new == m_[h] ? 1.f : device::fast_exp2(m_[h] - m_new);
      base[h] = m_new == -INFINITY ? 0.f : m_new;
      m_[h] = m_new;
      l_[h] *= correction[h];
    }
#pragma unroll
    for (int j = 0; j < kSRegs; ++j) {
      const int h = dev::acc_row_half(j);
      s[j] = device::fast_exp2(fmaf(s[j], exp_scale, -base[h]));
      l_[h] += s[j];
    }
  }

  // Keys past the sequence and, with causal, past each row's diagonal -> -inf.
  __device__ void mask(float (&s)[kSRegs], int key0) const {
    int last[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      last[h] = w_.k_len - 1;
      if (p_.causal) last[h] = min(last[h], row0_ + 8 * h + w_.k_len - w_.q_len);
      last[h] -= key0;
    }
#pragma unroll
    for (int j = 0; j < kSRegs; ++j) {
      s[j] = dev::acc_col(lane_, j) <= last[dev::acc_row_half(j)] ? s[j] : -INFINITY;
    }
  }

  // Each row half's max over the quad (every lane of a row gets it).
  __device__ static void row_max(const float (&s)[kSRegs], float (&mx)[2]) {
    mx[0] = mx[1] = -INFINITY;
#pragma unroll
    for (int j = 0; j < kSRegs; ++j) mx[dev::acc_row_half(j)] = fmaxf(mx[dev::acc_row_half(j)], s[j]);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
    }
  }

  // O *= correction per row, skipped by a warp none of whose rows' reference moved (most
  // tiles after the first few).
  __device__ static void rescale(float (&o)[kORegs], const float (&correction)[2]) {
    if (!__any_sync(0xffffffffu, correction[0] != 1.f || correction[1] != 1.f)) return;
#pragma unroll
    for (int j = 0; j < kORegs; ++j) o[j] *= correction[dev::acc_row_half(j)];
  }

  __device__ static void to_fragments(const float (&s)[kSRegs], uint32_t (&pfrag)[kKeySteps][4]) {
#pragma unroll
    for (int kb = 0; kb < kKeySteps; ++kb) {
#pragma unroll
      for (int r = 0; r < 4; ++r) pfrag[kb][r] = device::ElemOps<Elem>::pack(s[8 * kb + 2 * r], s[8 * kb + 2 * r + 1]);
    }
  }

  // Global offsets of this thread's row half h (the sequence's rows only).
  __device__ bool row_valid(int h) const { return row0_ + 8 * h < w_.q_rows; }
  __device__ int64_t token(int h) const { return static_cast<int64_t>(w_.q_begin) + row0_ + 8 * h; }

  __device__ void store_lse(int h, float value) const {
    if (p_.lse != nullptr && lane_ % 4 == 0 && row_valid(h)) {
      p_.lse[w_.head * p_.lse_stride_h + token(h) * p_.lse_stride_t] = value;
    }
  }

  // out = O / l per row (0 for a row without a visible key), lse = ln(2) (m + log2 l); a
  // piece of a tail tile writes its partial rows instead.
  __device__ void store(float (&o)[kORegs]) {
    float inv[2], lse2[2];  // lse2: base 2, -inf for a row without a visible key
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float l = l_[h];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      inv[h] = l > 0.f ? 1.f / l : 0.f;
      lse2[h] = l > 0.f ? m_[h] + __log2f(l) : -INFINITY;
    }
    if (w_.slot >= 0) {
      store_partial(o, inv, lse2);
      return;
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) store_lse(h, lse2[h] == -INFINITY ? INFINITY : lse2[h] * device::kLn2);
    if (out_rows16()) {
      store_staged(o, inv);
      return;
    }
    Elem* out = static_cast<Elem*>(p_.out);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if (!row_valid(h)) continue;
      Elem* row = out + token(h) * p_.out_stride_t + static_cast<int64_t>(w_.head) * p_.out_stride_h;
#pragma unroll
      for (int c = 0; c < kORegs / 4; ++c) {
        const int j = 4 * c + 2 * h;
        *reinterpret_cast<uint32_t*>(row + dev::acc_col(lane_, j)) =
            device::ElemOps<Elem>::pack(o[j] * inv[h], o[j + 1] * inv[h]);
      }
    }
  }

  // Whether out's rows (this head's) start at 16-byte boundaries: the staged store's condition.
  __device__ bool out_rows16() const {
    constexpr int kElems = 16 / static_cast<int>(sizeof(Elem));
    return reinterpret_cast<uintptr_t>(p_.out) % 16 == 0 && p_.out_stride_t % kElems == 0 &&
           p_.out_stride_h % kElems == 0;
  }

  // out through shared memory: the fragments, scaled and packed, into this warpgroup's Q rows
  // (its S products are all done: no wgmma reads them any more, and no other warpgroup does),
  // in the 128-byte swizzle (a warp's 4-byte stores of 8 rows fall in distinct banks); then,
  // after a barrier of the warpgroup, whole rows of the sequence 16 bytes at a time. Storing
  // the fragments straight to global memory writes 16 bytes of each of 8 rows per warp store,
  // as the backward's dq conversion did at a third of the copy rate.
  __device__ void store_staged(const float (&o)[kORegs], const float (&inv)[2]) const {
    static_assert(C::kVSlabs <= C::kQkSlabs, "out's rows fit in the warpgroup's Q rows");
    uint8_t* rows = &sm_.q[0][0] + g_ * C::kConsumerQOffset;  // slab s of them: rows + s * kQSlabBytes
#pragma unroll
    for (int j = 0; j < kORegs; j += 2) {
      const int h = dev::acc_row_half(j);
      const int row = dev::acc_row(t_, j);
      const int col = dev::acc_col(lane_, j);
      const int at = (col / C::kSlabCols) * C::kQSlabBytes + dev::sw128_offset(row, (col % C::kSlabCols) / 8) +
                     (col % 8) * static_cast<int>(sizeof(Elem));
      *reinterpret_cast<uint32_t*>(rows + at) = device::ElemOps<Elem>::pack(o[j] * inv[h], o[j + 1] * inv[h]);
    }
    dev::named_barrier_sync(kStagingBarrier + g_, dev::kWarpgroupThreads);
    constexpr int kRowChunks = C::kDv * static_cast<int>(sizeof(Elem)) / 16;
    const int valid = w_.q_rows - first_row_ < C::kRowsPerConsumer ? w_.q_rows - first_row_ : C::kRowsPerConsumer;
    Elem* out = static_cast<Elem*>(p_.out) + (static_cast<int64_t>(w_.q_begin) + first_row_) * p_.out_stride_t +
                static_cast<int64_t>(w_.head) * p_.out_stride_h;
    for (int c = t_; c < valid * kRowChunks; c += dev::kWarpgroupThreads) {
      const int row = c / kRowChunks, chunk = c % kRowChunks;
      const int at = (chunk / 8) * C::kQSlabBytes + dev::sw128_offset(row, chunk % 8);
      *reinterpret_cast<uint4*>(out + row * p_.out_stride_t + chunk * 8) = *reinterpret_cast<const uint4*>(rows + at);
    }
  }

  // Row r of this warpgroup's rows within the CTA's tile, at row half h.
  __device__ int tile_row(int h) const { return row0_ + 8 * h - w_.m_block * C::kBlockM; }

  // A piece of a tail tile: its rows' output normalised by the piece's own row sums, float32,
  // and their base-2 LSE (-inf and zeros: the piece saw no key for the row), into its slot for
  // the combine (common/mha_prefill_tiling.h). A quad's 4 lanes write 32 bytes of a row at once.
  __device__ void store_partial(const float (&o)[kORegs], const float (&inv)[2], const float (&lse2)[2]) const {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if (!row_valid(h)) continue;
      const int64_t row = static_cast<int64_t>(w_.slot) * C::kBlockM + tile_row(h);
      if (lane_ % 4 == 0) p_.partial_lse[row] = lse2[h];
      float* dst = p_.partial_out + row * C::kDv;
#pragma unroll
      for (int c = 0; c < kORegs / 4; ++c) {
        const int j = 4 * c + 2 * h;
        *reinterpret_cast<float2*>(dst + dev::acc_col(lane_, j)) = make_float2(o[j] * inv[h], o[j + 1] * inv[h]);
      }
    }
  }

  __device__ void store_empty() const {
    if (w_.slot >= 0) {  // a piece without key tiles: zero rows of weight 0 (LSE -inf)
      const float o[kORegs] = {};
      const float inv[2] = {0.f, 0.f}, lse2[2] = {-INFINITY, -INFINITY};
      store_partial(o, inv, lse2);
      return;
    }
    Elem* out = static_cast<Elem*>(p_.out);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      store_lse(h, INFINITY);
      if (!row_valid(h)) continue;
      Elem* row = out + token(h) * p_.out_stride_t + static_cast<int64_t>(w_.head) * p_.out_stride_h;
      for (int c = 0; c < kORegs / 4; ++c) {
        *reinterpret_cast<uint32_t*>(row + dev::acc_col(lane_, 4 * c)) = 0u;
      }
    }
  }

  const MhaPrefillParams& p_;
  Smem<C>& sm_;
  const WorkTile& w_;
  int g_, t_, lane_;
  int row0_;       // this thread's upper row within the sequence
  int first_row_;  // the warpgroup's first row within the sequence
  uint32_t q_desc_base_;
  float m_[2], l_[2];  // running max (scaled, base 2) and this thread's partial row sums
};

}  // namespace mlakit::detail::mha_sm90
