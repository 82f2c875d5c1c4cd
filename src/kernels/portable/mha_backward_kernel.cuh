// Portable MHA prefill backward, main kernel (any CUDA GPU of sm80 or newer; FlashAttention-2's
// backward schedule on mma.sync). The contract is include/mlakit/mha_prefill.h; the row kernels
// before and after it (D = rowsum(dout * out), dq's conversion) are mha_backward_rows.cu.
//
// Grid (key tiles of max_seqlen_k, h_kv, b), y and z capped at 65535 (the CTA walks the rest).
// A CTA owns kKeys keys of one kv head of one sequence and walks every query tile of every
// query head of that kv head that sees any of its keys (causal: from the first such tile).
// dK and dV of its keys stay in registers over the whole walk (so GQA's sum over query heads
// and the sum over queries cost no memory traffic and no atomics); dQ of each query tile is
// added into the float32 workspace dq_accum: on sm90 (kBulkDq) by bulk reductions of whole
// rows from a per-warp staging area, elsewhere one float reduction per value.
//
// Warps: warp w owns keys 16 (w % kKeyGroups) .. + 15 and columns (w / kKeyGroups) of kDSplit
// equal slices of dK and dV. Everything is computed transposed (keys as the MMA rows), so the
// probabilities come out of one MMA in the layout of the next one's A operand:
//   S^T  = K Q^T                      (16 keys x kRows queries per warp)
//   P^T  = exp2(S^T * scale_log2 - lse_log2[query]), masked (key past Lk, causal)
//   dP^T = V dO^T
//   dS^T = P^T * (dP^T - D[query])
//   dV  += P^T dO,  dK += dS^T Q      (the warp's column slice)
//   dS^T -> shared memory (q's dtype); barrier
//   dQ   = dS K for the tile's queries, split over all warps in 16-row x 64-column units, each
//          added into dq_accum (float32)
// With kDSplit = 2 (d 256) both warps of a key group compute the same S^T and dP^T: the price
// of holding dK and dV of 512 columns in two warps' registers.
//
// Pipeline: K and V load once; Q, dO (cp.async) and lse, D (plain loads) of the next query tile
// load into the other of two buffers while the current one computes:
//   prologue: issue K, V, item 0 into buffer 0; commit
//   item i:   wait all; __syncthreads   (item i landed; buffer i+1 free: item i-1 is done)
//             issue item i+1 into buffer (i+1) % 2; commit
//             S^T, P^T, dP^T, dS^T, dV, dK; dS^T -> shared
//             [deterministic: thread 0 waits for this query tile's counter to reach this key tile]
//             __syncthreads   (dS^T visible)
//             dQ -> dq_accum
//             [deterministic: the adds complete (bulk); __syncthreads; thread 0 advances the counter]
//   epilogue: dK * softmax_scale and dV, stored from the accumulators (4-byte pairs).
// Deterministic mode: the key tiles that add into a query tile are a prefix 0..L of the
// sequence's key tiles (causal too). They add from L down to 0: key tile n waits until the
// tile's counter says L - n (tiles L..n+1 are done), adds, and sets L - n + 1, so the float32
// sums run in one order in every run. The grid's x runs over the key tiles backwards in this
// mode: tile n waits only on higher tiles of the same (sequence, kv head), which have lower
// block indices, are launched no later, and never wait on it. Causal, the walks line up along
// the diagonal (tile n + 1 starts one query tile later) and the waits are short.
//
// Rows past Lq and keys past Lk are zero-filled in shared memory (NaN may live there); their
// lse is +inf (P = 0) and D = 0, keys past Lk are masked: no NaN reaches a sum.
//
// Shared memory (MhaBackwardConfig, common/mha_backward_tiling.h): K [kKeys][d_qk] |
// V [kKeys][d_v] | Q [2][kRows][d_qk] | dO [2][kRows][d_v] (swizzled 128-byte lines,
// mha_prefill_tile.cuh) | dS^T [kKeys][kRows] (rows padded by 16 bytes) | lse, D [2][kRows]
// float32 | sm90: dQ staging [warps][16][64] float32 (rows padded to 288 bytes). 8 warps, 128
// keys (64 at d 256), one CTA per SM; the sizes and register counts per head-dim pair are in
// docs/kernels/mha_backward_portable.md.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "common/mha_backward_tiling.h"
#include "device/async_proxy.cuh"
#include "device/cp_async.cuh"
#include "device/gpu_flag.cuh"
#include "device/ldmatrix.cuh"
#include "device/mma_sm80.cuh"
#include "device/numeric.cuh"
#include "kernels/mha_backward_params.h"
#include "kernels/portable/launch.h"
#include "kernels/portable/mha_prefill_tile.cuh"

namespace mlakit::detail::mha_portable {

template <typename Elem, typename C>
class BackwardCta {
  using Ops = device::ElemOps<Elem>;

 public:
  __device__ BackwardCta(const MhaBackwardParams& p, unsigned char* smem, bool aligned16)
      : p_(p),
        smem_(smem),
        smem_base_(device::smem_address(smem)),
        aligned16_(aligned16),
        tid_(threadIdx.x),
        warp_(threadIdx.x / 32),
        lane_(threadIdx.x % 32),
        key_group_(warp_ % C::kKeyGroups),
        col_split_(warp_ / C::kKeyGroups) {}

  // Keys [key_tile * kKeys, +kKeys) of kv head hk of sequence seq. CTA-uniform; ends with a
  // barrier, so the next call may reuse the shared memory.
  __device__ void run(int seq, int hk, int key_tile) {
    q_begin_ = p_.cu_seqlens_q[seq];
    lq_ = p_.cu_seqlens_q[seq + 1] - q_begin_;
    const int k_begin = p_.cu_seqlens_k[seq];
    lk_ = p_.cu_seqlens_k[seq + 1] - k_begin;
    // Rows past max_seqlen_* (or past the tensors) break the data rules: never touched.
    lq_rows_ = rows_within(lq_, p_.max_seqlen_q, p_.total_q - q_begin_);
    lk_rows_ = rows_within(lk_, p_.max_seqlen_k, p_.total_k - k_begin);
    k0_ = key_tile * C::kKeys;
    if (k0_ >= lk_rows_) return;
    seq_ = seq;
    key_tile_ = key_tile;
    // Query t sees key j when j <= t + Lk - Lq: the first query that sees key k0.
    int64_t first_row = 0;
    if (p_.causal) first_row = int64_t{k0_} - (int64_t{lk_} - lq_);
    if (first_row < 0) first_row = 0;
    const int m_first = static_cast<int>(first_row / C::kRows);
    const int m_end = (lq_rows_ + C::kRows - 1) / C::kRows;
    num_m_ = first_row < lq_rows_ ? m_end - m_first : 0;
    m_first_ = m_first;
    h_first_ = hk * p_.heads_per_kv;
    const int items = p_.heads_per_kv * num_m_;

    k_src_ = static_cast<const Elem*>(p_.k) + static_cast<int64_t>(k_begin + k0_) * p_.k_stride_t + hk * p_.k_stride_h;
    const Elem* v_src =
        static_cast<const Elem*>(p_.v) + static_cast<int64_t>(k_begin + k0_) * p_.v_stride_t + hk * p_.v_stride_h;
    reset_accumulators();
    copy<C::kKeys, C::kQkChunks>(C::kKOffset, k_src_, p_.k_stride_t, lk_rows_ - k0_);
    copy<C::kKeys, C::kVChunks>(C::kVOffset, v_src, p_.v_stride_t, lk_rows_ - k0_);
    if (items > 0) load_item(0, 0);
    device::cp_async_commit();
    for (int it = 0; it < items; ++it) {
      const int buf = it & 1;
      device::cp_async_wait_groups_but<0>();
      __syncthreads();
      if (it + 1 < items) load_item(it + 1, buf ^ 1);
      device::cp_async_commit();
      compute_item(it, buf);
    }
    store_key_gradients(k_begin, hk);
    if constexpr (C::kBulkDq) device::bulk_wait_all();  // the staging is free and dq_accum done
    __syncthreads();
  }

 private:
  // min(length, max_seqlen, room): room = the tensor's rows from the sequence's first one.
  static __device__ int rows_within(int length, int max_seqlen, int64_t room) {
    const int n = min(length, max_seqlen);
    return room < n ? static_cast<int>(room) : n;
  }

  __device__ int item_head(int it) const { return h_first_ + it / num_m_; }
  __device__ int item_row0(int it) const { return (m_first_ + it % num_m_) * C::kRows; }

  __device__ void reset_accumulators() {
#pragma unroll
    for (int j = 0; j < C::kDkCols / 8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) dk_[j].d[e] = 0.f;
    }
#pragma unroll
    for (int j = 0; j < C::kDvCols / 8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) dv_[j].d[e] = 0.f;
    }
  }

  template <int kTileRows, int kChunks>
  __device__ void copy(int offset, const Elem* src, int64_t stride, int valid) {
    copy_rows_aligned_as<Elem, kTileRows, kChunks, C::kThreads>(aligned16_, smem_base_ + offset, smem_ + offset, src,
                                                                stride, valid, tid_);
  }

  // Q and dO rows of item `it` into buffer `buf` (cp.async, not committed), lse (log2 domain)
  // and D by plain loads. Rows past the sequence: zeros, lse +inf, D 0.
  __device__ void load_item(int it, int buf) {
    const int h = item_head(it), row0 = item_row0(it);
    const int64_t t0 = q_begin_ + row0;
    const Elem* q_src = static_cast<const Elem*>(p_.q) + t0 * p_.q_stride_t + h * p_.q_stride_h;
    const Elem* o_src = static_cast<const Elem*>(p_.dout) + t0 * p_.dout_stride_t + h * p_.dout_stride_h;
    copy<C::kRows, C::kQkChunks>(C::kQOffset + buf * C::kQBytes, q_src, p_.q_stride_t, lq_rows_ - row0);
    copy<C::kRows, C::kVChunks>(C::kOOffset + buf * C::kOBytes, o_src, p_.dout_stride_t, lq_rows_ - row0);
    float* lse = reinterpret_cast<float*>(smem_ + C::kLseOffset) + buf * C::kRows;
    float* dot = reinterpret_cast<float*>(smem_ + C::kDOffset) + buf * C::kRows;
    for (int r = tid_; r < C::kRows; r += C::kThreads) {
      const bool in = row0 + r < lq_rows_;
      lse[r] = in ? p_.lse[h * p_.lse_stride_h + (t0 + r) * p_.lse_stride_t] * device::kLog2e : INFINITY;
      dot[r] = in ? p_.row_dot[h * p_.total_q + t0 + r] : 0.f;
    }
  }

  // One query tile of one query head against the CTA's keys (see the file comment).
  __device__ void compute_item(int it, int buf) {
    const int h = item_head(it), row0 = item_row0(it);
    const uint32_t q_tile = smem_base_ + C::kQOffset + buf * C::kQBytes;
    const uint32_t o_tile = smem_base_ + C::kOOffset + buf * C::kOBytes;
    const float* lse = reinterpret_cast<const float*>(smem_ + C::kLseOffset) + buf * C::kRows;
    const float* dot = reinterpret_cast<const float*>(smem_ + C::kDOffset) + buf * C::kRows;

    device::MmaFragC s[C::kScoreTiles];  // S^T, then P^T
    transposed_product<C::kDqk>(smem_base_ + C::kKOffset, q_tile, s);
    probabilities(row0, lse, s);
    device::MmaFragC ds[C::kScoreTiles];  // dP^T, then dS^T
    transposed_product<C::kDv>(smem_base_ + C::kVOffset, o_tile, ds);
#pragma unroll
    for (int j = 0; j < C::kScoreTiles; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) ds[j].d[e] = s[j].d[e] * (ds[j].d[e] - dot[8 * j + 2 * (lane_ % 4) + e % 2]);
    }
    uint32_t frag[C::kRows / 16][4];
    to_a_fragments(s, frag);
    accumulate<C::kDvCols / 8>(frag, o_tile, C::kVRowBytes, col_split_ * C::kDvCols, dv_);
    to_a_fragments(ds, frag);
    accumulate<C::kDkCols / 8>(frag, q_tile, C::kQkRowBytes, col_split_ * C::kDkCols, dk_);
    if (col_split_ == 0) store_ds(frag);
    int32_t* counter = nullptr;
    int32_t turn = 0;  // key tiles that add into this query tile before this one
    if (p_.deterministic) {
      counter = p_.counters + mha_backward_counter(seq_, h, p_.h_q, p_.query_tiles, row0 / C::kRows);
      turn = last_key_tile(row0) - key_tile_;
      if (tid_ == 0) device::wait_until_equal(counter, turn);
    }
    __syncthreads();
    add_query_gradients(h, row0);
    if (p_.deterministic) {
      if constexpr (C::kBulkDq) device::bulk_wait_all();  // the adds made, not only issued
      __syncthreads();
      // No fence: the barrier orders every thread's adds before thread 0's release store,
      // which is cumulative over them (the Hopper kernel's writer measured the fence.sc at
      // 6-11% of the deterministic mode's time).
      if (tid_ == 0) device::store_release_gpu(counter, turn + 1);
    }
  }

  // The last key tile any query of the tile at row0 sees (the key tiles that add into its dQ
  // are 0 .. this one). The tile has a query in the sequence, and this CTA's keys are seen.
  __device__ int last_key_tile(int row0) const {
    int64_t last_key = lk_rows_ - 1;
    if (p_.causal) {
      const int64_t last_row = min(row0 + C::kRows, lq_rows_) - 1;
      last_key = min(last_key, last_row + (int64_t{lk_} - lq_));
    }
    return static_cast<int>(last_key / C::kKeys);
  }

  // acc (16 warp keys x kRows queries) = A B^T over kD columns: A = the warp's 16 rows of the
  // key-side tile `a_tile` (K or V), B = the query-side tile `b_tile` (Q or dO), both stored as
  // rows of kD values. Fragments as the forward's S = Q K^T (mha_prefill_kernel.cuh), with
  // the key-side tile in Q's place.
  template <int kD>
  __device__ void transposed_product(uint32_t a_tile, uint32_t b_tile, device::MmaFragC (&acc)[C::kScoreTiles]) {
    constexpr int kRowBytes = kD * C::kElemBytes;
#pragma unroll
    for (int j = 0; j < C::kScoreTiles; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[j].d[e] = 0.f;
    }
    const int a_row = 16 * key_group_ + lane_ % 8 + 8 * (lane_ / 8 % 2);
    const uint32_t a_lane = ldmatrix_lane_address(a_tile, a_row, lane_ / 16, kRowBytes);
    const uint32_t b_lane = ldmatrix_lane_address(b_tile, lane_ % 8 + 8 * (lane_ / 16), lane_ / 8 % 2, kRowBytes);
#pragma unroll 4
    for (int kk = 0; kk < kD; kk += 16) {
      uint32_t a[4];
      device::ldmatrix_x4(a, ldmatrix_at(a_lane, kk));
#pragma unroll
      for (int nb = 0; nb < C::kRows / 16; ++nb) {
        uint32_t b[4];
        device::ldmatrix_x4(b, ldmatrix_at(b_lane, kk) + nb * 16 * kRowBytes);
        device::mma_m16n8k16(a, {b[0], b[1]}, acc[2 * nb], Elem{});
        device::mma_m16n8k16(a, {b[2], b[3]}, acc[2 * nb + 1], Elem{});
      }
    }
  }

  // S^T -> P^T in place: element e of tile j is key 16 key_group + g + 8 (e / 2), query
  // 8 j + 2 c + e % 2 of the tile. Keys past Lk and (causal) keys a query does not see get 0;
  // queries past Lq get 0 through their lse of +inf.
  __device__ void probabilities(int row0, const float* lse, device::MmaFragC (&s)[C::kScoreTiles]) {
    const int g = lane_ / 4, c = lane_ % 4;
    const int key0 = k0_ + 16 * key_group_ + g;
    const int diagonal = lk_ - lq_;  // query t sees keys j with j - t <= Lk - Lq
    // CTA-uniform: whether some (query, key) pair of this tile pair is not visible.
    const bool partial = k0_ + C::kKeys > lk_rows_ || (p_.causal && k0_ + C::kKeys - 1 - row0 > diagonal);
#pragma unroll
    for (int j = 0; j < C::kScoreTiles; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = 8 * j + 2 * c + e % 2;
        float x = device::fast_exp2(s[j].d[e] * p_.scale_log2 - lse[col]);
        if (partial) {
          const int key = key0 + 8 * (e / 2);
          const bool visible = key < lk_rows_ && (!p_.causal || key - (row0 + col) <= diagonal);
          if (!visible) x = 0.f;
        }
        s[j].d[e] = x;
      }
    }
  }

  // Accumulator tiles (16 keys x kRows queries) as A fragments over the queries (k16 steps),
  // in q's dtype: the forward's P -> A mapping (mha_prefill_kernel.cuh).
  __device__ void to_a_fragments(const device::MmaFragC (&x)[C::kScoreTiles], uint32_t (&frag)[C::kRows / 16][4]) {
#pragma unroll
    for (int kb = 0; kb < C::kRows / 16; ++kb) {
      frag[kb][0] = Ops::pack(x[2 * kb].d[0], x[2 * kb].d[1]);
      frag[kb][1] = Ops::pack(x[2 * kb].d[2], x[2 * kb].d[3]);
      frag[kb][2] = Ops::pack(x[2 * kb + 1].d[0], x[2 * kb + 1].d[1]);
      frag[kb][3] = Ops::pack(x[2 * kb + 1].d[2], x[2 * kb + 1].d[3]);
    }
  }

  // acc (16 keys x kTiles * 8 columns from col0) += A (16 keys x kRows queries) B, B = rows
  // [0, kRows) of the query-side tile at `tile` (row_bytes per row), columns col0.. : the
  // forward's O += P V fragments (ldmatrix.trans), with the query tile in V's place.
  template <int kTiles>
  __device__ void accumulate(const uint32_t (&frag)[C::kRows / 16][4], uint32_t tile, int row_bytes, int col0,
                             device::MmaFragC (&acc)[kTiles]) {
    const uint32_t lane_address =
        ldmatrix_lane_address(tile, lane_ % 8 + 8 * (lane_ / 8 % 2), lane_ / 16, row_bytes);
#pragma unroll
    for (int kb = 0; kb < C::kRows / 16; ++kb) {
#pragma unroll
      for (int n = 0; n < kTiles * 8; n += 16) {
        uint32_t b[4];
        device::ldmatrix_x4_trans(b, ldmatrix_at(lane_address, col0 + n) + kb * 16 * row_bytes);
        device::mma_m16n8k16(frag[kb], {b[0], b[1]}, acc[n / 8], Elem{});
        device::mma_m16n8k16(frag[kb], {b[2], b[3]}, acc[n / 8 + 1], Elem{});
      }
    }
  }

  // dS^T (the A fragments of dK's product) into the shared [kKeys][kRows] tile: fragment
  // register r of k-step kb holds (key g + 8 (r % 2), queries 16 kb + 8 (r / 2) + 2 c, + 1).
  __device__ void store_ds(const uint32_t (&frag)[C::kRows / 16][4]) {
    const int g = lane_ / 4, c = lane_ % 4;
    unsigned char* base = smem_ + C::kDsOffset + (16 * key_group_ + g) * C::kDsRowBytes + 4 * c;
#pragma unroll
    for (int kb = 0; kb < C::kRows / 16; ++kb) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int offset = (r % 2) * 8 * C::kDsRowBytes + (16 * kb + 8 * (r / 2)) * C::kElemBytes;
        *reinterpret_cast<uint32_t*>(base + offset) = frag[kb][r];
      }
    }
  }

  // dQ / softmax_scale of the tile's queries over the CTA's keys, dS K, in 16-row x 64-column
  // units spread over the warps, each added into dq_accum. A = dS (queries x keys) read from
  // dS^T by ldmatrix.trans: lane l addresses key l % 8 + 8 (l / 16), query chunk l / 8 % 2 of
  // the unit's 16 rows, which gives a0..a3 = (rows 0-7 | 8-15) x (keys 0-7 | 8-15) in A's
  // order. B = K (keys x d), ldmatrix.trans as accumulate's.
  __device__ void add_query_gradients(int h, int row0) {
    constexpr int kRowGroups = C::kRows / 16;
    const uint32_t ds_lane = smem_base_ + C::kDsOffset + (lane_ % 8 + 8 * (lane_ / 16)) * C::kDsRowBytes +
                             (lane_ / 8 % 2) * 16;
    const uint32_t k_lane = ldmatrix_lane_address(smem_base_ + C::kKOffset, lane_ % 8 + 8 * (lane_ / 8 % 2),
                                                  lane_ / 16, C::kQkRowBytes);
    for (int unit = warp_; unit < C::kDqUnits; unit += C::kWarps) {
      const int group = unit % kRowGroups, col0 = unit / kRowGroups * C::kDqUnitCols;
      if (row0 + 16 * group >= lq_rows_) continue;  // warp-uniform: no row of the unit in the sequence
      device::MmaFragC acc[C::kDqUnitCols / 8];
#pragma unroll
      for (int j = 0; j < C::kDqUnitCols / 8; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[j].d[e] = 0.f;
      }
#pragma unroll
      for (int kk = 0; kk < C::kKeys; kk += 16) {
        uint32_t a[4];
        device::ldmatrix_x4_trans(a, ds_lane + kk * C::kDsRowBytes + group * 2 * 16);
#pragma unroll
        for (int n = 0; n < C::kDqUnitCols; n += 16) {
          uint32_t b[4];
          device::ldmatrix_x4_trans(b, ldmatrix_at(k_lane, col0 + n) + kk * C::kQkRowBytes);
          device::mma_m16n8k16(a, {b[0], b[1]}, acc[n / 8], Elem{});
          device::mma_m16n8k16(a, {b[2], b[3]}, acc[n / 8 + 1], Elem{});
        }
      }
      if constexpr (C::kBulkDq) {
        add_unit_bulk(acc, h, row0 + 16 * group, col0);
      } else {
        add_unit_atomic(acc, h, row0 + 16 * group, col0);
      }
    }
  }

  __device__ float* dq_row(int h, int t, int col0) const {
    return p_.dq_accum + ((q_begin_ + static_cast<int64_t>(t)) * p_.h_q + h) * C::kDqk + col0;
  }

  // A 16 x 64 dQ unit (accumulator layout) at query rows row0.., columns col0.., rows inside
  // the sequence, one float reduction per value.
  __device__ void add_unit_atomic(const device::MmaFragC (&acc)[C::kDqUnitCols / 8], int h, int row0, int col0) {
    const int g = lane_ / 4, c = lane_ % 4;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int t = row0 + g + 8 * r;
      if (t >= lq_rows_) continue;
      float* dst = dq_row(h, t, col0) + 2 * c;
#pragma unroll
      for (int j = 0; j < C::kDqUnitCols / 8; ++j) {
        atomicAdd(dst + 8 * j, acc[j].d[2 * r]);
        atomicAdd(dst + 8 * j + 1, acc[j].d[2 * r + 1]);
      }
    }
  }

  // The same unit through the warp's staging rows: each of lanes 0..15 adds one row of 64
  // floats by a bulk reduction. The staging is written again only after this lane's previous
  // reductions have read it (and every lane's: the __syncwarp after the wait).
  __device__ void add_unit_bulk(const device::MmaFragC (&acc)[C::kDqUnitCols / 8], int h, int row0, int col0) {
    const int g = lane_ / 4, c = lane_ % 4;
    const uint32_t stage = smem_base_ + C::kStageOffset + warp_ * 16 * C::kStageRowBytes;
    unsigned char* stage_ptr = smem_ + C::kStageOffset + warp_ * 16 * C::kStageRowBytes;
    device::bulk_wait_reads();
    __syncwarp();
#pragma unroll
    for (int r = 0; r < 2; ++r) {
#pragma unroll
      for (int j = 0; j < C::kDqUnitCols / 8; ++j) {
        *reinterpret_cast<float2*>(stage_ptr + (g + 8 * r) * C::kStageRowBytes + (8 * j + 2 * c) * 4) =
            make_float2(acc[j].d[2 * r], acc[j].d[2 * r + 1]);
      }
    }
    device::fence_proxy_async_shared();
    __syncwarp();
    if (lane_ < 16 && row0 + lane_ < lq_rows_) {
      device::bulk_reduce_add_f32(dq_row(h, row0 + lane_, col0), stage + lane_ * C::kStageRowBytes,
                                  C::kDqUnitCols * 4);
      device::bulk_commit_group();
    }
  }

  // dK (times softmax_scale) and dV of the warp's keys and column slice, in q's dtype, for the
  // keys inside the sequence: accumulator (key g + 8 (e / 2), columns 8 j + 2 c, + 1) as one
  // 4-byte pair.
  __device__ void store_key_gradients(int k_begin, int hk) {
    const int g = lane_ / 4, c = lane_ % 4;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int key = k0_ + 16 * key_group_ + g + 8 * r;
      if (key >= lk_rows_) continue;
      const int64_t row = static_cast<int64_t>(k_begin) + key;
      Elem* dk = static_cast<Elem*>(p_.dk) + row * p_.dk_stride_t + hk * p_.dk_stride_h + col_split_ * C::kDkCols;
      Elem* dv = static_cast<Elem*>(p_.dv) + row * p_.dv_stride_t + hk * p_.dv_stride_h + col_split_ * C::kDvCols;
#pragma unroll
      for (int j = 0; j < C::kDkCols / 8; ++j) {
        *reinterpret_cast<uint32_t*>(dk + 8 * j + 2 * c) =
            Ops::pack(dk_[j].d[2 * r] * p_.softmax_scale, dk_[j].d[2 * r + 1] * p_.softmax_scale);
      }
#pragma unroll
      for (int j = 0; j < C::kDvCols / 8; ++j) {
        *reinterpret_cast<uint32_t*>(dv + 8 * j + 2 * c) = Ops::pack(dv_[j].d[2 * r], dv_[j].d[2 * r + 1]);
      }
    }
  }

  const MhaBackwardParams& p_;
  unsigned char* const smem_;
  const uint32_t smem_base_;
  const bool aligned16_;
  const int tid_, warp_, lane_;
  const int key_group_, col_split_;
  int q_begin_ = 0, lq_ = 0, lk_ = 0, lq_rows_ = 0, lk_rows_ = 0, k0_ = 0;
  int seq_ = 0, key_tile_ = 0, num_m_ = 0, m_first_ = 0, h_first_ = 0;
  const Elem* k_src_ = nullptr;
  device::MmaFragC dk_[C::kDkCols / 8];
  device::MmaFragC dv_[C::kDvCols / 8];
};

// aligned16: dout, q, k and v rows all 16-byte aligned (base pointers and token / head strides).
template <typename Elem, typename C>
__global__ void __launch_bounds__(C::kThreads, C::kMinBlocks)
    mha_backward_portable_kernel(const __grid_constant__ MhaBackwardParams p, bool aligned16) {
  extern __shared__ __align__(128) unsigned char smem[];
  BackwardCta<Elem, C> cta(p, smem, aligned16);
  // Deterministic: the key tiles add into a query tile's dQ from the last to the first, and
  // launch in that order (the CTAs a CTA waits for come first). Causal, the walks then line
  // up along the diagonal: tile n reaches query tile m just after tile n + 1 is done with it.
  const int key_tile = p.deterministic ? static_cast<int>(gridDim.x - 1 - blockIdx.x) : static_cast<int>(blockIdx.x);
  for (int seq = blockIdx.z; seq < p.b; seq += gridDim.z) {
    for (int hk = blockIdx.y; hk < p.h_kv; hk += gridDim.y) cta.run(seq, hk, key_tile);
  }
}

template <typename Elem, typename C>
cudaError_t launch_backward(const MhaBackwardParams& p, cudaStream_t stream) {
  auto kernel = &mha_backward_portable_kernel<Elem, C>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmemBytes);
  if (err != cudaSuccess) return err;
  const dim3 grid = tiles_heads_batch_grid((static_cast<int64_t>(p.max_seqlen_k) + C::kKeys - 1) / C::kKeys, p.h_kv, p.b);
  const bool aligned16 = rows_aligned16(p.dout, p.dout_stride_t, p.dout_stride_h) &&
                         rows_aligned16(p.q, p.q_stride_t, p.q_stride_h) &&
                         rows_aligned16(p.k, p.k_stride_t, p.k_stride_h) &&
                         rows_aligned16(p.v, p.v_stride_t, p.v_stride_h);
  kernel<<<grid, C::kThreads, C::kSmemBytes, stream>>>(p, aligned16);
  return cudaGetLastError();
}

}  // namespace mlakit::detail::mha_portable

namespace mlakit::detail {

namespace mha_portable {
template <typename Elem, bool kBulkDq>
cudaError_t launch_backward_for_dims(const MhaBackwardParams& params, cudaStream_t stream) {
  const int dqk = params.d_qk, dv = params.d_v;
  if (dqk == 64 && dv == 64) return launch_backward<Elem, MhaBackwardConfig<64, 64, kBulkDq>>(params, stream);
  if (dqk == 128 && dv == 128) return launch_backward<Elem, MhaBackwardConfig<128, 128, kBulkDq>>(params, stream);
  if (dqk == 192 && dv == 128) return launch_backward<Elem, MhaBackwardConfig<192, 128, kBulkDq>>(params, stream);
  if (dqk == 256 && dv == 256) return launch_backward<Elem, MhaBackwardConfig<256, 256, kBulkDq>>(params, stream);
  return cudaErrorInvalidValue;  // the dispatch validated the pair: unreachable
}
}  // namespace mha_portable

template <typename Elem>
cudaError_t launch_mha_backward_main_portable(const MhaBackwardParams& params, cudaStream_t stream) {
  if (params.b <= 0 || params.max_seqlen_k <= 0) return cudaSuccess;  // no key row to write
  if (params.bulk_dq) return mha_portable::launch_backward_for_dims<Elem, true>(params, stream);
  return mha_portable::launch_backward_for_dims<Elem, false>(params, stream);
}

}  // namespace mlakit::detail
