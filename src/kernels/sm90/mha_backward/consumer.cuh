// A consumer warpgroup of the Hopper MHA backward: 64 of the CTA's keys against every query
// tile of the walk. Everything is computed transposed (keys as the wgmma rows), so P and dS
// come out of their products in the layout of the next product's A fragments:
//   S^T  = K Q^T,  dP^T = V dO^T                 (SS, m64 n64, keys x queries)
//   P^T  = exp2(S^T scale_log2 - lse2[query]),   dS^T = P^T (dP^T - D[query])   (masked)
//   dS  -> shared memory as [query][key]          (both consumers; barrier before dQ)
//   dV  += P^T dO,  dK += dS^T Q                 (RS, m64 n d, from registers)
//   dQ   = dS K, this consumer's columns         (SS, m64 n64 (n32 at d 64, + n32 at d_qk 192), all 128 keys)
//   dQ  -> staging -> the writer's bulk reduction into the tile's dq_accum slot (float32)
// At d 64 and 128 the order is dV, dQ, dK: dQ is staged while dK runs (the default mode; the
// deterministic one waits for dK and frees the stage first). At d_qk 192 everything above dQ
// runs per 32-query half of the tile (n32 scores), so that the scores fit beside the 96 + 64
// dK / dV accumulators.
// Fragments (device/sm90/wgmma_fragment.cuh): accumulator register i of thread t is in row
// acc_row(t, i) (a key of S^T, a query of dQ) and column acc_col(t, i).
#pragma once

#include <cmath>
#include <cstdint>

#include "device/async_proxy.cuh"
#include "device/numeric.cuh"
#include "device/sm90/matrix_store.cuh"
#include "device/sm90/sync.cuh"
#include "device/sm90/wgmma.cuh"
#include "device/sm90/wgmma_fragment.cuh"
#include "kernels/sm90/mha_backward/config.cuh"
#include "kernels/sm90/mha_backward/work.cuh"

namespace mlakit::detail::mha_bwd_sm90 {

template <class C, typename Elem>
class Consumer {
 public:
  static constexpr int kSRegs = C::kHalfRows / 2;  // S^T, dP^T of a half: m64 n kHalfRows
  static constexpr int kKRegs = C::kDqk / 2;       // dK: m64 n d_qk
  static constexpr int kVRegs = C::kDv / 2;        // dV: m64 n d_v
  static constexpr int kQRegs = C::kDqMainCols / 2;                // dQ, K slab g: m64 n64 (n32 at d 64)
  static constexpr bool kDqTail = C::kDqTailCols > 0;              // d_qk 192
  static constexpr int kQTailRegs = kDqTail ? C::kDqTailCols / 2 : 1;  // dQ, half g of slab 2: m64 n32
  static constexpr int kQuerySteps = C::kHalfRows / 16;  // k16 steps of dV, dK per half
  static constexpr int kKeySteps = C::kBlockN / 16;     // k16 steps of dQ
  static constexpr int kQkSteps = C::kDqk / 16;
  static constexpr int kVSteps = C::kDv / 16;
  static constexpr int kStepsPerSlab = C::kSlabCols / 16;

  __device__ Consumer(const MhaBackwardParams& p, Smem<C>& sm, const BackwardWork& w, int g, int t)
      : p_(p), sm_(sm), w_(w), g_(g), t_(t), lane_(t % dev::kWarpSize) {}

  __device__ void run() {
    float dk[kKRegs], dv[kVRegs];
#pragma unroll
    for (int i = 0; i < kKRegs; ++i) dk[i] = 0.f;
#pragma unroll
    for (int i = 0; i < kVRegs; ++i) dv[i] = 0.f;
    if (w_.tiles > 0) dev::mbarrier_wait(&sm_.kv_full, 0);
#pragma unroll 1
    for (int it = 0; it < w_.tiles; ++it) tile(it, dk, dv);
    store_key_gradients(dk, dv);
  }

 private:
  using MmaS = dev::Wgmma<C::kHalfRows, Elem>;     // S^T, dP^T
  using MmaK = dev::Wgmma<C::kDqk, Elem>;          // dK
  using MmaV = dev::Wgmma<C::kDv, Elem>;           // dV
  using MmaQ = dev::Wgmma<C::kDqMainCols, Elem>;   // dQ, K slab g (half g of slab 0 at d 64)
  using MmaQTail = dev::Wgmma<kDqTail ? C::kDqTailCols : 32, Elem>;  // dQ, half g of slab 2
  using Ops = device::ElemOps<Elem>;

  // Named barrier (0 is __syncthreads'): both consumers' dS written.
  static constexpr uint32_t kDsBarrier = 1;
  static constexpr uint32_t kBothThreads = C::kConsumers * dev::kWarpgroupThreads;

  // One query tile; its dQ is staged at the end, for the writer to add (dq_writer.cuh).
  __device__ void tile(int it, float (&dk)[kKRegs], float (&dv)[kVRegs]) {
    const int stage = it % C::kStages;
    const int buffer = C::kDsBuffers == 1 ? 0 : it & 1;
    dev::mbarrier_wait(&sm_.q_full[stage], (it / C::kStages) & 1);

    uint32_t pfrag[kQuerySteps][4], dsfrag[kQuerySteps][4];
#pragma unroll
    for (int h = 0; h < C::kHalves; ++h) {
      float s[kSRegs], dp[kSRegs];
      scores(s, dp, stage, h);
      dev::wgmma_wait<1>();  // S^T done; dP^T may still run while P^T is computed
      dev::fence_registers(s);
      probabilities(s, stage, tile_row0<C>(w_, it), h);
      dev::wgmma_wait<0>();
      dev::fence_registers(dp);
      score_gradients(s, dp, stage, h, pfrag, dsfrag);
      if constexpr (C::kDsBuffers == 1) {
        if (h == 0 && it > 0) dev::mbarrier_wait(&sm_.ds_empty, (it - 1) & 1);  // the previous tile's dS read
      }
      store_ds(dsfrag, buffer, h);
      device::fence_proxy_async_shared();  // dS, read by the dQ product (async proxy)
      dev::wgmma_fence();
      value_product(dv, pfrag, stage, h);
      if constexpr (C::kHalves > 1) {
        key_product(dk, dsfrag, stage, h);
        dev::wgmma_commit();
        // The half's dV / dK products done before the next products are issued: their
        // accumulators and these fragments would not fit beside dK and dV together.
        dev::wgmma_wait<0>();
        dev::fence_registers(pfrag);
        dev::fence_registers(dsfrag);
      } else {
        dev::wgmma_commit();  // dV; dK is issued after dQ (below)
      }
    }
    if constexpr (C::kHalves > 1) dev::mbarrier_arrive(&sm_.q_empty[stage][g_]);  // Q, dO, lse2, D read
    dev::named_barrier_sync(kDsBarrier, kBothThreads);  // both consumers' dS slabs written

    float dq[kQRegs];
    query_product<MmaQ>(dq, buffer, dev::smem_u32(&sm_.k[0][0]) + C::dq_main_cols_offset(g_));
    if constexpr (C::kHalves == 1) {
      // dK after dQ: dQ is staged while dK runs (in the default mode; in the deterministic one
      // the writer's turn may keep dq_empty waiting, and the stage's Q, dO are released first).
      dev::wgmma_fence();
      key_product(dk, dsfrag, stage, 0);
      dev::wgmma_commit();
      dev::wgmma_wait<1>();  // dV, dQ done
      dev::fence_registers(dq);
      dev::fence_registers(dv);
      dev::fence_registers(pfrag);
      // Both orders spelled out: every path waits for dK (else ptxas adds a wait of its own).
      if (p_.deterministic) {
        finish_key_product(dk, dsfrag, stage);
        stage_main_dq(dq, it);
      } else {
        stage_main_dq(dq, it);
        finish_key_product(dk, dsfrag, stage);
      }
    } else {
      dev::wgmma_wait<0>();
      dev::fence_registers(dq);
      dev::fence_registers(dk);
      dev::fence_registers(dv);
      stage_main_dq(dq, it);
    }
    if constexpr (kDqTail) {
      // The tail after the main part is staged: both accumulators would not fit beside dK, dV.
      float dq_tail[kQTailRegs];
      query_product<MmaQTail>(dq_tail, buffer,
                              dev::smem_u32(&sm_.k[C::kConsumers][0]) + g_ * (dev::kSwizzleRowBytes / 2));
      dev::wgmma_wait<0>();
      dev::fence_registers(dq_tail);
      dev::fence_registers(dk);
      dev::fence_registers(dv);
      stage_dq(dq_tail, kQRegs);
    }
    if constexpr (C::kDsBuffers == 1) dev::mbarrier_arrive(&sm_.ds_empty);  // its dQ products' reads of dS done
    device::fence_proxy_async_shared();  // the staging, read by the writer's bulk reduction (async proxy)
    dev::mbarrier_arrive(&sm_.dq_full);
  }

  // Issues S^T = K Q^T and dP^T = V dO^T of this consumer's 64 keys and the queries of half h
  // (SS, both operands K-major), one commit group each.
  __device__ void scores(float (&s)[kSRegs], float (&dp)[kSRegs], int stage, int h) {
    const uint32_t key_rows = g_ * C::kConsumerKeyOffset;
    const uint32_t query_rows = h * C::kHalfRows * dev::kSwizzleRowBytes;
    const uint64_t k_desc = dev::opaque_desc(dev::make_sw128_desc(dev::smem_u32(&sm_.k[0][0]) + key_rows, 16, 1024));
    const uint64_t q_desc =
        dev::opaque_desc(dev::make_sw128_desc(dev::smem_u32(&sm_.q[stage][0][0]) + query_rows, 16, 1024));
    const uint64_t v_desc = dev::opaque_desc(dev::make_sw128_desc(dev::smem_u32(&sm_.v[0][0]) + key_rows, 16, 1024));
    const uint64_t o_desc =
        dev::opaque_desc(dev::make_sw128_desc(dev::smem_u32(&sm_.dout[stage][0][0]) + query_rows, 16, 1024));
    dev::wgmma_fence();
#pragma unroll
    for (int k = 0; k < kQkSteps; ++k) {
      const uint32_t in_slab = (k % kStepsPerSlab) * 32;
      const int slab = k / kStepsPerSlab;
      MmaS::template ss<0>(s, dev::advance_desc(k_desc, slab * C::kKvSlabBytes + in_slab),
                           dev::advance_desc(q_desc, slab * C::kQSlabBytes + in_slab), k > 0);
    }
    dev::wgmma_commit();
#pragma unroll
    for (int k = 0; k < kVSteps; ++k) {
      const uint32_t in_slab = (k % kStepsPerSlab) * 32;
      const int slab = k / kStepsPerSlab;
      MmaS::template ss<0>(dp, dev::advance_desc(v_desc, slab * C::kKvSlabBytes + in_slab),
                           dev::advance_desc(o_desc, slab * C::kQSlabBytes + in_slab), k > 0);
    }
    dev::wgmma_commit();
  }

  // S^T -> P^T = exp2(S^T scale_log2 - lse2[query]) in place (queries of half h). Keys past
  // the sequence and (causal) keys a query does not see get 0; queries past the sequence have
  // lse2 +inf.
  __device__ void probabilities(float (&s)[kSRegs], int stage, int row0, int h) const {
    const int c = lane_ % 4;
    const int first = h * C::kHalfRows;  // the half's first query column
    const int key_base = w_.key0 + g_ * C::kKeysPerConsumer;
    const int diagonal = w_.k_len - w_.q_len;  // query t sees keys j with j - t <= Lk - Lq
    const bool masked = w_.key0 + C::kBlockN > w_.k_rows ||
                        (p_.causal && int64_t{w_.key0} + C::kBlockN - 1 - row0 > diagonal);
#pragma unroll
    for (int j8 = 0; j8 < kSRegs / 4; ++j8) {
      const int col = first + 8 * j8 + 2 * c;
      const float2 lse = *reinterpret_cast<const float2*>(&sm_.lse2[stage][col]);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = 4 * j8 + e;
        float x = device::fast_exp2(s[i] * p_.scale_log2 - ((e & 1) ? lse.y : lse.x));
        if (masked) {
          const int key = key_base + dev::acc_row(t_, i);
          const bool visible = key < w_.k_rows && (!p_.causal || key - (row0 + col + (e & 1)) <= diagonal);
          if (!visible) x = 0.f;
        }
        s[i] = x;
      }
    }
  }

  // dS^T = P^T (dP^T - D[query]) in place; P^T and dS^T packed into the RS A fragments over the
  // queries (pack(x[8 kb + 2 r], x[8 kb + 2 r + 1]) for query block kb, as the forward's P),
  // from which the caller stores dS (store_ds). Masked P are 0, so their dS are 0 (dP is finite: rows
  // past a sequence are zeroed).
  __device__ void score_gradients(const float (&s)[kSRegs], float (&dp)[kSRegs], int stage, int h,
                                  uint32_t (&pfrag)[kQuerySteps][4], uint32_t (&dsfrag)[kQuerySteps][4]) const {
    const int c = lane_ % 4;
    const int first = h * C::kHalfRows;
#pragma unroll
    for (int j8 = 0; j8 < kSRegs / 4; ++j8) {
      const int col = first + 8 * j8 + 2 * c;
      const float2 dd = *reinterpret_cast<const float2*>(&sm_.row_dot[stage][col]);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = 4 * j8 + e;
        dp[i] = s[i] * (dp[i] - ((e & 1) ? dd.y : dd.x));
      }
    }
#pragma unroll
    for (int kb = 0; kb < kQuerySteps; ++kb) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        pfrag[kb][r] = Ops::pack(s[8 * kb + 2 * r], s[8 * kb + 2 * r + 1]);
        dsfrag[kb][r] = Ops::pack(dp[8 * kb + 2 * r], dp[8 * kb + 2 * r + 1]);
      }
    }
  }

  // dS as [query][key] (q's dtype, 128-byte swizzle: row = query, 16-byte chunk = key / 8) into
  // this consumer's slab of the buffer, rows of half h, by stmatrix.trans from the packed dS^T:
  // the 8 x 8 block (h, j) of this warp's dS^T (keys 16 warp + 8 h .., queries 8 j ..) is
  // dsfrag[j / 2][2 (j % 2) + h], and stored transposed it is 8 query rows of key chunk
  // 2 warp + h. Call kb stores dsfrag[kb][0..3], blocks (h, j) = (b % 2, 2 kb + b / 2) for
  // b = 0..3; lane l addresses row l % 8 of block b = l / 8.
  __device__ void store_ds(const uint32_t (&dsfrag)[kQuerySteps][4], int buffer, int h) const {
    const uint32_t slab = dev::smem_u32(&sm_.ds[buffer][g_][0]);
    const int block = lane_ / 8;
    const int chunk = 2 * (t_ / dev::kWarpSize) + block % 2;
#pragma unroll
    for (int kb = 0; kb < kQuerySteps; ++kb) {
      const int query = h * C::kHalfRows + 8 * (2 * kb + block / 2) + lane_ % 8;
      dev::stmatrix_x4_trans(slab + dev::sw128_offset(query, chunk), dsfrag[kb][0], dsfrag[kb][1], dsfrag[kb][2],
                             dsfrag[kb][3]);
    }
  }

  // dV += P^T dO over the queries of half h (RS; dO is N-major for this product: 8-row groups
  // 1024 bytes apart, 64-column slabs a slab apart). Issued only: the caller fences before and
  // commits after.
  __device__ void value_product(float (&dv)[kVRegs], const uint32_t (&pfrag)[kQuerySteps][4], int stage, int h) {
    const uint64_t o_desc =
        dev::opaque_desc(dev::make_sw128_desc(dev::smem_u32(&sm_.dout[stage][0][0]), C::kQSlabBytes, 1024));
#pragma unroll
    for (int kb = 0; kb < kQuerySteps; ++kb) {
      MmaV::template rs<1>(dv, pfrag[kb],
                           dev::advance_desc(o_desc, (h * kQuerySteps + kb) * 16 * dev::kSwizzleRowBytes), true);
    }
  }

  // dK += dS^T Q over the queries of half h (RS, Q N-major as dO above); issued only.
  __device__ void key_product(float (&dk)[kKRegs], const uint32_t (&dsfrag)[kQuerySteps][4], int stage, int h) {
    const uint64_t q_desc =
        dev::opaque_desc(dev::make_sw128_desc(dev::smem_u32(&sm_.q[stage][0][0]), C::kQSlabBytes, 1024));
#pragma unroll
    for (int kb = 0; kb < kQuerySteps; ++kb) {
      MmaK::template rs<1>(dk, dsfrag[kb],
                           dev::advance_desc(q_desc, (h * kQuerySteps + kb) * 16 * dev::kSwizzleRowBytes), true);
    }
  }

  // d 64, 128: waits for the tile's dK product (the last one in flight) and releases the stage.
  __device__ void finish_key_product(float (&dk)[kKRegs], uint32_t (&dsfrag)[kQuerySteps][4], int stage) {
    dev::wgmma_wait<0>();
    dev::fence_registers(dk);
    dev::fence_registers(dsfrag);
    dev::mbarrier_arrive(&sm_.q_empty[stage][g_]);  // this thread's reads of Q, dO, lse2, D of the stage done
  }

  // dQ columns = dS K over all 128 keys: A = dS [query][key] (K-major, a slab per 64 keys), B =
  // K as N-major (rows = keys) from `k_cols`: slab g's 64 columns (Mma n64) or the 32 of half
  // g of a slab (Mma n32: slab 0 at d 64, slab 2 at d_qk 192; a start 64 bytes into the
  // swizzled rows for g = 1: n32 stays inside the 128-byte rows, so the swizzle applies as to
  // a k-step's offset).
  template <class Mma, int kRegs>
  __device__ void query_product(float (&dq)[kRegs], int buffer, uint32_t k_cols) {
    const uint64_t ds_desc = dev::opaque_desc(dev::make_sw128_desc(dev::smem_u32(&sm_.ds[buffer][0][0]), 16, 1024));
    const uint64_t k_desc = dev::opaque_desc(dev::make_sw128_desc(k_cols, C::kKvSlabBytes, 1024));
    dev::wgmma_fence();
#pragma unroll
    for (int k = 0; k < kKeySteps; ++k) {
      const uint32_t in_slab = (k % kStepsPerSlab) * 32;
      const int slab = k / kStepsPerSlab;
      Mma::template ss<1>(dq, dev::advance_desc(ds_desc, slab * C::kDsSlabBytes + in_slab),
                          dev::advance_desc(k_desc, k * 16 * dev::kSwizzleRowBytes), k > 0);
    }
    dev::wgmma_commit();
  }

  // The main dQ part of tile `it`, staged once the writer's add has read the previous tile's.
  __device__ void stage_main_dq(const float (&dq)[kQRegs], int it) const {
    if (it > 0) dev::mbarrier_wait(&sm_.dq_empty, (it - 1) & 1);
    stage_dq(dq, 0);
  }

  // dQ accumulator registers, staged for the writer in fragment order as part g of the tile's
  // dq_accum slot (common/mha_backward_tiling.h), from register `first` of the part (the tail's
  // after the main ones): register pair (i, i + 1) of thread t goes to float2 (i / 2) * 128 + t,
  // so each warp's store is 256 contiguous bytes (no bank conflict).
  template <int kRegs>
  __device__ void stage_dq(const float (&dq)[kRegs], int first) const {
    auto* staging = reinterpret_cast<float2*>(&sm_.dq[g_][0]) + (first / 2) * dev::kWarpgroupThreads;
#pragma unroll
    for (int i = 0; i < kRegs; i += 2) staging[(i / 2) * dev::kWarpgroupThreads + t_] = make_float2(dq[i], dq[i + 1]);
  }

  // dK (times softmax_scale) and dV of this consumer's keys inside the sequence, in q's dtype,
  // two columns per 4-byte store; a piece of a tail tile writes them in float32 to its slot.
  __device__ void store_key_gradients(const float (&dk)[kKRegs], const float (&dv)[kVRegs]) const {
    if (w_.slot >= 0) {
      store_partial_key_gradients(dk, dv);
      return;
    }
    const int64_t key_row0 = int64_t{w_.k_begin} + w_.key0 + g_ * C::kKeysPerConsumer;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int key_local = dev::acc_row(t_, 2 * h);
      if (w_.key0 + g_ * C::kKeysPerConsumer + key_local >= w_.k_rows) continue;
      const int64_t row = key_row0 + key_local;
      Elem* dk_row = static_cast<Elem*>(p_.dk) + row * p_.dk_stride_t + w_.kv_head * p_.dk_stride_h;
      Elem* dv_row = static_cast<Elem*>(p_.dv) + row * p_.dv_stride_t + w_.kv_head * p_.dv_stride_h;
#pragma unroll
      for (int q = 0; q < kKRegs / 4; ++q) {
        const int i = 4 * q + 2 * h;
        *reinterpret_cast<uint32_t*>(dk_row + dev::acc_col(lane_, i)) =
            Ops::pack(dk[i] * p_.softmax_scale, dk[i + 1] * p_.softmax_scale);
      }
#pragma unroll
      for (int q = 0; q < kVRegs / 4; ++q) {
        const int i = 4 * q + 2 * h;
        *reinterpret_cast<uint32_t*>(dv_row + dev::acc_col(lane_, i)) = Ops::pack(dv[i], dv[i + 1]);
      }
    }
  }

  // A piece's dK (times softmax_scale) and dV of this consumer's keys, float32, into its slot
  // of partial_kv (rows of d_qk + d_v: dK then dV; common/mha_backward_tiling.h), every key
  // row of the tile (the combine reads those inside the sequence). A quad's 4 lanes write 32
  // bytes of a row at once.
  __device__ void store_partial_key_gradients(const float (&dk)[kKRegs], const float (&dv)[kVRegs]) const {
    constexpr int kRow = C::kDqk + C::kDv;
    float* slot = p_.partial_kv + int64_t{w_.slot} * C::kBlockN * kRow;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float* row = slot + (g_ * C::kKeysPerConsumer + dev::acc_row(t_, 2 * h)) * kRow;
#pragma unroll
      for (int q = 0; q < kKRegs / 4; ++q) {
        const int i = 4 * q + 2 * h;
        *reinterpret_cast<float2*>(row + dev::acc_col(lane_, i)) =
            make_float2(dk[i] * p_.softmax_scale, dk[i + 1] * p_.softmax_scale);
      }
#pragma unroll
      for (int q = 0; q < kVRegs / 4; ++q) {
        const int i = 4 * q + 2 * h;
        *reinterpret_cast<float2*>(row + C::kDqk + dev::acc_col(lane_, i)) = make_float2(dv[i], dv[i + 1]);
      }
    }
  }

  const MhaBackwardParams& p_;
  Smem<C>& sm_;
  const BackwardWork& w_;
  int g_, t_, lane_;
};

}  // namespace mlakit::detail::mha_bwd_sm90
