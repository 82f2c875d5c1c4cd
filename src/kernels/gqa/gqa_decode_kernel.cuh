// The GQA decode kernel (docs/kernels/gqa_decode.md): attention of s_q <= 8 query tokens over
// a paged K/V cache in q's dtype, int8 or fp8, with this step's rows appended first.
// Portable (sm80 and newer: cp.async, mma.sync).
//
// Grid (num_parts, h_kv, row tiles), 128 threads. A CTA holds 16 query rows (token x head
// pairs) of one kv head, so each K/V byte it loads serves all of them, and walks the segments
// of its part of the planner's (sequence, key block) line (kernels/attention_rows.cuh). Per
// segment:
//   1. the append: each new token whose position lies in the segment is rotated, quantized
//      and stored by one warp (cache_append_row.cuh), before any load of the segment;
//   2. Q rows to shared memory, rotated;
//   3. 64-key tiles of K and V (and their scales) stream through a cp.async pipeline of 2-4
//      stages (common/gqa_decode_tiling.h); warp w takes keys 16w..16w+15 of every tile and
//      keeps its own online softmax and output (16 rows x d in mma accumulators), so the
//      warps never wait for each other within a segment;
//   4. the 4 warps' states are merged through shared memory and written as final rows (the
//      sequence has one split) or as a partial result for the combine.
// Scheduled key k of entry i is cache position start + k, start = L - scheduled length (a
// window caps the scheduled keys to the last ones, see gqa_decode_layout.cpp).
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "common/gqa_decode_tiling.h"
#include "common/rotary.h"
#include "device/cp_async.cuh"
#include "device/ldmatrix.cuh"
#include "device/mma_sm80.cuh"
#include "device/numeric.cuh"
#include "kernels/attention_rows.cuh"
#include "kernels/gqa/cache_append_row.cuh"
#include "kernels/gqa/cache_dequant.cuh"
#include "kernels/gqa/gqa_params.h"

namespace mlakit::detail {

template <typename Elem, typename CacheT, int D>
struct GqaDecodeTile {
  static constexpr int kCacheBytes = sizeof(CacheT);
  static constexpr bool kQuantized = kCacheBytes == 1;
  static constexpr int kRows = gqa_tiling::kRows;
  static constexpr int kKeys = gqa_tiling::kKeys;
  static constexpr int kWarps = gqa_tiling::kWarps;
  static constexpr int kThreads = gqa_tiling::kThreads;
  static constexpr int kKeysPerWarp = gqa_tiling::kKeysPerWarp;
  static constexpr int kStages = gqa_tiling::stage_count(kCacheBytes, D);
  static constexpr int kRawPitch = gqa_tiling::raw_pitch(kCacheBytes, D);  // bytes
  static constexpr int kElemPitch = gqa_tiling::elem_pitch(D);             // elements
  static constexpr int kChunksPerRow = D * kCacheBytes / 16;
  static constexpr int kSmemBytes = gqa_tiling::smem_bytes(kCacheBytes, D);
  static_assert(kThreads == 2 * kKeys, "a thread per key writes its K scale, another its V scale");
  static_assert(kKeys * kChunksPerRow % kThreads == 0, "whole chunks per thread");
  static_assert(kStages * gqa_tiling::stage_bytes(kCacheBytes, D) >= gqa_tiling::merge_bytes(D),
                "the merge buffer is aliased on the stages");

  // Shared-memory layout, byte offsets.
  static constexpr int kStageBytes = gqa_tiling::stage_bytes(kCacheBytes, D);
  // [stage][K scales 64 | V scales 64 | block ids 64], 4 bytes each
  static constexpr int kScalesOffset = kStages * kStageBytes;
  static constexpr int kQOffset = kScalesOffset + kStages * 3 * kKeys * 4;  // [16][pitch] Elem
  static constexpr int kDequantOffset = kQOffset + kRows * kElemPitch * 2;  // [warp][K | V][16][pitch]
  static constexpr int kStatsOffset = kDequantOffset + gqa_tiling::dequant_bytes(kCacheBytes, D);
  static_assert(kStatsOffset + 2 * kWarps * kRows * 4 == kSmemBytes, "layout matches gqa_tiling::smem_bytes");
};

template <typename Elem, typename CacheT, int D>
class GqaDecodeCta {
  using T = GqaDecodeTile<Elem, CacheT, D>;
  using Ops = device::ElemOps<Elem>;
  static constexpr int kValueTiles = D / 8;  // n-tiles of the output per warp

 public:
  __device__ GqaDecodeCta(const GqaDecodeParams& p, uint8_t* smem)
      : p_(p), c_(p.core), smem_(smem), hk_(blockIdx.y), row0_(blockIdx.z * T::kRows), tid_(threadIdx.x),
        warp_(threadIdx.x / 32), lane_(threadIdx.x % 32) {
    rows_here_ = min(T::kRows, c_.rows - row0_);
  }

  __device__ void run() {
    SegmentCursor cursor(c_, p_.schedule, p_.schedule.part_ranges[blockIdx.x]);
    Segment s;
    while (cursor.next(&s)) {
      if (p_.finished != nullptr && p_.finished[s.seq] != 0) continue;  // untouched, as the combine leaves it
      run_segment(s);
    }
  }

 private:
  // ---- shared memory -----------------------------------------------------------------------
  __device__ uint8_t* stage_k(int st) const { return smem_ + st * T::kStageBytes; }
  __device__ uint8_t* stage_v(int st) const { return stage_k(st) + T::kKeys * T::kRawPitch; }
  __device__ float* scales(int st) const { return reinterpret_cast<float*>(smem_ + T::kScalesOffset) + st * 3 * T::kKeys; }
  __device__ int32_t* key_ids(int st) const { return reinterpret_cast<int32_t*>(scales(st) + 2 * T::kKeys); }
  __device__ Elem* q_smem() const { return reinterpret_cast<Elem*>(smem_ + T::kQOffset); }
  __device__ Elem* dequant(int which) const {  // this warp's K (0) or V (1) tile
    return reinterpret_cast<Elem*>(smem_ + T::kDequantOffset) + (warp_ * 2 + which) * T::kKeysPerWarp * T::kElemPitch;
  }
  __device__ float* stat_max() const { return reinterpret_cast<float*>(smem_ + T::kStatsOffset); }
  __device__ float* stat_sum() const { return stat_max() + T::kWarps * T::kRows; }
  __device__ float* merge() const { return reinterpret_cast<float*>(smem_); }  // [warp][row][D]

  // ---- one segment -------------------------------------------------------------------------
  __device__ void run_segment(const Segment& s) {
    seq_ = s.seq;
    L_ = max(0, p_.cache_seqlens[s.seq]);
    start_ = L_ - s.L;  // s.L: the scheduled (window-capped) length
    key_end_ = s.key_end;
    if (p_.append.k_new != nullptr) append_new_rows(s);
    if (rows_here_ <= 0) return;  // no query rows (h_q 0): the append was all
    load_q();
    row_limits();
    reset_state();
    __syncthreads();  // the appended rows and Q are visible to every thread

    const int tiles = (s.key_end - s.key_begin + T::kKeys - 1) / T::kKeys;
    // Block ids of tiles 0 .. kStages - 1; later tiles' are loaded one iteration ahead.
#pragma unroll
    for (int st = 0; st < T::kStages; ++st) {
      if (tid_ < T::kKeys) key_ids(st)[tid_] = st < tiles ? tile_key_id(s.key_begin + st * T::kKeys) : kPastSegment;
    }
    __syncthreads();
#pragma unroll
    for (int st = 0; st < T::kStages - 1; ++st) {
      if (st < tiles) issue_tile(s.key_begin + st * T::kKeys, st);
      device::cp_async_commit();
    }
    for (int it = 0; it < tiles; ++it) {
      device::cp_async_wait_groups_but<T::kStages - 2>();
      __syncthreads();  // tile `it` landed for every thread; tile it - 1's stage is free
      const int next = it + T::kStages - 1;
      if (next < tiles) issue_tile(s.key_begin + next * T::kKeys, next % T::kStages);
      device::cp_async_commit();
      // The block ids of tile it + kStages (its slot is tile it's, whose copies were issued
      // kStages - 1 iterations ago): loaded now, stored after the compute hid the latency.
      const int ahead = it + T::kStages;
      const int32_t ahead_id =
          tid_ < T::kKeys && ahead < tiles ? tile_key_id(s.key_begin + ahead * T::kKeys) : kPastSegment;
      compute_tile(s.key_begin + it * T::kKeys, it % T::kStages);
      if (tid_ < T::kKeys) key_ids(it % T::kStages)[tid_] = ahead_id;
    }
    device::cp_async_wait_groups_but<0>();
    finish_segment(s);
  }

  // Step 1: the new tokens at positions [L - s_q, L) that fall in this segment's keys. Every
  // row tile of the kv head writes the same bytes (its own copy of the rows it reads next).
  __device__ void append_new_rows(const Segment& s) {
    const GqaAppend& a = p_.append;
    for (int item = warp_; item < 2 * c_.s_q; item += T::kWarps) {
      const int t = item / 2;
      const bool keys = item % 2 == 0;
      const int pos = L_ - c_.s_q + t;
      const int k = pos - start_;
      if (pos < 0 || k < s.key_begin || k >= s.key_end) continue;
      int64_t block;
      int page_row;
      if (!locate(pos, &block, &page_row)) continue;  // a bad block: the append is dropped
      const Elem* src = static_cast<const Elem*>(keys ? a.k_new : a.v_new) +
                        seq_ * (keys ? a.k_stride_b : a.v_stride_b) + t * (keys ? a.k_stride_s : a.v_stride_s) +
                        hk_ * (keys ? a.k_stride_h : a.v_stride_h);
      append_row_warp<Elem, CacheT, D>(src, p_.rope, keys && p_.rope.style != 0, pos,
                                       keys ? p_.k_cache : p_.v_cache, block, page_row, hk_, lane_);
    }
  }

  // The block-table entry of cache position pos; -1 past the table.
  __device__ int32_t block_id(int pos) const {
    const GqaPages& pg = p_.pages;
    const int logical = static_cast<int>(pg.page_divisor.quotient(static_cast<uint32_t>(pos)));
    return logical < pg.max_blocks_per_seq ? pg.block_table[seq_ * pg.block_table_stride_b + logical] : -1;
  }

  // The entry of this thread's key (tid < 64) of the tile at scheduled key k0, or
  // kPastSegment.
  static constexpr int32_t kPastSegment = -2;
  __device__ int32_t tile_key_id(int k0) const {
    const int k = k0 + tid_;
    return k < key_end_ ? block_id(start_ + k) : kPastSegment;
  }

  // Cache position pos with block-table entry `id` -> (block, row in the page); false for a
  // position past the table or an id outside [0, num_blocks): never dereferenced.
  __device__ bool locate(int pos, int32_t id, int64_t* block, int* page_row) const {
    if (id < 0 || id >= p_.pages.num_blocks) return false;
    *block = id;
    *page_row = pos - static_cast<int>(p_.pages.page_divisor.quotient(static_cast<uint32_t>(pos))) * p_.pages.page_size;
    return true;
  }
  __device__ bool locate(int pos, int64_t* block, int* page_row) const {
    return locate(pos, block_id(pos), block, page_row);
  }

  // Step 2: Q rows of this tile (rows past the kv head's rows are zero), rotated in float.
  __device__ void load_q() {
    const Elem* q = static_cast<const Elem*>(c_.q);
    Elem* dst = q_smem();
    for (int i = tid_; i < T::kRows * D; i += T::kThreads) {
      const int r = i / D, col = i % D;
      float v = 0.f;
      if (r < rows_here_) {
        const RowCoord rc = row_coord(c_, hk_, row0_ + r);
        const Elem* row = q + seq_ * c_.q_stride_b + rc.t * c_.q_stride_s + rc.head * c_.q_stride_h;
        v = static_cast<float>(row[col]);
        if (col < p_.rope.rotary_dim) {
          const RopePair pair = rope_pair(col, p_.rope.style, p_.rope.rotary_dim);
          float cs, sn;
          rope_cos_sin(L_ - c_.s_q + rc.t, pair.c, p_.rope.rotary_dim, p_.rope.log_theta, &cs, &sn);
          v = rope_rotate(v, static_cast<float>(row[pair.partner]), cs, sn, pair.first);
        }
      }
      dst[r * T::kElemPitch + col] = Ops::from_float(v);
    }
  }

  // Per thread, its two mma rows g and g + 8: the query position and visible positions.
  __device__ void row_limits() {
    for (int h = 0; h < 2; ++h) {
      const int r = lane_ / 4 + 8 * h;
      const bool valid = r < rows_here_;
      const RowCoord rc = row_coord(c_, hk_, row0_ + (valid ? r : 0));
      const int qpos = L_ - c_.s_q + rc.t;
      const int last = c_.causal ? qpos : L_ - 1;
      const int first = p_.window > 0 ? max(0, last - p_.window + 1) : 0;
      row_qpos_[h] = qpos;
      row_first_[h] = first;
      row_last_[h] = valid ? last : -1;  // an invalid row sees nothing
      row_slope_[h] = p_.alibi_slopes != nullptr && valid ? p_.alibi_slopes[rc.head] : 0.f;
    }
  }

  __device__ void reset_state() {
#pragma unroll
    for (int n = 0; n < kValueTiles; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_[n].d[e] = 0.f;
    }
    row_max_[0] = row_max_[1] = -INFINITY;
    row_sum_[0] = row_sum_[1] = 0.f;
  }

  // Step 3a: the cp.async loads of the tile of scheduled keys [k0, k0 + 64) into stage st,
  // from the block ids in key_ids(st). Consecutive threads copy consecutive 16-byte chunks of a
  // row, so a warp's copies cover whole 32-byte sectors and 128-byte lines (two threads per
  // row, half a row each, requested every sector twice and left the L2 busier than DRAM).
  // Thread tid < 64 writes key tid's K scale, tid >= 64 key tid - 64's V scale: 1 for 16-bit
  // caches, the stored per-token one, or the tensor's. Keys past the segment are zero rows with
  // scale 0; a key on a bad block is a zero row whose key scale is NaN, which turns exactly the
  // rows that see it into NaN rows.
  __device__ void issue_tile(int k0, int st) {
    constexpr int kCopies = T::kKeys * T::kChunksPerRow / T::kThreads;  // per thread, per cache
    const int32_t* ids = key_ids(st);
    const uint8_t* k_values = static_cast<const uint8_t*>(p_.k_cache.values);
    const uint8_t* v_values = static_cast<const uint8_t*>(p_.v_cache.values);
#pragma unroll
    for (int m = 0; m < kCopies; ++m) {
      const int i = tid_ + m * T::kThreads;
      const int key = i / T::kChunksPerRow, chunk = i % T::kChunksPerRow;
      int64_t block = 0;
      int page_row = 0;
      const bool ok = locate(start_ + k0 + key, ids[key], &block, &page_row);
      const int64_t k_byte = ok ? p_.k_cache.row(block, page_row, hk_) * T::kCacheBytes + chunk * 16 : 0;
      const int64_t v_byte = ok ? p_.v_cache.row(block, page_row, hk_) * T::kCacheBytes + chunk * 16 : 0;
      const int dst = key * T::kRawPitch + chunk * 16;
      device::cp_async_16_or_zero(device::smem_address(stage_k(st) + dst), k_values + k_byte, ok);
      device::cp_async_16_or_zero(device::smem_address(stage_v(st) + dst), v_values + v_byte, ok);
    }
    const int key = tid_ % T::kKeys, half = tid_ / T::kKeys;
    const int32_t id = ids[key];
    int64_t block = 0;
    int page_row = 0;
    const bool ok = locate(start_ + k0 + key, id, &block, &page_row);
    const GqaCacheView& cache = half == 0 ? p_.k_cache : p_.v_cache;
    float* scale_dst = scales(st) + half * T::kKeys + key;
    if (!ok) {
      *scale_dst = id != kPastSegment && half == 0 ? NAN : 0.f;
    } else if constexpr (T::kQuantized) {
      if (cache.scale_kind == GqaScaleKind::kPerToken) {
        device::cp_async_4(device::smem_address(scale_dst), cache.scale + cache.scale_index(block, page_row, hk_));
      } else {
        *scale_dst = tensor_scale_[half];
      }
    } else {
      *scale_dst = 1.f;
    }
  }

  // Step 3b: this warp's 16 keys of the tile in stage st.
  __device__ void compute_tile(int k0, int st) {
    const Elem* k_tile;
    const Elem* v_tile;
    int pitch;
    if constexpr (T::kQuantized) {
      dequantize_warp_keys(st);
      k_tile = dequant(0);
      v_tile = dequant(1);
      pitch = T::kElemPitch;
    } else {
      k_tile = reinterpret_cast<const Elem*>(stage_k(st)) + warp_ * T::kKeysPerWarp * (T::kRawPitch / 2);
      v_tile = reinterpret_cast<const Elem*>(stage_v(st)) + warp_ * T::kKeysPerWarp * (T::kRawPitch / 2);
      pitch = T::kRawPitch / 2;
    }
    float s[2][4];
    scores(k_tile, pitch, s);
    const float* k_scale = scales(st) + warp_ * T::kKeysPerWarp;
    const float* v_scale = scales(st) + T::kKeys + warp_ * T::kKeysPerWarp;
    uint32_t p[4];
    softmax(k0 + warp_ * T::kKeysPerWarp, k_scale, v_scale, s, p);
    accumulate(v_tile, pitch, p);
  }

  // Quantized caches: the warp's 16 K and 16 V rows, stored bytes -> Elem (exact, unscaled).
  __device__ void dequantize_warp_keys(int st) {
    constexpr int kChunks = 2 * T::kKeysPerWarp * T::kChunksPerRow;  // 16-byte chunks, K then V
#pragma unroll
    for (int i = lane_; i < kChunks; i += 32) {
      const int which = i / (T::kKeysPerWarp * T::kChunksPerRow);
      const int rest = i % (T::kKeysPerWarp * T::kChunksPerRow);
      const int row = rest / T::kChunksPerRow, chunk = rest % T::kChunksPerRow;
      const uint8_t* src = (which == 0 ? stage_k(st) : stage_v(st)) +
                           (warp_ * T::kKeysPerWarp + row) * T::kRawPitch + chunk * 16;
      uint4 a, b;
      stored16_to_elem<Elem, CacheT>(*reinterpret_cast<const uint4*>(src), &a, &b);
      Elem* dst = dequant(which) + row * T::kElemPitch + chunk * 16;
      reinterpret_cast<uint4*>(dst)[0] = a;
      reinterpret_cast<uint4*>(dst)[1] = b;
    }
    __syncwarp();
  }

  // S = Q K^T for 16 rows x 16 keys: two 16x8 accumulators (keys 0-7, 8-15).
  __device__ void scores(const Elem* k_tile, int pitch, float (&s)[2][4]) {
    device::MmaFragC c[2] = {};
    const uint32_t q_base = device::smem_address(q_smem());
    const uint32_t k_base = device::smem_address(k_tile);
    // ldmatrix rows: Q (rows lane % 8 + 8 (lane / 8 % 2), columns + 8 (lane / 16)); K (keys
    // lane % 8 + 8 (lane / 16), columns + 8 (lane / 8 % 2)): A and the two n-tiles' B.
    const int q_row = lane_ % 8 + 8 * (lane_ / 8 % 2), q_col = 8 * (lane_ / 16);
    const int k_row = lane_ % 8 + 8 * (lane_ / 16), k_col = 8 * (lane_ / 8 % 2);
#pragma unroll
    for (int kk = 0; kk < D; kk += 16) {
      uint32_t a[4], b[4];
      device::ldmatrix_x4(a, q_base + ((q_row * T::kElemPitch + kk + q_col) * 2));
      device::ldmatrix_x4(b, k_base + ((k_row * pitch + kk + k_col) * 2));
      const uint32_t b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
      device::mma_m16n8k16(a, b0, c[0], Elem{});
      device::mma_m16n8k16(a, b1, c[1], Elem{});
    }
#pragma unroll
    for (int j = 0; j < 2; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[j][e] = c[j].d[e];
    }
  }

  // Logits (scale, key scale, soft-cap, ALiBi, visibility) in log2 units, the online softmax
  // update of rows g and g + 8, and P (times each key's value scale) as the A fragment of P V.
  __device__ void softmax(int k_warp0, const float* k_scale, const float* v_scale, float (&s)[2][4],
                          uint32_t (&p)[4]) {
    const int c = lane_ % 4;
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < 2; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int h = e / 2, key = 8 * j + 2 * c + e % 2;
        const int k = k_warp0 + key, pos = start_ + k;
        float x = s[j][e] * (p_.scale * k_scale[key]);
        if (p_.softcap > 0.f) x = p_.softcap * tanhf(x / p_.softcap);
        x += row_slope_[h] * static_cast<float>(pos - row_qpos_[h]);
        const bool visible = k < key_end_ && pos >= row_first_[h] && pos <= row_last_[h];
        x = visible ? x * device::kLog2e : -INFINITY;
        s[j][e] = x;
        tile_max[h] = fmaxf(tile_max[h], x);
      }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 1));
      tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 2));
      const float m_new = fmaxf(row_max_[h], tile_max[h]);
      const float m_use = m_new == -INFINITY ? 0.f : m_new;  // nothing seen yet: all weights 0
      const float alpha = device::fast_exp2(row_max_[h] - m_use);
      row_max_[h] = m_new;
      row_sum_[h] *= alpha;
#pragma unroll
      for (int n = 0; n < kValueTiles; ++n) {
        acc_[n].d[2 * h] *= alpha;
        acc_[n].d[2 * h + 1] *= alpha;
      }
#pragma unroll
      for (int j = 0; j < 2; ++j) {
#pragma unroll
        for (int e = 2 * h; e < 2 * h + 2; ++e) {
          const float w = device::fast_exp2(s[j][e] - m_use);
          row_sum_[h] += w;
          s[j][e] = w * v_scale[8 * j + 2 * c + e % 2];
        }
      }
    }
    p[0] = Ops::pack(s[0][0], s[0][1]);
    p[1] = Ops::pack(s[0][2], s[0][3]);
    p[2] = Ops::pack(s[1][0], s[1][1]);
    p[3] = Ops::pack(s[1][2], s[1][3]);
  }

  // O += P V over the warp's 16 keys: V's B fragments by ldmatrix.trans (keys lane % 8 +
  // 8 (lane / 8 % 2), columns n + 8 (lane / 16)), two n-tiles per load.
  __device__ void accumulate(const Elem* v_tile, int pitch, const uint32_t (&p)[4]) {
    const uint32_t v_base = device::smem_address(v_tile);
    const int v_row = lane_ % 8 + 8 * (lane_ / 8 % 2), v_col = 8 * (lane_ / 16);
#pragma unroll
    for (int n = 0; n < D; n += 16) {
      uint32_t b[4];
      device::ldmatrix_x4_trans(b, v_base + ((v_row * pitch + n + v_col) * 2));
      const uint32_t b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
      device::mma_m16n8k16(p, b0, acc_[n / 8], Elem{});
      device::mma_m16n8k16(p, b1, acc_[n / 8 + 1], Elem{});
    }
  }

  // Step 4: merge the warps' (max, sum, output) per row and store.
  __device__ void finish_segment(const Segment& s) {
    const int g = lane_ / 4, c = lane_ % 4;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      row_sum_[h] += __shfl_xor_sync(0xffffffffu, row_sum_[h], 1);
      row_sum_[h] += __shfl_xor_sync(0xffffffffu, row_sum_[h], 2);
    }
    __syncthreads();  // every warp is done with the stages the merge buffer overlays
    if (c == 0) {
      stat_max()[warp_ * T::kRows + g] = row_max_[0];
      stat_max()[warp_ * T::kRows + g + 8] = row_max_[1];
      stat_sum()[warp_ * T::kRows + g] = row_sum_[0];
      stat_sum()[warp_ * T::kRows + g + 8] = row_sum_[1];
    }
    float* mine = merge() + warp_ * T::kRows * D;
#pragma unroll
    for (int n = 0; n < kValueTiles; ++n) {
      const int col = 8 * n + 2 * c;
      *reinterpret_cast<float2*>(mine + g * D + col) = make_float2(acc_[n].d[0], acc_[n].d[1]);
      *reinterpret_cast<float2*>(mine + (g + 8) * D + col) = make_float2(acc_[n].d[2], acc_[n].d[3]);
    }
    __syncthreads();

    const int splits = p_.schedule.split_prefix[s.seq + 1] - p_.schedule.split_prefix[s.seq];
    const bool final_rows = splits == 1;
    const int64_t partial_base =
        (static_cast<int64_t>(p_.schedule.partial_prefix[s.seq] + s.split) * c_.h_kv + hk_) * c_.rows + row0_;
    for (int i = tid_; i < rows_here_ * (D / 2); i += T::kThreads) {
      const int r = i / (D / 2), col = 2 * (i % (D / 2));
      float m = -INFINITY;
#pragma unroll
      for (int w = 0; w < T::kWarps; ++w) m = fmaxf(m, stat_max()[w * T::kRows + r]);
      float sum = 0.f, o0 = 0.f, o1 = 0.f;
      if (m != -INFINITY) {
#pragma unroll
        for (int w = 0; w < T::kWarps; ++w) {
          const float f = device::fast_exp2(stat_max()[w * T::kRows + r] - m);
          sum += stat_sum()[w * T::kRows + r] * f;
          const float2 o = *reinterpret_cast<const float2*>(merge() + (w * T::kRows + r) * D + col);
          o0 += o.x * f;
          o1 += o.y * f;
        }
        o0 /= sum;
        o1 /= sum;
      }
      const float lse2 = m == -INFINITY ? -INFINITY : m + log2f(sum);  // NaN stays NaN
      if (final_rows) {
        const RowCoord rc = row_coord(c_, hk_, row0_ + r);
        Elem* out = static_cast<Elem*>(c_.out) + s.seq * c_.out_stride_b + rc.t * c_.out_stride_s +
                    rc.head * c_.out_stride_h + col;
        *reinterpret_cast<uint32_t*>(out) = Ops::pack(o0, o1);
        if (col == 0 && c_.lse != nullptr) {
          c_.lse[s.seq * c_.lse_stride_b + rc.head * c_.lse_stride_h + rc.t * c_.lse_stride_s] =
              lse2 == -INFINITY ? INFINITY : lse2 * device::kLn2;
        }
      } else {
        *reinterpret_cast<float2*>(p_.schedule.partial_out + (partial_base + r) * D + col) = make_float2(o0, o1);
        if (col == 0) p_.schedule.partial_lse[partial_base + r] = lse2;
      }
    }
    __syncthreads();  // the merge buffer is the next segment's stages
  }

  const GqaDecodeParams& p_;
  const AttentionCore& c_;
  uint8_t* smem_;
  const int hk_, row0_, tid_, warp_, lane_;
  int rows_here_;
  float tensor_scale_[2] = {p_.k_cache.scale_kind == GqaScaleKind::kPerTensor ? p_.k_cache.scale[0] : 1.f,
                            p_.v_cache.scale_kind == GqaScaleKind::kPerTensor ? p_.v_cache.scale[0] : 1.f};
  // The segment.
  int seq_ = 0, L_ = 0, start_ = 0, key_end_ = 0;
  // Rows g and g + 8 of this thread's mma fragments.
  int row_qpos_[2], row_first_[2], row_last_[2];
  float row_slope_[2];
  float row_max_[2], row_sum_[2];
  device::MmaFragC acc_[kValueTiles];
};

template <typename Elem, typename CacheT, int D>
__global__ void __launch_bounds__(gqa_tiling::kThreads)
    gqa_decode_kernel(const __grid_constant__ GqaDecodeParams params) {
  extern __shared__ __align__(128) uint8_t smem[];
  GqaDecodeCta<Elem, CacheT, D>(params, smem).run();
}

}  // namespace mlakit::detail
