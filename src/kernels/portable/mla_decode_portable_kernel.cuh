// Portable MLA attention kernel (any CUDA GPU of sm80 or newer): the split-KV dense and
// sparse FP8 decodes and the sparse prefill, one template over the operation's parameters
// (kernels/mla_params.h).
//
// The correctness path and second reference for the Hopper kernels; it must be right on every
// input, and reasonably fast through tensor-core mma.sync.
//
// Grid: (row tiles, h_kv, num_parts). A CTA owns kRows query rows of one kv head and walks
// the (sequence, key block) range its part was given by the planner; each sequence piece
// ("segment") is an independent attention over a key range whose result is written either
// straight to `out`/`lse` (the sequence has one split) or to the partial buffers that the
// combine kernel merges. The whole-sequence entry (sparse prefill) has no planner: CTA
// (sequence * row tiles + tile, kv head) runs the whole sequence and writes final rows.
//
// The params type picks the key source at compile time: DenseDecodeParams, paged
// (position -> block table); SparseDecodeParams, FP8 tokens (position -> first or second
// cache's indices -> a V3.2 or V4 token, dequantized: kernels/fp8_tokens.cuh);
// SparsePrefillParams, rows (position -> indices -> row in q's dtype).
//
// Warps: 8, no specialisation. Per key tile of kKeys keys:
//   1. threads 0..kKeys-1 translate key positions to key rows through the block table
//      or the index list (unused or invalid slots are never dereferenced: their rows are
//      zero-filled);
//   2. all threads copy the key rows into shared memory (cp.async, 16 B);
//   3. S = Q K^T: warp w computes the 16x8 tile (rows 16*(w/4), keys 8*(w%4)) over d_qk;
//   4. online softmax on S in shared memory, 8 threads per row, P stored as Elem;
//   5. O = O*alpha + P V: warp w owns rows 16*(w/4) and value columns 128*(w%4).. in
//      registers (64 floats per thread).
// Shared memory: Q [kRows][kDqk+pad], K [kKeys][kDqk+pad], S, P and per-row statistics
// (~83 KB: two CTAs per SM on sm90).
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "common/decode_schedule.h"
#include "common/fp8_cache_row.h"
#include "common/fp8_v4_cache_row.h"
#include "device/cp_async.cuh"
#include "device/mma_sm80.cuh"
#include "device/numeric.cuh"
#include "kernels/attention_rows.cuh"
#include "kernels/fp8_tokens.cuh"
#include "kernels/mla_params.h"

namespace mlakit::detail::portable {

struct DecodeConfig {
  static constexpr int kDqk = 576;
  static constexpr int kDv = 512;
  static constexpr int kRows = 32;   // query rows per CTA
  static constexpr int kKeys = 32;   // keys per shared-memory tile
  static constexpr int kWarps = 8;
  static constexpr int kThreads = kWarps * 32;
  // Row pitch of Q/K tiles: +8 elements moves consecutive rows 4 banks apart, so the
  // fragment loads of a warp (8 rows x 4 columns) hit 32 distinct banks.
  static constexpr int kQkPitch = kDqk + 8;
  static constexpr int kSPitch = kKeys + 4;   // floats
  static constexpr int kPPitch = kKeys + 8;   // elements
  static constexpr int kChunk = 8;            // elements per 16-byte copy
  static constexpr int kChunksPerRow = kDqk / kChunk;
  static constexpr int kSoftmaxThreadsPerRow = kThreads / kRows;
  static constexpr int kColsPerSoftmaxThread = kKeys / kSoftmaxThreadsPerRow;
  static constexpr int kValueColsPerWarp = kDv / 4;        // 4 warps share a row block
  static constexpr int kValueTilesPerWarp = kValueColsPerWarp / 8;

  static_assert(kRows == 32 && kKeys == 32, "warp-to-tile maps below assume 32 x 32");
  static_assert(kWarps == 2 * (kKeys / 8), "one S tile of 16 x 8 per warp");
  static_assert(kDqk % 16 == 0 && kDv % 16 == 0, "k16 steps");
  static_assert(kSoftmaxThreadsPerRow == 8 && kColsPerSoftmaxThread == 4, "softmax layout");
};

template <typename Elem>
struct DecodeSmem {
  using C = DecodeConfig;
  alignas(16) Elem q[C::kRows][C::kQkPitch];
  alignas(16) Elem k[C::kKeys][C::kQkPitch];
  alignas(16) float s[C::kRows][C::kSPitch];
  alignas(16) Elem p[C::kRows][C::kPPitch];
  float alpha[C::kRows];     // rescale of O for the current tile
  float inv_l[C::kRows];     // 1 / row sum at the end of a segment (0 for an empty row)
  float lse2[C::kRows];      // log2-domain LSE at the end of a segment (-inf: empty)
  float max2[C::kRows];      // log2-domain largest logit at the end of a segment (-inf: empty)
  int row_limit[C::kRows];   // exclusive bound of visible key positions per row
  const void* key_row[C::kKeys];       // each key's row (FP8: its record); null: a zero row
  const uint8_t* key_scales[C::kKeys];  // FP8 tokens: each key's scales
  int bad;                   // a block-table entry was out of range in this segment
};

// run_segment's `partial_slot` for a segment that is the whole sequence: final rows.
inline constexpr int kFinalOutput = -1;

// The key source of an operation's params type (kernels/mla_params.h).
template <typename Params>
inline constexpr bool kPagedKeys = std::is_same_v<Params, DenseDecodeParams>;   // block table
template <typename Params>
inline constexpr bool kFp8Keys = std::is_same_v<Params, SparseDecodeParams>;    // listed FP8 tokens
template <typename Params>
inline constexpr bool kRowKeys = std::is_same_v<Params, SparsePrefillParams>;   // listed Elem rows

// Params: DenseDecodeParams, SparseDecodeParams (Elem bf16) or SparsePrefillParams.
template <typename Elem, typename Params>
class DecodeCta {
  using C = DecodeConfig;
  using Ops = device::ElemOps<Elem>;
  static_assert(kPagedKeys<Params> || kFp8Keys<Params> || kRowKeys<Params>, "an operation's params type");
  static_assert(!kFp8Keys<Params> || std::is_same_v<Elem, __nv_bfloat16>, "FP8 tokens dequantize to bf16");

 public:
  // Row tile `tile` (rows tile * kRows ..) of kv head `hk`.
  __device__ DecodeCta(const Params& p, DecodeSmem<Elem>& sm, int tile, int hk)
      : p_(p), c_(p.core), sm_(sm), tid_(threadIdx.x), warp_(threadIdx.x / 32), lane_(threadIdx.x % 32),
        tile_(tile), hk_(hk) {}

  // Attention of this CTA's rows over keys [key_begin, key_end) of sequence `seq`; the result
  // goes to `out`/`lse` (partial_slot == kFinalOutput) or to that partial-result slot (planned
  // operations only: without a plan every segment is a whole sequence, written as final rows).
  __device__ void run_segment(int seq, int L, int key_begin, int key_end, int partial_slot) {
    if constexpr (kFp8Keys<Params>) first_keys_ = c_.lengths.first(seq);
    load_q_and_limits(seq, L);
    reset_state();
    const int tiles_end = tile_keys_end(c_, hk_, tile_ * C::kRows, C::kRows, L, key_end);
    for (int k0 = key_begin; k0 < tiles_end; k0 += C::kKeys) {
      load_keys(seq, k0, key_end);
      compute_scores();
      __syncthreads();
      softmax_tile(k0, key_end);
      __syncthreads();
      accumulate_values();
      __syncthreads();
    }
    finish_rows();
    __syncthreads();
    if constexpr (Params::kPlanned) {
      if (partial_slot == kFinalOutput) {
        store_final(seq);
      } else {
        store_partial(partial_slot);
      }
    } else {
      store_final(seq);
    }
    __syncthreads();
  }

 private:
  __device__ void load_q_and_limits(int seq, int L) {
    const Elem* q = static_cast<const Elem*>(c_.q);
    const int stored_chunks = c_.d_qk / C::kChunk;  // columns past d_qk stay zero
    for (int c = tid_; c < C::kRows * C::kChunksPerRow; c += C::kThreads) {
      int r = c / C::kChunksPerRow, chunk = c % C::kChunksPerRow;
      int row = tile_ * C::kRows + r;
      Elem* dst = &sm_.q[r][chunk * C::kChunk];
      if (row < c_.rows && chunk < stored_chunks) {
        RowCoord rc = row_coord(c_, hk_, row);
        device::cp_async_16(dst, q + seq_offset(c_, seq, c_.q_stride_b, c_.q_stride_s) + rc.t * c_.q_stride_s +
                                     rc.head * c_.q_stride_h + chunk * C::kChunk);
      } else {
        *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
      }
    }
    if (tid_ < C::kRows) {
      int row = min(tile_ * C::kRows + tid_, c_.rows - 1);
      sm_.row_limit[tid_] = visible_keys(c_, L, row_coord(c_, hk_, row).t);
    }
    if (tid_ == 0) sm_.bad = 0;
    device::cp_async_wait_all();
    __syncthreads();
  }

  __device__ void reset_state() {
    for (int j = 0; j < C::kValueTilesPerWarp; ++j) {
      for (int e = 0; e < 4; ++e) acc_[j].d[e] = 0.f;
    }
    row_max_ = -INFINITY;
    row_sum_ = 0.f;
  }

  // Steps 1-2 of a key tile: threads 0..kKeys-1 find each key's row (key_row, null: none,
  // zero-filled and masked in the softmax, never read), then all threads fill the K tile:
  // FP8 tokens dequantized (sparse decode), rows in Elem copied (dense decode, prefill).
  __device__ void load_keys(int seq, int k0, int key_end) {
    if (tid_ < C::kKeys) {
      const int pos = k0 + tid_;
      if constexpr (kFp8Keys<Params>) {
        const Fp8TokenRef token =
            pos >= key_end ? Fp8TokenRef{nullptr, nullptr} : listed_fp8_token(p_, seq, first_keys_, pos);
        sm_.key_row[tid_] = token.record;
        sm_.key_scales[tid_] = token.scales;
      } else {
        sm_.key_row[tid_] = pos >= key_end ? nullptr : locate_key(seq, pos);
      }
    }
    __syncthreads();
    if constexpr (kFp8Keys<Params>) {
      if (p_.layout == Fp8TokenLayout::kV4) {
        dequantize_v4_keys();
      } else {
        dequantize_fp8_keys();
      }
    } else {
      copy_keys();
    }
  }

  // The row of key `pos` of sequence `seq` in the key source (null: none, never dereferenced).
  __device__ const Elem* locate_key(int seq, int pos) {
    if constexpr (kPagedKeys<Params>) {
      return paged_key_row(seq, pos);
    } else {
      const int64_t offset = row_slot_offset(p_.keys, listed_slot(c_, p_.keys, seq, pos));
      return offset < 0 ? nullptr : static_cast<const Elem*>(p_.keys.kv) + offset;
    }
  }

  // Dense decode: through the block table. An entry outside the table or [0, num_blocks) sets
  // the segment's `bad` flag (reported as NaN rows) and is never dereferenced.
  __device__ const Elem* paged_key_row(int seq, int pos) {
    const PagedCache& cache = p_.cache;
    const int logical = pos / cache.page_size;
    const int32_t block =
        logical < cache.max_blocks_per_seq ? cache.block_table[seq * cache.block_table_stride_b + logical] : -1;
    if (block < 0 || block >= cache.num_blocks) {
      sm_.bad = 1;
      return nullptr;
    }
    return static_cast<const Elem*>(cache.kv) + block * cache.kv_stride_block +
           (pos % cache.page_size) * cache.kv_stride_page + hk_ * cache.kv_stride_h;
  }

  // Rows stored in Elem (dense decode: the paged cache; prefill: the listed rows): 16-byte
  // cp.async of the first d_qk columns, zeros elsewhere.
  __device__ void copy_keys() {
    const int stored_chunks = c_.d_qk / C::kChunk;
    for (int c = tid_; c < C::kKeys * C::kChunksPerRow; c += C::kThreads) {
      const int key = c / C::kChunksPerRow, chunk = c % C::kChunksPerRow;
      Elem* dst = &sm_.k[key][chunk * C::kChunk];
      const Elem* row = static_cast<const Elem*>(sm_.key_row[key]);
      if (row != nullptr && chunk < stored_chunks) {
        device::cp_async_16(dst, row + chunk * C::kChunk);
      } else {
        *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
      }
    }
    device::cp_async_wait_all();
    __syncthreads();
  }

  // Sparse FP8 decode, DeepSeek V3.2 tokens: valid tokens are dequantized from the 656-byte
  // format into the bf16 K tile (common/fp8_cache_row.h, the same arithmetic as the reference).
  __device__ void dequantize_fp8_keys() {
    constexpr int kNopeChunks = kFp8NopeDim / C::kChunk;
    for (int c = tid_; c < C::kKeys * C::kChunksPerRow; c += C::kThreads) {
      const int key = c / C::kChunksPerRow, chunk = c % C::kChunksPerRow;
      const uint8_t* token = static_cast<const uint8_t*>(sm_.key_row[key]);
      uint4 v = make_uint4(0, 0, 0, 0);
      if (token != nullptr) {
        if (chunk < kNopeChunks) {
          const float scale = *reinterpret_cast<const float*>(sm_.key_scales[key] + 4 * (chunk * C::kChunk / kFp8Tile));
          v = dequantized_chunk(token + chunk * C::kChunk, [scale](uint8_t b) { return fp8_dequantize(b, scale); });
        } else {
          v = *reinterpret_cast<const uint4*>(token + kFp8RopeOffset + (chunk - kNopeChunks) * 16);
        }
      }
      *reinterpret_cast<uint4*>(&sm_.k[key][chunk * C::kChunk]) = v;
    }
    __syncthreads();
  }

  // Sparse V4 decode: columns 0..447 dequantized with the tile's UE8M0 scale, 448..511 the bf16
  // RoPE, 512..575 zero (q is zero there too: d_qk 512).
  __device__ void dequantize_v4_keys() {
    constexpr int kNopeChunks = kV4NopeDim / C::kChunk, kRowChunks = kV4Dqk / C::kChunk;
    for (int c = tid_; c < C::kKeys * C::kChunksPerRow; c += C::kThreads) {
      const int key = c / C::kChunksPerRow, chunk = c % C::kChunksPerRow;
      const uint8_t* record = static_cast<const uint8_t*>(sm_.key_row[key]);
      uint4 v = make_uint4(0, 0, 0, 0);
      if (record != nullptr && chunk < kRowChunks) {
        if (chunk < kNopeChunks) {
          const float scale = ue8m0_to_float(sm_.key_scales[key][chunk * C::kChunk / kV4Tile]);
          v = dequantized_chunk(record + chunk * C::kChunk, [scale](uint8_t b) { return v4_dequantize(b, scale); });
        } else {
          v = *reinterpret_cast<const uint4*>(record + kV4RopeOffset + (chunk - kNopeChunks) * 16);
        }
      }
      *reinterpret_cast<uint4*>(&sm_.k[key][chunk * C::kChunk]) = v;
    }
    __syncthreads();
  }

  // Eight e4m3 bytes (8-byte aligned) dequantized by `value` into eight bf16 bit patterns.
  template <typename Dequantize>
  __device__ static uint4 dequantized_chunk(const uint8_t* bytes, Dequantize value) {
    const uint2 q8 = *reinterpret_cast<const uint2*>(bytes);
    const uint8_t* b = reinterpret_cast<const uint8_t*>(&q8);
    uint16_t h[C::kChunk];
#pragma unroll
    for (int i = 0; i < C::kChunk; ++i) h[i] = value(b[i]);
    return make_uint4(h[0] | (uint32_t(h[1]) << 16), h[2] | (uint32_t(h[3]) << 16), h[4] | (uint32_t(h[5]) << 16),
                      h[6] | (uint32_t(h[7]) << 16));
  }

  __device__ uint32_t smem_pair(const Elem* ptr) const {
    return *reinterpret_cast<const uint32_t*>(ptr);
  }

  // S tile of this warp: rows 16*(warp/4).., keys 8*(warp%4)..
  __device__ void compute_scores() {
    const int g = lane_ / 4, c = lane_ % 4;
    const int m0 = 16 * (warp_ / 4), n0 = 8 * (warp_ % 4);
    device::MmaFragC s{{0.f, 0.f, 0.f, 0.f}};
#pragma unroll 4
    for (int k = 0; k < C::kDqk; k += 16) {
      uint32_t a[4] = {smem_pair(&sm_.q[m0 + g][k + 2 * c]), smem_pair(&sm_.q[m0 + g + 8][k + 2 * c]),
                       smem_pair(&sm_.q[m0 + g][k + 2 * c + 8]),
                       smem_pair(&sm_.q[m0 + g + 8][k + 2 * c + 8])};
      uint32_t b[2] = {smem_pair(&sm_.k[n0 + g][k + 2 * c]), smem_pair(&sm_.k[n0 + g][k + 2 * c + 8])};
      device::mma_m16n8k16(a, b, s, Elem{});
    }
    sm_.s[m0 + g][n0 + 2 * c] = s.d[0];
    sm_.s[m0 + g][n0 + 2 * c + 1] = s.d[1];
    sm_.s[m0 + g + 8][n0 + 2 * c] = s.d[2];
    sm_.s[m0 + g + 8][n0 + 2 * c + 1] = s.d[3];
  }

  // Online softmax in the log2 domain; 8 consecutive threads share a row.
  __device__ void softmax_tile(int k0, int key_end) {
    const int r = tid_ / C::kSoftmaxThreadsPerRow;
    const int col0 = (tid_ % C::kSoftmaxThreadsPerRow) * C::kColsPerSoftmaxThread;
    const int limit = min(sm_.row_limit[r], key_end);
    float v[C::kColsPerSoftmaxThread];
    float tile_max = -INFINITY;
#pragma unroll
    for (int j = 0; j < C::kColsPerSoftmaxThread; ++j) {
      int pos = k0 + col0 + j;
      // Keys never loaded (past the segment, invalid sparse slots) are masked, not just zero.
      v[j] = pos < limit && sm_.key_row[col0 + j] != nullptr ? sm_.s[r][col0 + j] * c_.scale_log2 : -INFINITY;
      tile_max = fmaxf(tile_max, v[j]);
    }
#pragma unroll
    for (int x = 1; x < C::kSoftmaxThreadsPerRow; x *= 2) {
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, x));
    }
    const float new_max = fmaxf(row_max_, tile_max);
    // A row with no visible key so far keeps max -inf: its P is 0 and O stays 0.
    const float alpha = new_max == -INFINITY ? 1.f : exp2f(row_max_ - new_max);
    float sum = 0.f;
#pragma unroll
    for (int j = 0; j < C::kColsPerSoftmaxThread; ++j) {
      float e = new_max == -INFINITY ? 0.f : exp2f(v[j] - new_max);
      sum += e;
      sm_.p[r][col0 + j] = Ops::from_float(e);
    }
#pragma unroll
    for (int x = 1; x < C::kSoftmaxThreadsPerRow; x *= 2) {
      sum += __shfl_xor_sync(0xffffffffu, sum, x);
    }
    row_sum_ = row_sum_ * alpha + sum;
    row_max_ = new_max;
    if (tid_ % C::kSoftmaxThreadsPerRow == 0) sm_.alpha[r] = alpha;
  }

  // O (rows 16*(warp/4).., value columns 128*(warp%4)..) = O * alpha + P V.
  __device__ void accumulate_values() {
    const int g = lane_ / 4, c = lane_ % 4;
    const int m0 = 16 * (warp_ / 4), d0 = C::kValueColsPerWarp * (warp_ % 4);
    const float alpha_lo = sm_.alpha[m0 + g], alpha_hi = sm_.alpha[m0 + g + 8];
#pragma unroll
    for (int j = 0; j < C::kValueTilesPerWarp; ++j) {
      acc_[j].d[0] *= alpha_lo;
      acc_[j].d[1] *= alpha_lo;
      acc_[j].d[2] *= alpha_hi;
      acc_[j].d[3] *= alpha_hi;
    }
#pragma unroll
    for (int k = 0; k < C::kKeys; k += 16) {
      uint32_t a[4] = {smem_pair(&sm_.p[m0 + g][k + 2 * c]), smem_pair(&sm_.p[m0 + g + 8][k + 2 * c]),
                       smem_pair(&sm_.p[m0 + g][k + 2 * c + 8]),
                       smem_pair(&sm_.p[m0 + g + 8][k + 2 * c + 8])};
#pragma unroll
      for (int j = 0; j < C::kValueTilesPerWarp; ++j) {
        const int n = d0 + 8 * j + g;
        uint32_t b[2] = {Ops::pack_raw(sm_.k[k + 2 * c][n], sm_.k[k + 2 * c + 1][n]),
                         Ops::pack_raw(sm_.k[k + 2 * c + 8][n], sm_.k[k + 2 * c + 9][n])};
        device::mma_m16n8k16(a, b, acc_[j], Elem{});
      }
    }
  }

  __device__ void finish_rows() {
    if (tid_ % C::kSoftmaxThreadsPerRow == 0) {
      const int r = tid_ / C::kSoftmaxThreadsPerRow;
      const bool empty = row_sum_ == 0.f;
      sm_.inv_l[r] = empty ? 0.f : 1.f / row_sum_;
      sm_.lse2[r] = empty ? -INFINITY : row_max_ + log2f(row_sum_);
      sm_.max2[r] = empty ? -INFINITY : row_max_;
    }
  }

  // One split: normalised output in q's dtype, LSE (+inf for an empty row) and max logit
  // (-inf) in natural log or, with lse_base2, log2 units.
  __device__ void store_final(int seq) {
    const bool bad = sm_.bad != 0;
    Elem* out = static_cast<Elem*>(c_.out);
    for_each_value([&](int row, int d, float v0, float v1) {
      RowCoord rc = row_coord(c_, hk_, row);
      if (bad) v0 = v1 = NAN;
      const float lse2 = sm_.lse2[row - tile_ * C::kRows];
      const float sink = sink_factor(c_, rc.head, lse2 * device::kLn2);
      *reinterpret_cast<uint32_t*>(out + seq_offset(c_, seq, c_.out_stride_b, c_.out_stride_s) +
                                   rc.t * c_.out_stride_s + rc.head * c_.out_stride_h + d) =
          Ops::pack(v0 * sink, v1 * sink);
    });
    if (tid_ < C::kRows) {
      const int row = tile_ * C::kRows + tid_;
      if (row < c_.rows) {
        RowCoord rc = row_coord(c_, hk_, row);
        const float to_base = c_.lse_base2 ? 1.f : device::kLn2;
        float lse2 = sm_.lse2[tid_];
        float lse = bad ? NAN : (lse2 == -INFINITY ? INFINITY : lse2 * to_base);
        c_.lse[seq_offset(c_, seq, c_.lse_stride_b, c_.lse_stride_s) + rc.head * c_.lse_stride_h +
               rc.t * c_.lse_stride_s] = lse;
        if (c_.max_logits != nullptr) {
          c_.max_logits[seq_offset(c_, seq, c_.max_logits_stride_b, c_.max_logits_stride_s) +
                        rc.head * c_.max_logits_stride_h + rc.t * c_.max_logits_stride_s] =
              bad ? NAN : sm_.max2[tid_] * to_base;
        }
      }
    }
  }

  // Several splits: normalised float output and log2 LSE (-inf: empty) into slot `slot`.
  __device__ void store_partial(int slot) {
    const bool bad = sm_.bad != 0;
    const int64_t base_row = (static_cast<int64_t>(slot) * c_.h_kv + hk_) * c_.rows;
    for_each_value([&](int row, int d, float v0, float v1) {
      if (bad) v0 = v1 = NAN;
      *reinterpret_cast<float2*>(p_.schedule.partial_out + (base_row + row) * C::kDv + d) = make_float2(v0, v1);
    });
    if (tid_ < C::kRows) {
      const int row = tile_ * C::kRows + tid_;
      if (row < c_.rows) p_.schedule.partial_lse[base_row + row] = bad ? NAN : sm_.lse2[tid_];
    }
  }

  // Calls f(row, d, value d, value d+1) for each normalised output pair this thread holds.
  template <typename F>
  __device__ void for_each_value(F&& f) {
    const int g = lane_ / 4, c = lane_ % 4;
    const int m0 = 16 * (warp_ / 4), d0 = C::kValueColsPerWarp * (warp_ % 4);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = m0 + g + 8 * half;
      const int row = tile_ * C::kRows + r;
      if (row >= c_.rows) continue;
      const float inv_l = sm_.inv_l[r];
#pragma unroll
      for (int j = 0; j < C::kValueTilesPerWarp; ++j) {
        f(row, d0 + 8 * j + 2 * c, acc_[j].d[2 * half] * inv_l, acc_[j].d[2 * half + 1] * inv_l);
      }
    }
  }

  const Params& p_;
  const AttentionCore& c_;  // p_.core
  DecodeSmem<Elem>& sm_;
  const int tid_, warp_, lane_, tile_, hk_;
  device::MmaFragC acc_[C::kValueTilesPerWarp];
  int first_keys_ = 0;         // FP8 tokens: the segment's sequence's first-cache keys
  float row_max_ = -INFINITY;  // log2 domain, owned by the 8 softmax threads of a row
  float row_sum_ = 0.f;
};

// Split-KV entry of the planned operations (DenseDecodeParams, SparseDecodeParams): grid
// (row tiles, h_kv, num_parts), CTA z walks the plan's part z.
template <typename Elem, typename Params>
__global__ void __launch_bounds__(DecodeConfig::kThreads, 2)
    mla_decode_portable_kernel(const __grid_constant__ Params p) {
  static_assert(Params::kPlanned, "the split-KV entry runs a plan");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  auto& sm = *reinterpret_cast<DecodeSmem<Elem>*>(smem_raw);
  DecodeCta<Elem, Params> cta(p, sm, blockIdx.x, blockIdx.y);
  const SplitSchedule& schedule = p.schedule;
  for_each_segment(p.core, schedule, schedule.part_ranges[blockIdx.z],
                   [&](int seq, int L, int key_begin, int key_end, int split) {
                     const int splits = schedule.split_prefix[seq + 1] - schedule.split_prefix[seq];
                     cta.run_segment(seq, L, key_begin, key_end,
                                     splits == 1 ? kFinalOutput : schedule.partial_prefix[seq] + split);
                   });
}

// Whole-sequence entry of the operations without a plan (SparsePrefillParams: no workspace).
// Grid (sequences * row tiles, h_kv); consecutive CTAs are the row tiles of one sequence, so
// they gather the same keys close together in time and all but the first find them in L2.
// Every CTA covers all keys of its sequence and writes final rows, also for a sequence of
// length 0 (0, lse +inf).
template <typename Elem, typename Params>
__global__ void __launch_bounds__(DecodeConfig::kThreads, 2)
    mla_portable_whole_sequence_kernel(const __grid_constant__ Params p) {
  static_assert(!Params::kPlanned, "the whole-sequence entry runs without a plan");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  auto& sm = *reinterpret_cast<DecodeSmem<Elem>*>(smem_raw);
  const int row_tiles = (p.core.rows + DecodeConfig::kRows - 1) / DecodeConfig::kRows;
  const int seq = static_cast<int>(blockIdx.x) / row_tiles;
  DecodeCta<Elem, Params> cta(p, sm, static_cast<int>(blockIdx.x) % row_tiles, blockIdx.y);
  const int L = p.core.lengths(seq);
  cta.run_segment(seq, L, 0, L, kFinalOutput);
}

}  // namespace mlakit::detail::portable
