// Portable MHA prefill forward (any CUDA GPU of sm80 or newer; FlashAttention-2's schedule on
// mma.sync): the fallback of the Hopper kernel and its second reference. The contract is
// include/mlakit/mha_prefill.h; tiling and copies are in mha_prefill_tile.cuh.
//
// Grid (query row tiles of max_seqlen_q, h_q, b), 128 threads; y and z are capped at 65535
// and the CTA walks the rest (head += gridDim.y, sequence += gridDim.z). A CTA owns
// kRows = 64 query rows of one head of one sequence (a tile that starts past the sequence's
// Lq is skipped); warp w owns rows 16w..16w+15 and keeps their online softmax and their
// output (16 x d_v in mma accumulators), so the warps share only the K and V tiles.
//
// Per CTA: Q (64 rows, loaded once), then key tiles of kKeys keys up to the last key any
// of its rows sees (causal: tiles past the diagonal are never loaded). Single K and V buffers,
// FlashAttention-2's overlap: V(n) loads during S(n) and the softmax, K(n+1) during P V(n).
//   prologue: issue Q, K(0); commit
//   tile n:   wait all; __syncthreads   (K(n) landed; V's buffer free: P V(n-1) is done)
//             issue V(n); commit
//             S = Q K(n)^T, mask, online softmax -> P (registers)
//             wait all; __syncthreads   (V(n) landed; K's buffer free: every S(n) is done)
//             issue K(n+1) (if any); commit
//             O += P V(n)
//   epilogue: each warp stages its rows (q's dtype) in its own Q rows, then stores them.
// Rows past Lq and keys past Lk are zero-filled, never read (NaN may live there); keys past
// a row's limit are masked to -inf in the logits. The warps' mask and skip decisions are
// warp-uniform: a warp skips the MMAs of a tile none of its rows sees and masks only tiles
// that reach past some row's limit.
//
// Shared memory (Config): Q [64][d_qk] | K [kKeys][d_qk] | V [kKeys][d_v], all rows unpadded
// and 16-byte chunks swizzled within 128-byte lines (mha_prefill_tile.cuh, tile_offset): 24 KB
// (64, 64), 48 KB (128, 128), 64 KB (192, 128; 256, 256 with 32-key tiles).
// Registers per thread: O d_v / 2 floats, S kKeys / 2 floats, P kKeys / 4 packed pairs;
// budgets by Config::kMinBlocks (CUDA 13.0, sm80 and sm90a, no spills): (64, 64) 126-128,
// (128, 128) 168, (192, 128) 168, (256, 256) 242.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "device/cp_async.cuh"
#include "device/ldmatrix.cuh"
#include "device/mma_sm80.cuh"
#include "device/numeric.cuh"
#include "kernels/portable/launch.h"
#include "kernels/mha_prefill_params.h"
#include "kernels/portable/mha_prefill_tile.cuh"

namespace mlakit::detail::mha_portable {

template <typename Elem, typename C>
class PrefillCta {
  using Ops = device::ElemOps<Elem>;
  static_assert(sizeof(Elem) == C::kElemBytes, "16-bit elements");

 public:
  __device__ PrefillCta(const MhaPrefillParams& p, unsigned char* smem, bool aligned16)
      : p_(p),
        smem_(smem),
        smem_base_(device::smem_address(smem)),
        aligned16_(aligned16),
        tid_(threadIdx.x),
        warp_(threadIdx.x / 32),
        lane_(threadIdx.x % 32) {}

  // Query rows [tile * kRows, +kRows) of head h of sequence seq. CTA-uniform; ends with a
  // barrier, so the next call may reuse the shared memory.
  __device__ void run(int seq, int h, int tile) {
    q_begin_ = p_.cu_seqlens_q[seq];
    lq_ = p_.cu_seqlens_q[seq + 1] - q_begin_;
    const int k_begin = p_.cu_seqlens_k[seq];
    lk_ = p_.cu_seqlens_k[seq + 1] - k_begin;
    // Rows past max_seqlen_q (a length above it breaks the data rules) are left unwritten.
    stored_rows_ = min(lq_, p_.max_seqlen_q);
    row0_ = tile * C::kRows;
    if (row0_ >= stored_rows_) return;
    h_ = h;
    const int hk = h / p_.heads_per_kv;
    k_src_ = static_cast<const Elem*>(p_.k) + static_cast<int64_t>(k_begin) * p_.k_stride_t + hk * p_.k_stride_h;
    v_src_ = static_cast<const Elem*>(p_.v) + static_cast<int64_t>(k_begin) * p_.v_stride_t + hk * p_.v_stride_h;

    // Keys [0, key_end) cover every row's visible keys: those of the tile's last row.
    const int last_row = min(row0_ + C::kRows, lq_) - 1;
    const int key_end = max(row_key_limit(last_row), 0);
    const int num_tiles = (key_end + C::kKeys - 1) / C::kKeys;
    // The warp's rows see keys [0, warp_key_end_); those below warp_key_all_ are seen by all.
    const int warp_row = row0_ + C::kRowsPerWarp * warp_;
    warp_key_end_ = warp_row < lq_ ? row_key_limit(min(warp_row + C::kRowsPerWarp, lq_) - 1) : 0;
    warp_key_all_ = row_key_limit(warp_row);
    const int g = lane_ / 4;
    row_limit_[0] = row_key_limit(warp_row + g);
    row_limit_[1] = row_key_limit(warp_row + g + 8);
    reset_state();

    if (num_tiles > 0) {
      const Elem* q_src =
          static_cast<const Elem*>(p_.q) + static_cast<int64_t>(q_begin_ + row0_) * p_.q_stride_t + h * p_.q_stride_h;
      copy<C::kRows, C::kQkChunks>(C::kQOffset, q_src, p_.q_stride_t, lq_ - row0_);
      copy<C::kKeys, C::kQkChunks>(C::kKOffset, k_src_, p_.k_stride_t, lk_);
      device::cp_async_commit();
    }
    for (int n = 0; n < num_tiles; ++n) {
      const int k0 = n * C::kKeys;
      device::cp_async_wait_groups_but<0>();
      __syncthreads();
      copy<C::kKeys, C::kVChunks>(C::kVOffset, v_src_ + static_cast<int64_t>(k0) * p_.v_stride_t, p_.v_stride_t,
                                  lk_ - k0);
      device::cp_async_commit();
      const bool active = k0 < warp_key_end_;  // warp-uniform
      uint32_t pfrag[C::kKeys / 16][4];
      if (active) scores_and_softmax(k0, pfrag);
      device::cp_async_wait_groups_but<0>();
      __syncthreads();
      if (n + 1 < num_tiles) {
        const int k1 = k0 + C::kKeys;
        copy<C::kKeys, C::kQkChunks>(C::kKOffset, k_src_ + static_cast<int64_t>(k1) * p_.k_stride_t, p_.k_stride_t,
                                     lk_ - k1);
        device::cp_async_commit();
      }
      if (active) accumulate_values(pfrag);
    }
    store();
    __syncthreads();
  }

 private:
  // Exclusive bound of the keys query row t sees: Lk, causal min(Lk, t + 1 - (Lq - Lk))
  // (bottom-right aligned; <= 0: none). Lq - Lk first: no int overflow for t < Lq.
  __device__ int row_key_limit(int t) const {
    if (!p_.causal) return lk_;
    return min(lk_, t + 1 - (lq_ - lk_));
  }

  __device__ void reset_state() {
#pragma unroll
    for (int j = 0; j < C::kValueTiles; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_[j].d[e] = 0.f;
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      row_max_[r] = -INFINITY;
      row_sum_[r] = 0.f;
    }
  }

  // Rows [0, kTileRows) of a tile at shared offset `offset` from src (row stride `stride`);
  // rows >= valid are zeros (copy_rows). The alignment branch is CTA-uniform.
  template <int kTileRows, int kChunks>
  __device__ void copy(int offset, const Elem* src, int64_t stride, int valid) {
    copy_rows_aligned_as<Elem, kTileRows, kChunks, C::kThreads>(aligned16_, smem_base_ + offset, smem_ + offset, src,
                                                                stride, valid, tid_);
  }

  // S = Q K^T of the warp's 16 rows x kKeys keys, then the online softmax of rows g, g + 8;
  // P comes back as the A fragments of P V (one per 16 keys).
  //
  // mma.m16n8k16 fragments (PTX ISA 9.7.14.5.8; device/mma_sm80.cuh), g = lane / 4, c = lane % 4:
  //   A = Q rows, k = d: ldmatrix x4 of matrices (rows 0-7 | 8-15) x (cols 0-7 | 8-15), lane l
  //     addressing row l % 8 + 8 (l / 8 % 2), chunk l / 16: registers a0..a3 in A's order.
  //   B = K^T (k = d, n = key; "col": a key's d values contiguous, i.e. K's rows as stored):
  //     ldmatrix x4 of (keys 0-7, d 0-7), (keys 0-7, d 8-15), (keys 8-15, d 0-7),
  //     (keys 8-15, d 8-15), lane l addressing key l % 8 + 8 (l / 16), chunk l / 8 % 2:
  //     {b0, b1} of keys 0-7 and of keys 8-15.
  //   S accumulator s[j].d[e]: row g + 8 (e / 2), key 8 j + 2 c + e % 2.
  __device__ void scores_and_softmax(int k0, uint32_t (&pfrag)[C::kKeys / 16][4]) {
    device::MmaFragC s[C::kScoreTiles];
#pragma unroll
    for (int j = 0; j < C::kScoreTiles; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[j].d[e] = 0.f;
    }
    const int q_row = C::kRowsPerWarp * warp_ + lane_ % 8 + 8 * (lane_ / 8 % 2);
    const uint32_t q_lane = ldmatrix_lane_address(smem_base_ + C::kQOffset, q_row, lane_ / 16, C::kQkRowBytes);
    const uint32_t k_lane =
        ldmatrix_lane_address(smem_base_ + C::kKOffset, lane_ % 8 + 8 * (lane_ / 16), lane_ / 8 % 2, C::kQkRowBytes);
    // Unrolled by one 128-byte line (4 k16 steps): the swizzle XOR of ldmatrix_at stays a
    // constant, and the compiler hoists fewer addresses (d 128: a spill less at 168 registers).
#pragma unroll 4
    for (int kk = 0; kk < C::kDqk; kk += 16) {
      uint32_t a[4];
      device::ldmatrix_x4(a, ldmatrix_at(q_lane, kk));
#pragma unroll
      for (int nb = 0; nb < C::kKeys / 16; ++nb) {
        uint32_t b[4];
        device::ldmatrix_x4(b, ldmatrix_at(k_lane, kk) + nb * 16 * C::kQkRowBytes);
        device::mma_m16n8k16(a, {b[0], b[1]}, s[2 * nb], Elem{});
        device::mma_m16n8k16(a, {b[2], b[3]}, s[2 * nb + 1], Elem{});
      }
    }
    softmax(k0, s, pfrag);
  }

  // Online softmax in base 2 (logits x scale_log2) of this thread's elements of rows g, g + 8.
  // A row that has seen no visible key keeps max -inf; its weights are exp2(-inf - 0) = 0, so
  // nothing computes -inf - -inf. The row sums stay per lane until the epilogue.
  __device__ void softmax(int k0, device::MmaFragC (&s)[C::kScoreTiles], uint32_t (&pfrag)[C::kKeys / 16][4]) {
    const int c = lane_ % 4;
#pragma unroll
    for (int j = 0; j < C::kScoreTiles; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[j].d[e] *= p_.scale_log2;
    }
    if (k0 + C::kKeys > warp_key_all_) {  // some key of the tile is past some row's limit
#pragma unroll
      for (int j = 0; j < C::kScoreTiles; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = k0 + 8 * j + 2 * c + e % 2;
          if (key >= row_limit_[e / 2]) s[j].d[e] = -INFINITY;
        }
      }
    }
    float alpha[2], m_use[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float tile_max = -INFINITY;
#pragma unroll
      for (int j = 0; j < C::kScoreTiles; ++j) tile_max = fmaxf(tile_max, fmaxf(s[j].d[2 * r], s[j].d[2 * r + 1]));
      // The 4 lanes of a quad hold one row's columns.
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
      const float m_new = fmaxf(row_max_[r], tile_max);
      m_use[r] = m_new == -INFINITY ? 0.f : m_new;
      alpha[r] = device::fast_exp2(row_max_[r] - m_use[r]);
      row_max_[r] = m_new;
      row_sum_[r] *= alpha[r];
    }
    // O is rescaled only when a row maximum of the warp moved (after the first tiles, rarely).
    if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
      for (int j = 0; j < C::kValueTiles; ++j) {
        acc_[j].d[0] *= alpha[0];
        acc_[j].d[1] *= alpha[0];
        acc_[j].d[2] *= alpha[1];
        acc_[j].d[3] *= alpha[1];
      }
    }
#pragma unroll
    for (int j = 0; j < C::kScoreTiles; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[j].d[e] = device::fast_exp2(s[j].d[e] - m_use[e / 2]);
        row_sum_[e / 2] += s[j].d[e];
      }
    }
    // A fragment of keys 16 kb..: a0 = (g, 2c..) = s[2kb].d0,1; a1 = (g + 8, 2c..) = s[2kb].d2,3;
    // a2 = (g, 2c + 8..) = s[2kb + 1].d0,1; a3 = (g + 8, 2c + 8..) = s[2kb + 1].d2,3.
#pragma unroll
    for (int kb = 0; kb < C::kKeys / 16; ++kb) {
      pfrag[kb][0] = Ops::pack(s[2 * kb].d[0], s[2 * kb].d[1]);
      pfrag[kb][1] = Ops::pack(s[2 * kb].d[2], s[2 * kb].d[3]);
      pfrag[kb][2] = Ops::pack(s[2 * kb + 1].d[0], s[2 * kb + 1].d[1]);
      pfrag[kb][3] = Ops::pack(s[2 * kb + 1].d[2], s[2 * kb + 1].d[3]);
    }
  }

  // O += P V. B = V (k = key, n = d): a lane's pair runs along keys, across V's stored rows,
  // hence ldmatrix.trans of (keys 0-7, d 0-7), (keys 8-15, d 0-7), (keys 0-7, d 8-15),
  // (keys 8-15, d 8-15), lane l addressing key l % 8 + 8 (l / 8 % 2), chunk l / 16: {b0, b1}
  // of O's n-tiles d.. and d + 8...
  __device__ void accumulate_values(const uint32_t (&pfrag)[C::kKeys / 16][4]) {
    const uint32_t v_lane =
        ldmatrix_lane_address(smem_base_ + C::kVOffset, lane_ % 8 + 8 * (lane_ / 8 % 2), lane_ / 16, C::kVRowBytes);
#pragma unroll
    for (int kb = 0; kb < C::kKeys / 16; ++kb) {
#pragma unroll
      for (int n = 0; n < C::kDv; n += 16) {
        uint32_t b[4];
        device::ldmatrix_x4_trans(b, ldmatrix_at(v_lane, n) + kb * 16 * C::kVRowBytes);
        device::mma_m16n8k16(pfrag[kb], {b[0], b[1]}, acc_[n / 8], Elem{});
        device::mma_m16n8k16(pfrag[kb], {b[2], b[3]}, acc_[n / 8 + 1], Elem{});
      }
    }
  }

  // Normalised rows in q's dtype and the natural-log LSE (+inf, out 0 for a row that saw no
  // key). The warp stages its 16 rows in its own Q rows (only it reads them, and its last
  // ldmatrix of them is done) and stores whole rows: 16-byte stores, or 4-byte ones when the
  // layout is only 4-byte aligned. Rows past Lq (or max_seqlen_q) are not written.
  __device__ void store() {
    const int g = lane_ / 4, c = lane_ % 4;
    float inv_sum[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float sum = row_sum_[r];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      const bool empty = row_max_[r] == -INFINITY;
      inv_sum[r] = empty ? 0.f : 1.f / sum;
      const int t = row0_ + C::kRowsPerWarp * warp_ + g + 8 * r;
      if (p_.lse != nullptr && c == 0 && t < stored_rows_) {
        const float lse = empty ? INFINITY : (row_max_[r] + log2f(sum)) * device::kLn2;
        p_.lse[h_ * p_.lse_stride_h + static_cast<int64_t>(q_begin_ + t) * p_.lse_stride_t] = lse;
      }
    }
    const int warp_rows = C::kRowsPerWarp * warp_;
    unsigned char* stage_ptr = smem_ + C::kQOffset + warp_rows * C::kQkRowBytes;
#pragma unroll
    for (int j = 0; j < C::kValueTiles; ++j) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        // acc_[j].d[2r], d[2r + 1]: row g + 8 r, columns 8 j + 2 c, + 1 (chunk j, byte 4 c).
        const uint32_t offset = tile_offset(g + 8 * r, j, C::kQkRowBytes) + 4 * c;
        *reinterpret_cast<uint32_t*>(stage_ptr + offset) =
            Ops::pack(acc_[j].d[2 * r] * inv_sum[r], acc_[j].d[2 * r + 1] * inv_sum[r]);
      }
    }
    __syncwarp();
    Elem* out = static_cast<Elem*>(p_.out) + h_ * p_.out_stride_h;
    static_assert(C::kRowsPerWarp * C::kVChunks % 32 == 0, "whole chunks per lane");
#pragma unroll
    for (int m = 0; m < C::kRowsPerWarp * C::kVChunks / 32; ++m) {
      const int i = lane_ + 32 * m;
      const int r = i / C::kVChunks, chunk = i % C::kVChunks;
      const int t = row0_ + warp_rows + r;
      if (t >= stored_rows_) continue;
      const uint4 v = *reinterpret_cast<const uint4*>(stage_ptr + tile_offset(r, chunk, C::kQkRowBytes));
      Elem* dst = out + static_cast<int64_t>(q_begin_ + t) * p_.out_stride_t + chunk * C::kChunkElems;
      if (aligned16_) {
        *reinterpret_cast<uint4*>(dst) = v;
      } else {
        uint32_t* dst32 = reinterpret_cast<uint32_t*>(dst);
        dst32[0] = v.x;
        dst32[1] = v.y;
        dst32[2] = v.z;
        dst32[3] = v.w;
      }
    }
  }

  const MhaPrefillParams& p_;
  unsigned char* const smem_;
  const uint32_t smem_base_;
  const bool aligned16_;
  const int tid_, warp_, lane_;
  int q_begin_ = 0, lq_ = 0, lk_ = 0, stored_rows_ = 0, row0_ = 0, h_ = 0;
  int warp_key_end_ = 0, warp_key_all_ = 0;
  int row_limit_[2] = {0, 0};    // rows g, g + 8 of the warp: exclusive key bound
  const Elem* k_src_ = nullptr;  // key 0 of the sequence, the CTA's kv head
  const Elem* v_src_ = nullptr;
  device::MmaFragC acc_[C::kValueTiles];
  float row_max_[2] = {-INFINITY, -INFINITY};  // log2 domain, rows g, g + 8
  float row_sum_[2] = {0.f, 0.f};              // this lane's columns only
};

// aligned16: q, k, v and out rows all 16-byte aligned (base pointers and token / head strides).
template <typename Elem, typename C>
__global__ void __launch_bounds__(C::kThreads, C::kMinBlocks)
    mha_prefill_portable_kernel(const __grid_constant__ MhaPrefillParams p, bool aligned16) {
  extern __shared__ __align__(128) unsigned char smem[];
  PrefillCta<Elem, C> cta(p, smem, aligned16);
  for (int seq = blockIdx.z; seq < p.b; seq += gridDim.z) {
    for (int h = blockIdx.y; h < p.h_q; h += gridDim.y) cta.run(seq, h, blockIdx.x);
  }
}

template <typename Elem, typename C>
cudaError_t launch(const MhaPrefillParams& p, cudaStream_t stream) {
  auto kernel = &mha_prefill_portable_kernel<Elem, C>;
  // Idempotent and cheap; not a stream operation, so it is allowed during graph capture.
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmemBytes);
  if (err != cudaSuccess) return err;
  const dim3 grid = tiles_heads_batch_grid((static_cast<int64_t>(p.max_seqlen_q) + C::kRows - 1) / C::kRows, p.h_q, p.b);
  const bool aligned16 =
      rows_aligned16(p.q, p.q_stride_t, p.q_stride_h) && rows_aligned16(p.k, p.k_stride_t, p.k_stride_h) &&
      rows_aligned16(p.v, p.v_stride_t, p.v_stride_h) && rows_aligned16(p.out, p.out_stride_t, p.out_stride_h);
  kernel<<<grid, C::kThreads, C::kSmemBytes, stream>>>(p, aligned16);
  return cudaGetLastError();
}

}  // namespace mlakit::detail::mha_portable

namespace mlakit::detail {

template <typename Elem>
cudaError_t launch_mha_prefill_portable(const MhaPrefillParams& params, cudaStream_t stream) {
  if (params.b <= 0 || params.h_q <= 0 || params.max_seqlen_q <= 0) return cudaSuccess;  // nothing to do
  using mha_portable::Config;
  using mha_portable::launch;
  if (params.d_qk == 64 && params.d_v == 64) return launch<Elem, Config<64, 64>>(params, stream);
  if (params.d_qk == 128 && params.d_v == 128) return launch<Elem, Config<128, 128>>(params, stream);
  if (params.d_qk == 192 && params.d_v == 128) return launch<Elem, Config<192, 128>>(params, stream);
  if (params.d_qk == 256 && params.d_v == 256) return launch<Elem, Config<256, 256>>(params, stream);
  return cudaErrorInvalidValue;  // the dispatch validated the pair: unreachable
}

}  // namespace mlakit::detail
