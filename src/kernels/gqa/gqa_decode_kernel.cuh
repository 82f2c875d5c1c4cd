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

#include <climits>
#include <cmath>
#include <cstdint>
#include <type_traits>

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
  static constexpr int kRowBytes = gqa_tiling::row_bytes(kCacheBytes, D);
  static constexpr int kElemPitch = gqa_tiling::elem_pitch(D);             // elements
  static constexpr int kChunksPerRow = D * kCacheBytes / 16;
  static constexpr int kSmemBytes = gqa_tiling::smem_bytes(kCacheBytes, D);
  static_assert(kThreads == 2 * kKeys, "a thread per key writes its K scale, another its V scale");
  static_assert(kKeys * kChunksPerRow % kThreads == 0, "whole chunks per thread");
  static_assert(kStages * gqa_tiling::stage_bytes(kCacheBytes, D) >= gqa_tiling::merge_bytes(D),
                "the merge buffer is aliased on the stages");
  static_assert(kRowBytes % 64 == 0 && kKeysPerWarp * kRowBytes % 1024 == 0,
                "a warp's rows, the V tile and every stage start where the swizzle starts over");

  // A K or V tile in shared memory: byte b of row r at tile offset swizzled(r kRowBytes + b),
  // the 16-byte chunks of every 128-byte line XOR-permuted by the line's index modulo 8. The 8
  // rows of one ldmatrix matrix (consecutive keys, the same columns) then fall in 8 different
  // bank groups with no padding, and every 128-byte line of a row stays whole: a quarter warp's
  // cp.async of one global line writes one shared line. (Rows padded by 16 bytes broke that
  // alignment, and the L2 saw 1.5 sector requests per sector of K and V.)
  __device__ static uint32_t swizzled(uint32_t offset) { return offset ^ ((offset >> 3) & 0x70); }
  // The address of byte line_byte + in_line of `row` in the tile at `tile` (128-byte aligned;
  // line_byte a multiple of 128, in_line a multiple of 16 below min(128, kRowBytes)) is
  // line_address(tile, row, line_byte) ^ in_line: in a loop unrolled over columns the line
  // address is computed once per lane and line, the in-line part is an immediate.
  __device__ static uint32_t line_address(uint32_t tile, int row, int line_byte) {
    return tile + swizzled(static_cast<uint32_t>(row * kRowBytes + line_byte));
  }

  // Shared-memory layout, byte offsets.
  static constexpr int kStageBytes = gqa_tiling::stage_bytes(kCacheBytes, D);
  static constexpr int kScalesOffset = kStages * kStageBytes;              // [stage][K 64 | V 64] float
  static constexpr int kLocationsOffset = kScalesOffset + kStages * 2 * kKeys * 4;  // [stage][64] KeyLocation
  static constexpr int kQOffset = kLocationsOffset + kStages * kKeys * gqa_tiling::kKeyLocationBytes;
  static constexpr int kStatsOffset = kQOffset + kRows * kElemPitch * 2;
  static_assert(kStatsOffset + 2 * kWarps * kRows * 4 + kRows * 4 == kSmemBytes, "layout matches gqa_tiling::smem_bytes");
};

// Where one key of a staged tile lives: the element offset of its K row (kv head included),
// its block (or kBadBlock / kPastSegment) and its row in the page; computed once per key.
struct GqaKeyLocation {
  int64_t k_row;
  int32_t block;
  int32_t page_row;
};
static_assert(sizeof(GqaKeyLocation) == gqa_tiling::kKeyLocationBytes, "the tiling's size of a location");

template <typename Elem, typename CacheT, int D>
class GqaDecodeCta {
  using T = GqaDecodeTile<Elem, CacheT, D>;
  using Ops = device::ElemOps<Elem>;
  // P V of a quantized cache runs in fp16 whatever q's type: the stored values convert to it
  // exactly and P (times the value scale, see softmax) keeps 11 significant bits, not 8.
  // Q K^T too, with bf16 q rows scaled by a power of two into fp16's range (exact, see
  // scale_q_rows): the stored keys convert to fp16 in two instructions per pair, to bf16 in
  // five.
  using PvElem = std::conditional_t<T::kQuantized, __half, Elem>;
  using QkElem = PvElem;
  static constexpr bool kScaledQ = T::kQuantized && !std::is_same_v<Elem, __half>;
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
  __device__ uint8_t* stage_v(int st) const { return stage_k(st) + T::kKeys * T::kRowBytes; }
  __device__ float* scales(int st) const { return reinterpret_cast<float*>(smem_ + T::kScalesOffset) + st * 2 * T::kKeys; }
  __device__ GqaKeyLocation* key_locations(int st) const {
    return reinterpret_cast<GqaKeyLocation*>(smem_ + T::kLocationsOffset) + st * T::kKeys;
  }
  __device__ Elem* q_smem() const { return reinterpret_cast<Elem*>(smem_ + T::kQOffset); }
  __device__ float* stat_max() const { return reinterpret_cast<float*>(smem_ + T::kStatsOffset); }
  __device__ float* stat_sum() const { return stat_max() + T::kWarps * T::kRows; }
  __device__ float* q_unscale() const { return stat_sum() + T::kWarps * T::kRows; }  // [16], see scale_q_rows
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
    reset_state();
    const int tiles = (s.key_end - s.key_begin + T::kKeys - 1) / T::kKeys;
    // Key locations of tiles 0 .. kStages - 1; later tiles' are staged one iteration ahead.
#pragma unroll
    for (int st = 0; st < T::kStages; ++st) {
      if (tid_ < T::kKeys) {
        const int k0 = s.key_begin + st * T::kKeys;
        key_locations(st)[tid_] = key_location(k0, st < tiles ? tile_block_id(k0) : kPastSegment);
      }
    }
    __syncthreads();  // the appended rows, Q and the locations are visible to every thread
    if constexpr (kScaledQ) {
      scale_q_rows();
      __syncthreads();
    }
    row_limits();
#pragma unroll
    for (int st = 0; st < T::kStages - 1; ++st) {
      if (st < tiles) issue_tile(st);
      device::cp_async_commit();
    }
    for (int it = 0; it < tiles; ++it) {
      device::cp_async_wait_groups_but<T::kStages - 2>();
      __syncthreads();  // tile `it` landed for every thread; tile it - 1's stage is free
      const int next = it + T::kStages - 1;
      if (next < tiles) issue_tile(next % T::kStages);
      device::cp_async_commit();
      // The locations of tile it + kStages (its slot is tile it's, whose copies were issued
      // kStages - 1 iterations ago): block ids loaded now, stored after the compute hid the
      // latency.
      const int ahead = it + T::kStages, ahead_k0 = s.key_begin + ahead * T::kKeys;
      const int32_t ahead_id = tid_ < T::kKeys && ahead < tiles ? tile_block_id(ahead_k0) : kPastSegment;
      compute_tile(s.key_begin + it * T::kKeys, it % T::kStages);
      if (tid_ < T::kKeys) key_locations(it % T::kStages)[tid_] = key_location(ahead_k0, ahead_id);
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
      // Both calls inline: a reference chosen at run time between two kernel parameters
      // would copy both to the stack.
      if (keys) {
        append_row_warp<Elem, CacheT, D>(src, p_.rope, p_.rope.style != 0, pos, p_.k_cache, block, page_row, hk_, lane_);
      } else {
        append_row_warp<Elem, CacheT, D>(src, p_.rope, false, pos, p_.v_cache, block, page_row, hk_, lane_);
      }
    }
  }

  // The block-table entry of cache position pos; -1 past the table.
  __device__ int32_t block_id(int pos) const {
    const GqaPages& pg = p_.pages;
    const int logical = static_cast<int>(pg.page_divisor.quotient(static_cast<uint32_t>(pos)));
    return logical < pg.max_blocks_per_seq ? pg.block_table[seq_ * pg.block_table_stride_b + logical] : -1;
  }

  // The block-table entry of this thread's key (tid < 64) of the tile at scheduled key k0, or
  // kPastSegment; and the key's location from it.
  static constexpr int32_t kBadBlock = -1, kPastSegment = -2;
  __device__ int32_t tile_block_id(int k0) const {
    const int k = k0 + tid_;
    return k < key_end_ ? block_id(start_ + k) : kPastSegment;
  }
  __device__ GqaKeyLocation key_location(int k0, int32_t id) const {
    GqaKeyLocation loc{0, id == kPastSegment ? kPastSegment : kBadBlock, 0};
    int64_t block;
    int page_row;
    if (id != kPastSegment && locate(start_ + k0 + tid_, id, &block, &page_row)) {
      loc.k_row = p_.k_cache.row(block, page_row, hk_);
      loc.block = static_cast<int32_t>(block);
      loc.page_row = page_row;
    }
    return loc;
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
      dst[r * T::kElemPitch + q_column(col)] = Ops::from_float(v);
    }
  }

  // Where Q's column col is stored. With a quantized cache, a lane's key fragment holds the
  // 4 consecutive stored values 4c..4c+3 of a 16-column group (ldmatrix of bytes, see
  // scores), which the mma takes as its k indices 2c, 2c + 1, 2c + 8, 2c + 9; Q's columns are
  // stored in that order so that ldmatrix hands every lane the matching values.
  __device__ static int q_column(int col) {
    if constexpr (!T::kQuantized) return col;
    const int group = col & ~15, c = (col & 15) / 4, j = col & 3;
    return group + (j < 2 ? 2 * c + j : 8 + 2 * c + j - 2);
  }

  // bf16 q over a quantized cache: each Q row (bf16, as rounded by load_q) times 2^s, stored
  // in place as fp16, with s chosen so that the row's largest |value| lies in [2^14, 2^15).
  // Every bf16 value within 2^-24 of the row's largest converts exactly (fp16 has 11
  // significant bits to bf16's 8), so S = Q K^T in fp16 equals the bf16 product up to
  // values far below bf16's own rounding; the logits are multiplied by 2^-s
  // (q_unscale). Warp w scales rows 4w..4w+3.
  __device__ void scale_q_rows() {
    static_assert(T::kRows == 4 * T::kWarps, "four rows per warp");
    constexpr int kPerLane = D / 32;
    for (int r = 4 * warp_; r < 4 * warp_ + 4; ++r) {
      Elem* row = q_smem() + r * T::kElemPitch;
      float x[kPerLane];
      int e = 0;
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) {
        x[i] = static_cast<float>(row[lane_ * kPerLane + i]);
        e = max(e, biased_exponent(x[i]));
      }
#pragma unroll
      for (int offset = 16; offset > 0; offset /= 2) e = max(e, __shfl_xor_sync(0xffffffffu, e, offset));
      // e 0: a zero row; e 255: inf or NaN, which stay what they are.
      const int shift = min(141 - e, 126);
      const float up = power_of_two(shift);
      __syncwarp();  // every lane has read the row before any overwrites it
      __half* out = reinterpret_cast<__half*>(row);
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) out[lane_ * kPerLane + i] = __float2half_rn(x[i] * up);
      if (lane_ == 0) q_unscale()[r] = power_of_two(-shift);
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
      row_valid_[h] = valid;
      row_slope_[h] = p_.alibi_slopes != nullptr && valid ? p_.alibi_slopes[rc.head] : 0.f;
      row_logit_scale_[h] = kScaledQ ? p_.scale * q_unscale()[r] : p_.scale;
    }
    // The positions every valid row of the tile sees (the same 16 rows in every warp): a tile
    // of keys inside them needs no mask.
    int first = valid_first(0), last = valid_last(0);
    first = max(first, valid_first(1));
    last = min(last, valid_last(1));
#pragma unroll
    for (int offset = 16; offset >= 4; offset /= 2) {
      first = max(first, __shfl_xor_sync(0xffffffffu, first, offset));
      last = min(last, __shfl_xor_sync(0xffffffffu, last, offset));
    }
    all_first_ = first;
    all_last_ = last;
  }
  __device__ int valid_first(int h) const { return row_valid_[h] ? row_first_[h] : INT_MIN; }
  __device__ int valid_last(int h) const { return row_valid_[h] ? row_last_[h] : INT_MAX; }

  __device__ void reset_state() {
#pragma unroll
    for (int n = 0; n < kValueTiles; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_[n].d[e] = 0.f;
    }
    row_max_[0] = row_max_[1] = -INFINITY;
    row_sum_[0] = row_sum_[1] = 0.f;
    v_exponent_ = kMinExponent;
  }

  // Step 3a: the cp.async loads of a tile of 64 keys into stage st, from the key locations
  // staged for it. Consecutive threads copy consecutive 16-byte chunks of a
  // row, so a warp's copies cover whole 32-byte sectors and 128-byte lines (two threads per
  // row, half a row each, requested every sector twice and left the L2 busier than DRAM).
  // Thread tid < 64 writes key tid's K scale, tid >= 64 key tid - 64's V scale: 1 for 16-bit
  // caches, the stored per-token one, or the tensor's. Keys past the segment are zero rows with
  // scale 0; a key on a bad block is a zero row whose key scale is NaN, which turns exactly the
  // rows that see it into NaN rows.
  __device__ void issue_tile(int st) {
    const GqaKeyLocation* locations = key_locations(st);
    if (same_layout_) {
      copy_rows<true>(locations, st);
    } else {
      copy_rows<false>(locations, st);
    }
    const int key = tid_ % T::kKeys, half = tid_ / T::kKeys;
    const GqaKeyLocation loc = locations[key];
    float* scale_dst = scales(st) + half * T::kKeys + key;
    if (loc.block < 0) {
      *scale_dst = loc.block == kBadBlock && half == 0 ? NAN : 0.f;
    } else if constexpr (T::kQuantized) {
      // Field by field: a reference to one of the two cache parameters would copy both to
      // the stack.
      const GqaScaleKind kind = half == 0 ? p_.k_cache.scale_kind : p_.v_cache.scale_kind;
      if (kind == GqaScaleKind::kPerToken) {
        const float* scale = half == 0 ? p_.k_cache.scale + p_.k_cache.scale_index(loc.block, loc.page_row, hk_)
                                       : p_.v_cache.scale + p_.v_cache.scale_index(loc.block, loc.page_row, hk_);
        device::cp_async_4(device::smem_address(scale_dst), scale);
      } else {
        *scale_dst = half == 0 ? tensor_scale_[0] : tensor_scale_[1];  // a run-time index would put the object on the stack
      }
    } else {
      *scale_dst = 1.f;
    }
  }

  // The K and V rows of the tile: thread t copies chunk t % kChunksPerRow of keys
  // t / kChunksPerRow + m kKeyStep. A location that is not a key's has k_row 0, a valid
  // address for the zero-filling copy.
  template <bool kSameLayout>
  __device__ void copy_rows(const GqaKeyLocation* locations, int st) {
    static_assert(T::kThreads % T::kChunksPerRow == 0, "a thread's chunk is the same in every row it copies");
    constexpr int kKeyStep = T::kThreads / T::kChunksPerRow;
    constexpr int kCopies = T::kKeys / kKeyStep;  // per thread, per cache
    const int chunk = tid_ % T::kChunksPerRow, key0 = tid_ / T::kChunksPerRow;
    const uint8_t* k_src = static_cast<const uint8_t*>(p_.k_cache.values) + chunk * 16;
    const uint8_t* v_src = static_cast<const uint8_t*>(p_.v_cache.values) + chunk * 16;
    static_assert(kKeyStep * T::kRowBytes % 1024 == 0, "a thread's chunk has the same swizzle in every row it copies");
    const uint32_t dst = T::swizzled(key0 * T::kRowBytes + chunk * 16);
    const uint32_t k_dst = device::smem_address(stage_k(st)) + dst;
    const uint32_t v_dst = device::smem_address(stage_v(st)) + dst;
#pragma unroll
    for (int m = 0; m < kCopies; ++m) {
      const GqaKeyLocation loc = locations[key0 + m * kKeyStep];
      const bool ok = loc.block >= 0;
      const int64_t v_row = kSameLayout ? loc.k_row : (ok ? p_.v_cache.row(loc.block, loc.page_row, hk_) : 0);
      const uint32_t offset = m * kKeyStep * T::kRowBytes;
      device::cp_async_16_or_zero(k_dst + offset, k_src + loc.k_row * T::kCacheBytes, ok);
      device::cp_async_16_or_zero(v_dst + offset, v_src + v_row * T::kCacheBytes, ok);
    }
  }

  // Step 3b: this warp's 16 keys of the tile in stage st.
  __device__ void compute_tile(int k0, int st) {
    const uint32_t k_tile = device::smem_address(stage_k(st) + warp_ * T::kKeysPerWarp * T::kRowBytes);
    const uint32_t v_tile = device::smem_address(stage_v(st) + warp_ * T::kKeysPerWarp * T::kRowBytes);
    float s[2][4];
    scores(k_tile, s);
    const float* k_scale = scales(st) + warp_ * T::kKeysPerWarp;
    const float* v_scale = scales(st) + T::kKeys + warp_ * T::kKeysPerWarp;
    uint32_t p[4];
    softmax(k0 + warp_ * T::kKeysPerWarp, k_scale, v_scale, s, p);
    accumulate(v_tile, p);
  }

  // S = Q K^T for 16 rows x 16 keys: two 16x8 accumulators (keys 0-7, 8-15). Q by ldmatrix
  // (rows lane % 8 + 8 (lane / 8 % 2), columns + 8 (lane / 16)).
  // Every kSumGroup values of d the accumulators are added into s (a rounded float add) and
  // restart from zero: the tensor cores' float32 accumulation truncates at every k-step
  // relative to the running sum, so its error grows with the number of steps, and a logit
  // near zero (a one-key row's LSE) missed the reference by 1.1e-6 at d = 256.
  static constexpr int kSumGroup = 64;
  __device__ void scores(uint32_t k_tile, float (&s)[2][4]) {
    static_assert(D % kSumGroup == 0, "whole groups");
    device::MmaFragC c[2] = {};
#pragma unroll
    for (int j = 0; j < 2; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[j][e] = 0.f;
    }
    const auto add_group = [&](int done) {  // done: values of d summed so far
      if (done % kSumGroup != 0) return;
#pragma unroll
      for (int j = 0; j < 2; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          s[j][e] += c[j].d[e];
          c[j].d[e] = 0.f;
        }
      }
    };
    const uint32_t q_base = device::smem_address(q_smem());
    const int q_row = lane_ % 8 + 8 * (lane_ / 8 % 2), q_col = 8 * (lane_ / 16);
    if constexpr (T::kQuantized) {
      // ldmatrix of the stored bytes: a matrix is 8 keys x 16 values, lane's register the
      // values 4c..4c+3 of key g, converted exactly to the two B registers of one n-tile
      // (Q's columns are stored to match, q_column). Matrices: keys 0-7 / 8-15 (lane / 8 % 2)
      // of values kk.. / kk + 16.. (lane / 16).
      const int k_row = lane_ % 8 + 8 * (lane_ / 8 % 2), k_byte = 16 * (lane_ / 16);
#pragma unroll
      for (int kk = 0; kk < D; kk += 32) {
        uint32_t a0[4], a1[4], b[4];
        device::ldmatrix_x4(a0, q_base + ((q_row * T::kElemPitch + kk + q_col) * 2));
        device::ldmatrix_x4(a1, q_base + ((q_row * T::kElemPitch + kk + 16 + q_col) * 2));
        device::ldmatrix_x4(b, (T::line_address(k_tile, k_row, kk & ~127) ^ k_byte) ^ (kk & 127));
        const uint2 b0 = stored4_to_f16<CacheT>(b[0]), b1 = stored4_to_f16<CacheT>(b[1]);
        const uint2 b2 = stored4_to_f16<CacheT>(b[2]), b3 = stored4_to_f16<CacheT>(b[3]);
        device::mma_m16n8k16(a0, {b0.x, b0.y}, c[0], QkElem{});
        device::mma_m16n8k16(a0, {b1.x, b1.y}, c[1], QkElem{});
        device::mma_m16n8k16(a1, {b2.x, b2.y}, c[0], QkElem{});
        device::mma_m16n8k16(a1, {b3.x, b3.y}, c[1], QkElem{});
        add_group(kk + 32);
      }
    } else {
      // K by ldmatrix (keys lane % 8 + 8 (lane / 16), columns + 8 (lane / 8 % 2)): the two
      // n-tiles' B fragments.
      const int k_row = lane_ % 8 + 8 * (lane_ / 16), k_col_byte = 16 * (lane_ / 8 % 2);
#pragma unroll
      for (int kk = 0; kk < D; kk += 16) {
        uint32_t a[4], b[4];
        device::ldmatrix_x4(a, q_base + ((q_row * T::kElemPitch + kk + q_col) * 2));
        device::ldmatrix_x4(b, (T::line_address(k_tile, k_row, 2 * kk & ~127) ^ k_col_byte) ^ (2 * kk & 127));
        device::mma_m16n8k16(a, {b[0], b[1]}, c[0], Elem{});
        device::mma_m16n8k16(a, {b[2], b[3]}, c[1], Elem{});
        add_group(kk + 16);
      }
    }
  }

  // Logits (scale, key scale, soft-cap, ALiBi, visibility) in log2 units, the online softmax
  // update of rows g and g + 8, and P (times each key's value scale) as the A fragment of P V.
  // Quantized caches: the value scales are divided by 2^(E - 127), E the largest biased
  // exponent of any value scale the warp has seen, so that P x scale lies in [0, 2) and
  // neither underflows nor overflows fp16 whatever the scales' magnitude; the output carries
  // the factor 2^(E - 127) (applied at the merge) and is rescaled when E grows.
  __device__ void softmax(int k_warp0, const float* k_scale, const float* v_scale, float (&s)[2][4],
                          uint32_t (&p)[4]) {
    const int c = lane_ % 4;
    // The lane's keys are 8j + 2c + i (j, i = 0, 1): two float2 loads per scale.
    float2 ks[2], vs[2];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      ks[j] = *reinterpret_cast<const float2*>(k_scale + 8 * j + 2 * c);
      vs[j] = *reinterpret_cast<const float2*>(v_scale + 8 * j + 2 * c);
    }
    float v_factor = 1.f, acc_factor = 1.f;
    if constexpr (T::kQuantized) {
      int e = kMinExponent;
#pragma unroll
      for (int j = 0; j < 2; ++j) e = max(e, max(biased_exponent(vs[j].x), biased_exponent(vs[j].y)));
      e = max(e, __shfl_xor_sync(0xffffffffu, e, 1));
      e = max(e, __shfl_xor_sync(0xffffffffu, e, 2));
      e = min(e, kMaxExponent);
      if (e > v_exponent_) {
        acc_factor = power_of_two(v_exponent_ - e);
        v_exponent_ = e;
      }
      v_factor = power_of_two(127 - v_exponent_);
    }
    // Every row sees every key of the warp's 16 (warp-uniform): no mask.
    const int pos0 = start_ + k_warp0;
    const bool unmasked =
        k_warp0 + T::kKeysPerWarp <= key_end_ && pos0 >= all_first_ && pos0 + T::kKeysPerWarp - 1 <= all_last_;
    // Element (j, e) of the accumulators: row g + 8 (e / 2), key 8j + 2c + e % 2. The options
    // are separate passes so that each is one warp-uniform branch, not one per element.
#pragma unroll
    for (int j = 0; j < 2; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[j][e] *= row_logit_scale_[e / 2] * (e % 2 == 0 ? ks[j].x : ks[j].y);
    }
    if (p_.softcap > 0.f) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) s[j][e] = p_.softcap * tanhf(s[j][e] / p_.softcap);
      }
    }
    if (p_.alibi_slopes != nullptr) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int pos = start_ + k_warp0 + 8 * j + 2 * c + e % 2;
          s[j][e] += row_slope_[e / 2] * static_cast<float>(pos - row_qpos_[e / 2]);
        }
      }
    }
#pragma unroll
    for (int j = 0; j < 2; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[j][e] *= device::kLog2e;
    }
    if (!unmasked) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int h = e / 2, k = k_warp0 + 8 * j + 2 * c + e % 2, pos = start_ + k;
          const bool visible = k < key_end_ && pos >= row_first_[h] && pos <= row_last_[h];
          s[j][e] = visible ? s[j][e] : -INFINITY;
        }
      }
    }
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < 2; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) tile_max[e / 2] = fmaxf(tile_max[e / 2], s[j][e]);
    }
    float alpha[2], m_use[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 1));
      tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 2));
      const float m_new = fmaxf(row_max_[h], tile_max[h]);
      m_use[h] = m_new == -INFINITY ? 0.f : m_new;  // nothing seen yet: all weights 0
      alpha[h] = device::fast_exp2(row_max_[h] - m_use[h]);
      row_max_[h] = m_new;
      row_sum_[h] *= alpha[h];
    }
    // The output is rescaled only when some row's maximum (or the value exponent) moved: after
    // the first tiles, rarely.
    if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f || acc_factor != 1.f)) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float f = alpha[h] * acc_factor;
#pragma unroll
        for (int n = 0; n < kValueTiles; ++n) {
          acc_[n].d[2 * h] *= f;
          acc_[n].d[2 * h + 1] *= f;
        }
      }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
#pragma unroll
        for (int e = 2 * h; e < 2 * h + 2; ++e) {
          const float w = device::fast_exp2(s[j][e] - m_use[h]);
          row_sum_[h] += w;
          s[j][e] = w * ((e % 2 == 0 ? vs[j].x : vs[j].y) * v_factor);
        }
      }
    }
    using PvOps = device::ElemOps<PvElem>;
    p[0] = PvOps::pack(s[0][0], s[0][1]);
    p[1] = PvOps::pack(s[0][2], s[0][3]);
    p[2] = PvOps::pack(s[1][0], s[1][1]);
    p[3] = PvOps::pack(s[1][2], s[1][3]);
  }

  // The value-scale exponent bookkeeping of softmax: biased float32 exponents, clamped so
  // that 2^(127 - E) and 2^(E - 127) are normal floats (an infinite or NaN scale still
  // reaches the output as such through the multiplication).
  static constexpr int kMinExponent = 1, kMaxExponent = 253;
  __device__ static int biased_exponent(float x) { return (__float_as_int(x) >> 23) & 0xff; }
  __device__ static float power_of_two(int k) {  // 2^k for k in [-126, 127]; 0 below
    return k < -126 ? 0.f : __int_as_float((k + 127) << 23);
  }

  // O += P V over the warp's 16 keys: V's B fragments by ldmatrix.trans (matrices: keys
  // 0-7 / 8-15 by lane / 8 % 2, columns n.. / n + 8.. or, quantized, stored bytes n.. /
  // n + 16.. by lane / 16), two n-tiles per load (quantized: four).
  __device__ void accumulate(uint32_t v_tile, const uint32_t (&p)[4]) {
    const int v_row = lane_ % 8 + 8 * (lane_ / 8 % 2);
    if constexpr (T::kQuantized) {
      // A 16-bit element of the transposed load is a pair of neighbouring values of one key:
      // the lane's register holds values 2g, 2g + 1 of keys 2c, 2c + 1. Its bytes 0, 2 are
      // the B fragment of the n-tile of even columns, bytes 1, 3 that of the odd ones:
      // acc_[2q] holds columns 16q + 2n' (n' its tile column), acc_[2q + 1] 16q + 2n' + 1,
      // so the lane's outputs are the columns 16q + 4c .. 16q + 4c + 3 (output_column).
      const int v_byte = 16 * (lane_ / 16);
#pragma unroll
      for (int n = 0; n < D; n += 32) {
        uint32_t b[4];
        device::ldmatrix_x4_trans(b, (T::line_address(v_tile, v_row, n & ~127) ^ v_byte) ^ (n & 127));
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const uint2 lo = stored4_interleaved_to_f16<CacheT>(b[2 * half]);
          const uint2 hi = stored4_interleaved_to_f16<CacheT>(b[2 * half + 1]);
          const int q = n / 16 + half;
          device::mma_m16n8k16(p, {lo.x, hi.x}, acc_[2 * q], __half{});
          device::mma_m16n8k16(p, {lo.y, hi.y}, acc_[2 * q + 1], __half{});
        }
      }
    } else {
      const int v_col_byte = 16 * (lane_ / 16);
#pragma unroll
      for (int n = 0; n < D; n += 16) {
        uint32_t b[4];
        device::ldmatrix_x4_trans(b, (T::line_address(v_tile, v_row, 2 * n & ~127) ^ v_col_byte) ^ (2 * n & 127));
        device::mma_m16n8k16(p, {b[0], b[1]}, acc_[n / 8], Elem{});
        device::mma_m16n8k16(p, {b[2], b[3]}, acc_[n / 8 + 1], Elem{});
      }
    }
  }

  // The output column of acc_[n].d[e] (e = 0, 1; rows g and g + 8 alike) of lane c.
  __device__ static int output_column(int n, int e, int c) {
    if constexpr (T::kQuantized) return 16 * (n / 2) + 4 * c + 2 * e + n % 2;
    return 8 * n + 2 * c + e;
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
    const float out_factor = T::kQuantized ? power_of_two(v_exponent_ - 127) : 1.f;  // see softmax
#pragma unroll
    for (int n = 0; n < kValueTiles; ++n) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int col = output_column(n, e, c);
        mine[g * D + col] = acc_[n].d[e] * out_factor;
        mine[(g + 8) * D + col] = acc_[n].d[2 + e] * out_factor;
      }
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
  // K and V rows at the same offsets (the usual case): the V offset is the staged K one.
  const bool same_layout_ = p_.k_cache.stride_block == p_.v_cache.stride_block &&
                            p_.k_cache.stride_page == p_.v_cache.stride_page && p_.k_cache.stride_h == p_.v_cache.stride_h;
  float tensor_scale_[2] = {p_.k_cache.scale_kind == GqaScaleKind::kPerTensor ? p_.k_cache.scale[0] : 1.f,
                            p_.v_cache.scale_kind == GqaScaleKind::kPerTensor ? p_.v_cache.scale[0] : 1.f};
  // The segment.
  int seq_ = 0, L_ = 0, start_ = 0, key_end_ = 0;
  // Rows g and g + 8 of this thread's mma fragments.
  int row_qpos_[2], row_first_[2], row_last_[2];
  bool row_valid_[2];  // a query row of the tile (not padding)
  float row_slope_[2], row_logit_scale_[2];
  int all_first_, all_last_;  // positions visible to every valid row
  float row_max_[2], row_sum_[2];
  int v_exponent_;  // quantized caches: see softmax
  device::MmaFragC acc_[kValueTiles];
};

template <typename Elem, typename CacheT, int D>
__global__ void __launch_bounds__(gqa_tiling::kThreads)
    gqa_decode_kernel(const __grid_constant__ GqaDecodeParams params) {
  extern __shared__ __align__(128) uint8_t smem[];
  GqaDecodeCta<Elem, CacheT, D>(params, smem).run();
}

}  // namespace mlakit::detail
