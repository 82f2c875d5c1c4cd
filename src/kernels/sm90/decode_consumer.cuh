// Consumer role of the Hopper dense decode: warpgroups 1 and 2 ("consumer 0" and "consumer 1")
// in a seesaw over pairs of cache tiles (A in stage 0, B in stage 1).
//
// Consumer w owns the output columns O_w = O[:, 256w .. 256w+255] (64 x 256 f32, 128
// registers per thread). Per pair, with m the running row max before the pair:
//   consumer 0: S_A = Q K_Aᵀ (64 x 64), m_A = max(m, rowmax S_A), P_A = 2^(S_A - m_A) -> shared
//               memory, O_0 = O_0·2^(m - m_A) + P_A V_A,0; then, once P_B is published,
//               O_0 = O_0·2^(m_A - m_B) + P_B V_B,0.
//   consumer 1: S_B = Q K_Bᵀ is issued first; once P_A is published, O_1 = O_1·2^(m - m_A) +
//               P_A V_A,1 runs while S_B finishes; m_B = max(m_A, rowmax S_B), P_B -> shared
//               memory, O_1 = O_1·2^(m_A - m_B) + P_B V_B,1.
// So each S has N = 64 (half the shared-memory traffic per FLOP of two N = 32 halves), and
// one consumer's softmax overlaps the other's matrix multiplies. The factors 2^(m - m_A) and
// 2^(m_A - m_B) are 1 once a row's max settles; O is then left alone (warp vote).
//
// Own P feeds P·V from registers (RS form); the other consumer reads it from shared memory,
// from the RoPE slab of the tile's own stage (dead once S is done), so shared memory holds
// just Q and two cache tiles.
//
// Hand-offs: mbarriers handoff[kP0Ready] / handoff[kP1Ready] (every thread of the publisher
// arrives after its P tile, row max and fence.proxy.async; every thread of the other consumer
// waits). A stage is released in two halves (empty[s][half]: V slabs 0..3, and slabs 4..8),
// each by its last readers after their last wgmma reading it, so the producer refills the
// first half of tile A while consumer 1 is still on the second; the P tile in the RoPE slab
// is recycled with the second half.
//
// Every exchange through shared memory between threads is ordered by a barrier that each
// accessing thread takes part in itself (a bar.sync, or its own mbarrier arrival or wait), so
// compute-sanitizer racecheck follows each one (docs/kernels/mla_decode_sm90.md lists them).
#pragma once

#include <cuda.h>

#include <cmath>
#include <cstdint>

#include "device/cp_async.cuh"
#include "device/numeric.cuh"
#include "device/sm90/matrix_store.cuh"
#include "device/sm90/sync.cuh"
#include "device/sm90/wgmma.cuh"
#include "kernels/decode_rows.cuh"
#include "kernels/sm90/decode_config.cuh"
#include "kernels/sm90/decode_q_tile.cuh"
#include "kernels/sm90/timeline.cuh"

namespace mlakit::detail::sm90 {

namespace dev = mlakit::device::sm90;

// Consumer 1's order within a pair of tiles.
enum class PairOrder {
  // S_B is issued first; once P_A is published, P_A V_A,1 runs while softmax B is computed
  // (the dense decode).
  kPvA1DuringSoftmaxB,
  // Consumer 1 takes the P_A hand-off and issues P_A V_A,1 before S_B, so P_A V_A,1 runs while
  // a late tile B lands. Measured on the H200 (2026-11-22): FP8 sparse decode h_q 64 topk 2048
  // 257 vs 270 us, h_q 128 neutral; the sparse prefill 8% slower (S_B, on its critical path,
  // starts later).
  kPvA1First,
  // Consumer 0 publishes m_A as soon as its row max is known, before its exponentials, and
  // consumer 1 runs softmax B as soon as S_B is done instead of after the P_A hand-off: the
  // two softmaxes overlap rather than follow each other; P_A V_A,1 and P_B V_B,1 come after
  // (the sparse prefill, where the tile-B chain S_B -> softmax B -> P_B V_B,0 sets the pair).
  kSoftmaxBFirst,
};

// kGathered: keys come from a gathering producer (sparse prefill, sparse FP8 decode) with a
// valid-slot mask per tile; false for the paged dense decode (no mask code at all: registers
// are tight). Scheduled sequence seq addresses q / out / lse through seq_offset (the sparse
// decode schedules one sequence per (batch entry, query token)).
//
// Order: consumer 1's order within a pair (PairOrder, below).
//
// kMaxLogits: the kernel writes max_logits (sparse prefill), so each consumer also tracks the
// true max logit of its rows (the reference max of the exponents may lag it).
//
// kGatheredHalves (gathered tiles only): the producer also completes a tile's low half on
// its own barrier (Sm90DecodeConfig::kGatheredLowHalfBarrier), and S starts on slabs 0..3
// while slabs 4..8 are still landing (the sparse prefill, whose tile B lands on its
// consumer's critical path; the FP8 decode converts slab by slab and waits once).
template <typename Elem, bool kGathered = false, PairOrder kOrder = PairOrder::kPvA1DuringSoftmaxB,
          bool kMaxLogits = false, bool kGatheredHalves = false>
class Sm90Consumer {
  static_assert(kGathered || !kGatheredHalves, "kGatheredHalves needs a gathering producer");
  using C = Sm90DecodeConfig;
  using Ops = device::ElemOps<Elem>;
  using Mma64 = device::sm90::Wgmma<64, Elem>;
  using Mma256 = device::sm90::Wgmma<256, Elem>;

 public:
  // Rows tile * 64 .. of kv head hk.
  // q_map: the Q tile by TMA (kernels/sm90/launch.h, make_q_tensor_map); nullptr: by cp.async.
  __device__ Sm90Consumer(const MlaDecodeParams& p, Sm90DecodeSmem& sm, int tile, int hk,
                          const CUtensorMap* q_map = nullptr)
      : p_(p), sm_(sm), q_map_(q_map), w_(threadIdx.x / 128 - 1), t_(threadIdx.x - 128), lane_(threadIdx.x % 32),
        r0_(16 * ((threadIdx.x % 128) / 32) + (threadIdx.x % 32) / 4), hk_(hk), tile_(tile) {}

  // Every segment of a part in order, each told the next one's sequence.
  __device__ void run_part(const PartRange& range) {
    SegmentCursor cursor(p_, range);
    Segment s, next;
    for (bool more = cursor.next(&s); more; s = next) {
      more = cursor.next(&next);
      run_segment(s.seq, s.L, s.key_begin, s.key_end, s.split, more ? next.seq : -1);
    }
  }

  // next_seq: the scheduled sequence of the CTA's next segment (-1: none or unknown); its Q
  // tile is copied during this segment's output store.
  __device__ void run_segment(int seq, int L, int key_begin, int key_end, int split, int next_seq = -1) {
    if (!q_issued_) issue_q(seq);
    // The store reads the split counts; brought into L2 now, they are no DRAM miss then (a
    // value loaded here would hold registers through the segment).
    if (!p_.no_splits && p_.split_prefix != nullptr && t_ == 0) {
      device::prefetch_l2(p_.split_prefix + seq);
      device::prefetch_l2(p_.partial_prefix + seq);
    }
    await_q();
    MLAKIT_SM90_STAMP(kConsumerQLoaded);
    lim_[0] = row_limit(r0_, L, key_end);
    lim_[1] = row_limit(r0_ + 8, L, key_end);
#pragma unroll
    for (int j = 0; j < 128; ++j) o_[j] = 0.f;
    m_[0] = m_[1] = -INFINITY;
    max_logit_[0] = max_logit_[1] = -INFINITY;
    l_[0] = l_[1] = 0.f;
    bad_ = false;
    const int tiles = segment_tiles(p_, hk_, tile_, L, key_begin, key_end);
    for (int i = 0; i < tiles; i += 2) {
      const int start_a = key_begin + i * C::kKeys;
      const bool has_b = i + 1 < tiles;
      MLAKIT_SM90_STAMP(kConsumerPairStart);
      if (w_ == 0) {
        pair_consumer0(start_a, has_b, key_end);
      } else {
        pair_consumer1(start_a, has_b, key_end);
      }
      MLAKIT_SM90_STAMP(kConsumerPairEnd);
    }
    store(seq, split, next_seq);
    MLAKIT_SM90_STAMP(kConsumerStored);
  }

 private:
  // ---- one pair of tiles, per consumer --------------------------------------------------

  __device__ void pair_consumer0(int start_a, bool has_b, int key_end) {
    float s[32];
    bad_ |= issue_scores(s, 0, start_a, key_end);
    dev::wgmma_wait<0>();  // S_A, and the previous pair's P_B V_B,0
    dev::fence_registers(s);
    MLAKIT_SM90_STAMP(kConsumerScores);
    release(0, C::kHighSlabs);  // S_A was this consumer's last read of slabs 4..8 of stage 0
    float m_a[2], sum_a[2];
    if constexpr (kOrder == PairOrder::kSoftmaxBFirst) {
      float mx[2];
      scaled_logits(s, start_a, mx);
      reference_max(mx, m_, m_a);
      publish_row_max(m_a);
      dev::mbarrier_arrive(&sm_.handoff[C::kMaxAReady]);
      dev::fence_registers(s);  // the exponentials after the arrival (see pair_consumer1)
      exponentiate(s, m_a, sum_a);
      publish<false>(s, m_a, C::kP0Ready);
    } else {
      softmax(s, start_a, m_a, sum_a);
      publish(s, m_a, C::kP0Ready);
    }
    rescale(m_a);  // no wgmma pending on O: the wait above covered them
    add_sums(sum_a);
    uint32_t frag[C::kPvSteps][4];
    pack_p(s, frag);
    issue_values_rs(frag, 0);
    // Waiting for P_A V_A,0 here costs nothing (this consumer has no work before P_B is
    // published) and frees V slabs 0..3 of stage 0 while consumer 1 is still on softmax B, so
    // the producer starts the next tile A that much earlier.
    dev::wgmma_wait<0>();
    dev::fence_registers(o_);
    dev::fence_registers(frag);
    release(0, C::kLowSlabs);
    if (has_b) {
      await_handoff(C::kP1Ready);
      MLAKIT_SM90_STAMP(kConsumerHandoff);
      if constexpr (kGathered) dev::fence_proxy_async_smem();  // V_B: generic-proxy writes (issue_scores says why)
      bad_ |= stage_bad(1);
      float m_b[2];
      read_row_max(1, m_b);
      rescale(m_b);
      issue_values_ss(sm_.kv[1][C::kNopeSlabs], 1);
      dev::wgmma_wait<0>();
      dev::fence_registers(o_);
      release(1, C::kLowSlabs);
      release(1, C::kHighSlabs);  // P_B was read from slab 8
    }
  }

  __device__ void pair_consumer1(int start_a, bool has_b, int key_end) {
    if (!has_b) {  // lone tile A: only its P·V for this consumer's columns
      float m_a[2];
      if constexpr (kOrder == PairOrder::kSoftmaxBFirst) {
        await_row_max_a(m_a);
        receive_p_a();
      } else {
        receive_tile_a(m_a);
      }
      rescale(m_a);
      issue_values_ss(sm_.kv[0][C::kNopeSlabs], 0);
      dev::wgmma_wait<0>();
      dev::fence_registers(o_);
      release(0, C::kHighSlabs);
      return;
    }
    const int start_b = start_a + C::kKeys;
    float s[32];
    float m_a[2], m_b[2], sum_b[2];
    if constexpr (kOrder == PairOrder::kSoftmaxBFirst) {
      bad_ |= issue_scores(s, 1, start_b, key_end);
      dev::wgmma_wait<0>();
      dev::fence_registers(s);
      MLAKIT_SM90_STAMP(kConsumerScores);
      float mx[2];
      scaled_logits(s, start_b, mx);
      // S_B and the valid-slot mask (read by scaled_logits) were this consumer's last reads
      // of what the producer rewrites with slabs 0..3 of stage 1.
      release(1, C::kLowSlabs);
      // Register fences pin the softmax between the barrier waits: the compiler otherwise sank
      // the logits and the exponentials below both waits (register-only work is free to move
      // across a bar.sync), which serialised softmax B behind softmax A again.
      dev::fence_registers(s);
      dev::fence_registers(mx);
      await_row_max_a(m_a);
      reference_max(mx, m_a, m_b);
      exponentiate(s, m_b, sum_b);
      dev::fence_registers(s);
      // P_A is taken before P_B is published: consumer 0 publishes the next pair's m_A and P_A
      // only after it has P_B, so each named barrier completes once per pair.
      receive_p_a();
      MLAKIT_SM90_STAMP(kConsumerHandoff);
      publish(s, m_b, C::kP1Ready);
      rescale(m_a);  // no wgmma in flight
      issue_values_ss(sm_.kv[0][C::kNopeSlabs], 0);
      dev::wgmma_wait<0>();  // O moves on to m_B next
      dev::fence_registers(o_);
      release(0, C::kHighSlabs);
    } else if constexpr (kOrder == PairOrder::kPvA1First) {
      // P_A V_A,1 runs while tile B lands, and frees stage 0 sooner.
      receive_tile_a(m_a);
      MLAKIT_SM90_STAMP(kConsumerHandoff);
      rescale(m_a);  // no wgmma in flight: the previous pair ended with a wait
      issue_values_ss(sm_.kv[0][C::kNopeSlabs], 0);
      bad_ |= issue_scores(s, 1, start_b, key_end);
      dev::wgmma_wait<0>();  // P_A V_A,1 and S_B
      dev::fence_registers(s);
      dev::fence_registers(o_);
      MLAKIT_SM90_STAMP(kConsumerScores);
      release(0, C::kHighSlabs);
      softmax(s, start_b, m_b, sum_b);
      publish(s, m_b, C::kP1Ready);
      // S_B and the valid-slot mask (read by the softmax) were this consumer's last reads of
      // what the producer rewrites with slabs 0..3 of stage 1.
      release(1, C::kLowSlabs);
    } else {
      bad_ |= issue_scores(s, 1, start_b, key_end);  // queued behind S_A: the tensor cores work through softmax A
      receive_tile_a(m_a);
      MLAKIT_SM90_STAMP(kConsumerHandoff);
      // O is rescaled outside any wgmma group in flight (ptxas serialises the pipeline
      // otherwise), so S_B is waited for first; it was issued long before.
      dev::wgmma_wait<0>();
      dev::fence_registers(s);
      MLAKIT_SM90_STAMP(kConsumerScores);
      release(1, C::kLowSlabs);  // S_B was this consumer's last read of slabs 0..3 of stage 1
      rescale(m_a);
      issue_values_ss(sm_.kv[0][C::kNopeSlabs], 0);
      softmax(s, start_b, m_b, sum_b);  // overlaps P_A V_A,0 and P_A V_A,1
      publish(s, m_b, C::kP1Ready);
      dev::wgmma_wait<0>();
      dev::fence_registers(o_);
      release(0, C::kHighSlabs);
    }
    rescale(m_b);
    add_sums(sum_b);
    uint32_t frag[C::kPvSteps][4];
    pack_p(s, frag);
    issue_values_rs(frag, 1);
    dev::wgmma_wait<0>();
    dev::fence_registers(o_);
    dev::fence_registers(frag);
    release(1, C::kHighSlabs);
  }

  // Consumer 1's side of the tile-A hand-off: P_A is in shared memory.
  __device__ void receive_p_a() {
    await_handoff(C::kP0Ready);
    if constexpr (kGathered) dev::fence_proxy_async_smem();  // V_A: generic-proxy writes (issue_scores says why)
    bad_ |= stage_bad(0);
  }

  // The hand-off with m_A, published together with P_A (every order but kSoftmaxBFirst).
  __device__ void receive_tile_a(float (&m_a)[2]) {
    receive_p_a();
    read_row_max(0, m_a);
  }

  // Consumer 1 in the kSoftmaxBFirst order: m_A, published before P_A.
  __device__ void await_row_max_a(float (&m_a)[2]) {
    await_handoff(C::kMaxAReady);
    read_row_max(0, m_a);
  }

  // Waits for the next completion of one of the hand-offs this consumer receives (each
  // completes once per wait of its receiver, so one parity bit tracks it).
  __device__ void await_handoff(int handoff) {
    dev::mbarrier_wait(&sm_.handoff[handoff], (handoff_phases_ >> handoff) & 1u);
    handoff_phases_ ^= 1u << handoff;
  }

  // The producer's bad-block flag of a stage's tile. Lane 0 of each warp reads it and arrives
  // on the stage's empty barriers (release), so its read is ordered before the producer's next
  // write by the reading thread's own arrival; the other lanes get it by shuffle.
  __device__ bool stage_bad(int stage) const {
    if constexpr (kGathered) return false;  // gathering producers mask bad slots out instead
    const int bad = lane_ == 0 ? sm_.stage_bad[stage] : 0;
    return __shfl_sync(0xffffffffu, bad, 0) != 0;
  }

  __device__ void read_row_max(int consumer, float (&m)[2]) const {
    m[0] = sm_.row_max[consumer][r0_];
    m[1] = sm_.row_max[consumer][r0_ + 8];
  }

  // ---- pieces ---------------------------------------------------------------------------

  // Visible-key bound of tile row r (0 for padding rows).
  __device__ int row_limit(int r, int L, int key_end) const {
    const int row = tile_ * C::kRows + r;
    if (row >= p_.rows) return 0;
    return min(key_end, visible_keys(p_, L, row_coord(p_, hk_, row).t));
  }

  // A segment's Q tile is copied by both consumers (all in flight at once): issued here for
  // the first segment, during the previous segment's store for the others.
  __device__ void issue_q(int seq) {
    q_issued_ = true;
    if (q_map_ != nullptr) {
      // One thread, 9 boxes of 64 rows (tokens x heads of the packed rows; rows past s_q are
      // zero-filled by the map) completing on q_full. Map coordinates (column, head, token,
      // batch): scheduled sequence seq is token seq % seq_divisor of batch entry seq /
      // seq_divisor (the sparse decode schedules one sequence per query token).
      if (t_ == 0) {
        const RowCoord rc = row_coord(p_, hk_, tile_ * C::kRows);
        const int token = seq % p_.seq_divisor + rc.t, batch = seq / p_.seq_divisor;
        dev::mbarrier_expect_tx(&sm_.q_full, C::kSlabs * C::kSlabBytes);
#pragma unroll 1
        for (int slab = 0; slab < C::kSlabs; ++slab) {
          dev::tma_load_4d(&sm_.q[slab][0], q_map_, &sm_.q_full, slab * C::kSlabCols, rc.head, token, batch);
        }
        dev::mbarrier_arrive(&sm_.q_full);
      }
      return;
    }
    if (!q_offsets_ready_) {  // the row offsets within a sequence are the same in every segment
      fill_q_row_offsets(p_, sm_, hk_, tile_, t_, C::kConsumerThreads);
      dev::named_barrier_sync(C::kBarConsumers, C::kConsumerThreads);
      q_offsets_ready_ = true;
    }
    copy_q_tile<Elem>(p_, sm_, seq, t_, C::kConsumerThreads);
  }

  __device__ void await_q() {
    q_issued_ = false;
    if (q_map_ != nullptr) {
      dev::mbarrier_wait(&sm_.q_full, q_phase_);
      q_phase_ ^= 1;
      return;
    }
    device::cp_async_wait_all();
    dev::fence_proxy_async_smem();
    dev::named_barrier_sync(C::kBarConsumers, C::kConsumerThreads);
  }

  // Starts on this consumer's tile: a tile that extends past the segment is waited for whole
  // and its cache rows past the segment (stale, or NaN past the sequence end) are zeroed in
  // the V slabs, so 0-weight P entries cannot meet NaN in P·V (the other consumer reads them
  // only after this consumer's P hand-off). Full tiles are waited for in issue_scores (by
  // slab group for TMA tiles, whole for gathered ones).
  __device__ void prepare_tile(int stage, int tile_start, int key_end) {
    const int valid_rows = min(C::kKeys, key_end - tile_start);
    if (valid_rows == C::kKeys) return;
    await_tile(stage);
    const int tid = t_ % 128;
    const int chunks = (C::kKeys - valid_rows) * C::kNopeSlabs * 8;
    for (int c = tid; c < chunks; c += 128) {
      const int r = valid_rows + c / (C::kNopeSlabs * 8), k = c % (C::kNopeSlabs * 8);
      *reinterpret_cast<uint4*>(&sm_.kv[stage][k / 8][r * 128 + (k % 8) * 16]) = make_uint4(0, 0, 0, 0);
    }
    dev::fence_proxy_async_smem();
    const int zeroed = w_ == 0 ? C::kZeroed0 : C::kZeroed1;
    dev::mbarrier_arrive(&sm_.handoff[zeroed]);
    await_handoff(zeroed);
  }

  // This consumer's arrival on a half of a stage (empty_count in decode_config.cuh lists
  // them), once its wgmma reads of those slabs have completed: one per warp, by the lane that
  // read the tile's flags (stage_bad, gathered_mask).
  __device__ void release(int stage, int half) {
    if (lane_ == 0) dev::mbarrier_arrive(&sm_.empty[stage][half]);
  }

  // Issues S = Q K^T of a stage's tile (64 x 64 over d_qk, K-major A and B, 128B swizzle,
  // SBO 1024) as one committed group. Returns the tile's bad flag.
  //   TMA tiles: each slab group's k-steps as soon as that group has landed (S overlaps the
  //   tile's own load).
  //   Gathered tiles (st.shared, cp.async: the generic proxy) need a proxy fence between the
  //   wait and the wgmma reads (the async proxy): the two-way fence.proxy.async (MEMBAR.ALL.CTA +
  //   FENCE.VIEW.ASYNC.S), by each reading thread after the barrier that showed it the data.
  //   The one-way fence.proxy.async::generic.acquire.sync_restrict::shared::cluster that stood
  //   here from b1fae7c covers shared::cluster objects only: ptxas emitted a NOP, wgmma read
  //   tiles before the producer's writes reached the async proxy, and the FP8 decode returned
  //   different bits in 61-89 of 90 calls on the same inputs, NaN rows in 16-27 (stale or
  //   uninitialised shared memory; H100, 2026-11-24, docs/kernels/mla_sparse_decode_sm90.md).
  //   The MEMBAR waits for this warpgroup's wgmmas in flight, so the fences sit where few are.
  __device__ bool issue_scores(float (&s)[32], int stage, int tile_start, int key_end) {
    prepare_tile(stage, tile_start, key_end);
    const uint64_t q_desc = dev::opaque_desc(dev::make_sw128_desc(dev::smem_u32(&sm_.q[0][0]), 16, 1024));
    const uint64_t k_desc = dev::opaque_desc(dev::make_sw128_desc(dev::smem_u32(&sm_.kv[stage][0][0]), 16, 1024));
    if constexpr (kGatheredHalves) {
      await_slabs(stage, C::kGatheredLowHalfBarrier, C::kGatheredLowHalfBarrier + 1);
      dev::fence_proxy_async_smem();
      dev::wgmma_fence();
      issue_score_slabs(s, q_desc, k_desc, 0, C::kFirstHighSlab);
      await_slabs(stage, C::kGatheredTileBarrier, C::kSlabs);
      dev::fence_proxy_async_smem();
      dev::wgmma_fence();
      issue_score_slabs(s, q_desc, k_desc, C::kFirstHighSlab, C::kSlabs);
      MLAKIT_SM90_STAMP(kConsumerHighIssued);
    } else if constexpr (kGathered) {
      await_tile(stage);
      dev::fence_proxy_async_smem();
      dev::wgmma_fence();
      issue_score_slabs(s, q_desc, k_desc, 0, C::kSlabs);
    } else {
      dev::wgmma_fence();
#pragma unroll
      for (int slab = 0; slab < C::kSlabs; ++slab) {
        if (C::group_last_slab(slab) != slab) continue;
        await_slabs(stage, slab, slab + 1);  // the group ending at this slab has landed
        issue_score_slabs(s, q_desc, k_desc, C::group_first_slab(slab), slab + 1);
      }
    }
    dev::wgmma_commit();
    phase_ ^= 1;
    return stage_bad(stage);
  }

  // Waits for the whole tile of a stage: its one barrier (gathered tiles), or the barrier of
  // each slab group (TMA tiles).
  __device__ void await_tile(int stage) {
    if constexpr (kGathered) {
      await_slabs(stage, C::kGatheredTileBarrier, C::kSlabs);
    } else {
#pragma unroll
      for (int slab = 0; slab < C::kSlabs; ++slab) {
        if (C::group_last_slab(slab) == slab) await_slabs(stage, slab, slab + 1);
      }
    }
  }

  // Waits for slabs [first, end) of a stage's tile (this lap's parity).
  __device__ void await_slabs(int stage, int first, int end) {
#pragma unroll
    for (int slab = first; slab < end; ++slab) {
      dev::mbarrier_wait(&sm_.full[stage][slab], phase_);
      constexpr int kFirstBarrier = kGatheredHalves ? C::kGatheredLowHalfBarrier
                                    : kGathered     ? C::kGatheredTileBarrier
                                                    : C::group_last_slab(0);
      if (slab == kFirstBarrier) MLAKIT_SM90_STAMP(kConsumerFirstSlab);
      if (slab == C::kSlabs - 1) MLAKIT_SM90_STAMP(kConsumerLastSlab);
    }
  }

  // The 4 k-steps of each of slabs [first, end) into S (the first k-step overwrites S).
  __device__ void issue_score_slabs(float (&s)[32], uint64_t q_desc, uint64_t k_desc, int first, int end) {
#pragma unroll
    for (int slab = first; slab < end; ++slab) {
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int kk = 4 * slab + k;
        const uint32_t offset = slab * C::kSlabBytes + k * 32;
        Mma64::template ss<0>(s, dev::advance_desc(q_desc, offset), dev::advance_desc(k_desc, offset), kk > 0);
      }
    }
  }

  // V of a stage, this consumer's 256 columns, N-major: LBO = one slab, SBO = 8 keys.
  __device__ uint64_t v_desc(int stage) const {
    return dev::opaque_desc(dev::make_sw128_desc(dev::smem_u32(&sm_.kv[stage][4 * w_][0]), C::kSlabBytes, 1024));
  }

  // O_w += P V_w with P (64 x 64, K-major) from a shared P tile.
  __device__ void issue_values_ss(const uint8_t* p_tile, int stage) {
    const uint64_t p_desc = dev::opaque_desc(dev::make_sw128_desc(dev::smem_u32(p_tile), 16, 1024));
    const uint64_t vd = v_desc(stage);
    dev::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < C::kPvSteps; ++kk) {
      Mma256::template ss<1>(o_, dev::advance_desc(p_desc, kk * 32), dev::advance_desc(vd, kk * 16 * 128), true);
    }
    dev::wgmma_commit();
  }

  // O_w += P V_w with P from this consumer's registers.
  __device__ void issue_values_rs(const uint32_t (&frag)[C::kPvSteps][4], int stage) {
    const uint64_t vd = v_desc(stage);
    dev::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < C::kPvSteps; ++kk) {
      Mma256::template rs<1>(o_, frag[kk], dev::advance_desc(vd, kk * 16 * 128), true);
    }
    dev::wgmma_commit();
  }

  // S (accumulator layout: register i is row r0 + 8((i >> 1) & 1), column 8(i >> 2) +
  // 2(lane % 4) + (i & 1)) -> scaled and masked logits, the new running max m_new =
  // max(m, rowmax) and P = 2^(S - m_new) in place, with this thread's row sums of P.
  __device__ void softmax(float (&s)[32], int tile_start, float (&m_new)[2], float (&sum)[2]) {
    float mx[2];
    scaled_logits(s, tile_start, mx);
    reference_max(mx, m_, m_new);
    exponentiate(s, m_new, sum);
  }

  // S -> scaled logits in place (-inf where the key is not visible), with the rows' max (over
  // the quad: every lane of a row gets it).
  __device__ void scaled_logits(float (&s)[32], int tile_start, float (&mx)[2]) {
    // Gathered keys (sparse prefill): the producer's mask of the slots that were valid.
    uint32_t listed = ~0u;  // bit 2 (i >> 2) + (i & 1): the key of score register i
    if constexpr (kGathered) listed = gathered_mask(w_);
    mx[0] = mx[1] = -INFINITY;
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      const int col = 8 * (i >> 2) + 2 * (lane_ % 4) + (i & 1);
      const int h = (i >> 1) & 1;
      // Gathered tiles: the producer's mask also excludes the keys past the segment (no
      // causal limit applies), so the key-position test is the dense decode's alone.
      const bool visible =
          kGathered ? ((listed >> (2 * (i >> 2) + (i & 1))) & 1u) != 0 : tile_start + col < lim_[h];
      s[i] = visible ? s[i] * p_.scale_log2 : -INFINITY;
      mx[h] = fmaxf(mx[h], s[i]);
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
      if constexpr (kMaxLogits) max_logit_[h] = fmaxf(max_logit_[h], mx[h]);
    }
#ifdef MLAKIT_SM90_TIMELINE
    dev::fence_registers(mx);
#endif
    MLAKIT_SM90_STAMP(kConsumerRowMax);
  }

  // The reference max of the exponents after a tile with row max mx, from the reference ref
  // before it: it moves only when a row's max passes ref by more than kRescaleSlack (P then
  // stays <= 2^kRescaleSlack), so O is rarely rescaled.
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
    dev::fence_registers(s);  // the stamp after the exponentials, not among them
#endif
    MLAKIT_SM90_STAMP(kConsumerExpDone);
  }

  // The valid-slot bits of the gathered tile in `stage` for this thread's 16 score columns
  // 8j + 2 (lane % 4) + {0, 1}, j = 0..7, as bits 2j, 2j + 1.
  __device__ uint32_t gathered_mask(int stage) const {
    // The four warps' 16-bit words in one load (key 8 j + c is bit 8 j + c), by lane 0, which
    // arrives on the stage's empty barrier after it (stage_bad says why).
    uint64_t loaded = 0;
    if (lane_ == 0) loaded = *reinterpret_cast<const uint64_t*>(sm_.key_valid[stage]);
    const uint64_t words = static_cast<uint64_t>(__shfl_sync(0xffffffffu, static_cast<unsigned long long>(loaded), 0)) >>
                           (2 * (lane_ % 4));
    uint32_t bits = 0;
#pragma unroll
    for (int j = 0; j < 8; ++j) bits |= static_cast<uint32_t>((words >> (8 * j)) & 3u) << (2 * j);
    return bits;
  }

  // The reference max of this consumer's tile for the other consumer (released by the next
  // hand-off arrival): with P, or ahead of it where m_A goes out first (kSoftmaxBFirst).
  __device__ void publish_row_max(const float (&m_new)[2]) {
    if (lane_ % 4 == 0) {
      sm_.row_max[w_][r0_] = m_new[0];
      sm_.row_max[w_][r0_ + 8] = m_new[1];
    }
  }

  // Writes P (q's dtype, 128B-swizzled [64 rows][64 keys]) over the RoPE slab of this
  // consumer's stage (its S is done) and the row max (kWithRowMax: false where it went out
  // ahead, kSoftmaxBFirst's m_A), then arrives on the hand-off: every thread, after its own
  // stores and the proxy fence that shows them to the other consumer's wgmma.
  template <bool kWithRowMax = true>
  __device__ void publish(const float (&s)[32], const float (&m_new)[2], int handoff) {
    // The 8 x 8 blocks of this warp's 16 rows by stmatrix, four at a time: block (h, j) (rows
    // 16 warp + 8 h .., columns 8 j ..) is registers s[4 j + 2 h], s[4 j + 2 h + 1] of each
    // thread; lane l addresses row l % 8 of block (l / 8 % 2, 2 k + l / 16) of call k, at its
    // swizzled 16-byte chunk j ^ (row % 8).
    const uint32_t tile = dev::smem_u32(sm_.kv[w_][C::kNopeSlabs]);
    const int block = lane_ / 8, row = 16 * ((t_ % 128) / 32) + 8 * (block % 2) + lane_ % 8;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int j = 2 * k + block / 2;
      dev::stmatrix_x4(tile + row * 128 + ((j ^ (lane_ % 8)) << 4), Ops::pack(s[8 * k], s[8 * k + 1]),
                       Ops::pack(s[8 * k + 2], s[8 * k + 3]), Ops::pack(s[8 * k + 4], s[8 * k + 5]),
                       Ops::pack(s[8 * k + 6], s[8 * k + 7]));
    }
    if constexpr (kWithRowMax) publish_row_max(m_new);
    dev::fence_proxy_async_smem();
    dev::mbarrier_arrive(&sm_.handoff[handoff]);
    MLAKIT_SM90_STAMP(kConsumerPublished);
  }

  // RS A-fragments of P for key block kk (keys 16kk .. 16kk+15): register r packs S[8kk + 2r]
  // (low half) and S[8kk + 2r + 1] (HOPPER_NOTES section 4).
  __device__ void pack_p(const float (&s)[32], uint32_t (&frag)[C::kPvSteps][4]) const {
#pragma unroll
    for (int kk = 0; kk < C::kPvSteps; ++kk) {
#pragma unroll
      for (int r = 0; r < 4; ++r) frag[kk][r] = Ops::pack(s[8 * kk + 2 * r], s[8 * kk + 2 * r + 1]);
    }
  }

  // Moves O and l from the running max m to m_new (>= m). O must have no wgmma in flight.
  __device__ void rescale(const float (&m_new)[2]) {
    float f[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      f[h] = m_new[h] == -INFINITY ? 1.f : device::fast_exp2(m_[h] - m_new[h]);
      l_[h] *= f[h];
      m_[h] = m_new[h];
    }
    if (__any_sync(0xffffffffu, f[0] != 1.f || f[1] != 1.f)) {
#pragma unroll
      for (int j = 0; j < 128; ++j) o_[j] *= ((j >> 1) & 1) ? f[1] : f[0];
    }
  }

  // Adds a tile's row sums, relative to the current running max.
  __device__ void add_sums(const float (&sum)[2]) {
    l_[0] += sum[0];
    l_[1] += sum[1];
  }

  // 4 x 4 transpose of 32-bit values across the 4 lanes of a quad: lane q's u[i] becomes lane
  // i's former u[q] (two exchange rounds, at distance 2 then 1).
  __device__ static void quad_transpose(uint32_t (&u)[4]) {
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

  __device__ void store(int seq, int split, int next_seq) {
    float l0 = l_[0], l1 = l_[1];
#pragma unroll
    for (int x = 1; x < 4; x *= 2) {
      l0 += __shfl_xor_sync(0xffffffffu, l0, x);
      l1 += __shfl_xor_sync(0xffffffffu, l1, x);
    }
    if (lane_ % 4 == 0) {
      sm_.row_sum[w_][r0_] = l0;
      sm_.row_sum[w_][r0_ + 8] = l1;
      if constexpr (kMaxLogits) {
        sm_.max_logit[w_][r0_] = max_logit_[0];
        sm_.max_logit[w_][r0_ + 8] = max_logit_[1];
      }
    }
    // Past this barrier both consumers' multiplies are done (each pair ends with a wait), so
    // the Q tile is dead: the next segment's Q is copied while the outputs go out.
    dev::named_barrier_sync(C::kBarConsumers, C::kConsumerThreads);
    const float sum[2] = {sm_.row_sum[0][r0_] + sm_.row_sum[1][r0_], sm_.row_sum[0][r0_ + 8] + sm_.row_sum[1][r0_ + 8]};
    if (next_seq >= 0) issue_q(next_seq);
    // No plan (sparse prefill) or a plan without splits: every segment is a whole sequence,
    // written directly (and no load waited for).
    const bool direct =
        p_.no_splits || p_.split_prefix == nullptr || p_.split_prefix[seq + 1] - p_.split_prefix[seq] == 1;
    const int64_t slot_row0 =
        (static_cast<int64_t>(direct ? 0 : p_.partial_prefix[seq] + split) * p_.h_kv + hk_) * p_.rows;
    // Final rows in q's dtype go out as 16-byte stores when every row starts 16-byte aligned:
    // a quad transpose gives each lane 8 consecutive columns (64 4-byte stores per thread left
    // the store at the end of a segment ~9000 cycles long).
    const bool wide_stores =
        direct && ((reinterpret_cast<uintptr_t>(p_.out) |
                    static_cast<uintptr_t>((p_.out_stride_b | p_.out_stride_s | p_.out_stride_h) * sizeof(Elem))) &
                   15) == 0;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = r0_ + 8 * half;
      const int row_in_range = tile_ * C::kRows + r;
      const bool row_ok = row_in_range < p_.rows;
      const int row = row_ok ? row_in_range : 0;  // padding rows compute on row 0, store nothing
      const bool empty = sum[half] == 0.f;
      const float inv = bad_ ? NAN : (empty ? 0.f : 1.f / sum[half]);
      const float lse2 = bad_ ? NAN : (empty ? -INFINITY : m_[half] + log2f(sum[half]));
      const RowCoord rc = row_coord(p_, hk_, row);
      Elem* out = static_cast<Elem*>(p_.out) + seq_offset(p_, seq, p_.out_stride_b, p_.out_stride_s) +
                  rc.t * p_.out_stride_s + rc.head * p_.out_stride_h;
      float* partial = direct ? nullptr : p_.partial_out + (slot_row0 + row) * C::kDv;
      const float scale = inv * (direct ? sink_factor(p_, rc.head, lse2 * device::kLn2) : 1.f);
      if (wide_stores) {
        // Column group g (8 columns: 256 w + 8 g + 2 (lane % 4) + {0, 1} in this lane) holds
        // o_[4 g + 2 half], o_[4 g + 2 half + 1].
#pragma unroll
        for (int m = 0; m < 8; ++m) {
          uint32_t u[4];
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const int j = 4 * (4 * m + i) + 2 * half;
            u[i] = Ops::pack(o_[j] * scale, o_[j + 1] * scale);
          }
          quad_transpose(u);  // lane q: the 8 columns of group 4 m + q
          if (row_ok) {
            const int col = C::kVColsPerConsumer * w_ + 8 * (4 * m + lane_ % 4);
            *reinterpret_cast<uint4*>(out + col) = make_uint4(u[0], u[1], u[2], u[3]);
          }
        }
      } else if (row_ok) {
#pragma unroll
        for (int j = 2 * half; j < 128; j += 4) {
          const int col = C::kVColsPerConsumer * w_ + 8 * (j >> 2) + 2 * (lane_ % 4);
          const float v0 = o_[j] * scale, v1 = o_[j + 1] * scale;
          if (direct) {
            *reinterpret_cast<uint32_t*>(out + col) = Ops::pack(v0, v1);
          } else {
            *reinterpret_cast<float2*>(partial + col) = make_float2(v0, v1);
          }
        }
      }
      if (!row_ok) continue;
      if (w_ == 0 && lane_ % 4 == 0) {
        if (direct) {
          const float to_base = p_.lse_base2 ? 1.f : device::kLn2;
          p_.lse[seq_offset(p_, seq, p_.lse_stride_b, p_.lse_stride_s) + rc.head * p_.lse_stride_h +
                 rc.t * p_.lse_stride_s] =
              lse2 == -INFINITY ? INFINITY : lse2 * to_base;
          if (kMaxLogits && p_.max_logits != nullptr) {
            p_.max_logits[seq_offset(p_, seq, p_.max_logits_stride_b, p_.max_logits_stride_s) +
                          rc.head * p_.max_logits_stride_h + rc.t * p_.max_logits_stride_s] =
                bad_ ? NAN : (empty ? -INFINITY : fmaxf(sm_.max_logit[0][r], sm_.max_logit[1][r]) * to_base);
          }
        } else {
          p_.partial_lse[slot_row0 + row] = lse2;
        }
      }
    }
    // row_sum is rewritten by the next segment.
    dev::named_barrier_sync(C::kBarConsumers, C::kConsumerThreads);
  }

  const MlaDecodeParams& p_;
  Sm90DecodeSmem& sm_;
  const CUtensorMap* const q_map_;
  const int w_, t_, lane_, r0_, hk_, tile_;
  uint32_t phase_ = 0;           // parity of this consumer's next wait on full[w][*]
  uint32_t handoff_phases_ = 0;  // bit h: parity of the next wait on handoff[h]
  int lim_[2] = {0, 0};
  // m_: the reference max of the exponents (lags the row's max by up to kRescaleSlack; LSE =
  // m_ + log2(l) holds for any reference); max_logit_: the max of this consumer's logits.
  float m_[2], l_[2], max_logit_[2];
  static constexpr float kRescaleSlack = 8.f;
  bool bad_ = false;
  bool q_offsets_ready_ = false;  // sm_.q_row_offset filled
  bool q_issued_ = false;         // the next segment's Q copy is in flight
  uint32_t q_phase_ = 0;          // parity of the next wait on q_full
  float o_[128];
};

}  // namespace mlakit::detail::sm90
