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
//
// Pieces: consumer_scores.cuh (S and the tile's flags), consumer_softmax.cuh (online softmax),
// consumer_handoff.cuh (P and row-max hand-offs), consumer_store.cuh (the segment's outputs);
// what varies between kernels is one options type (consumer_options.cuh).
#pragma once

#include <cuda.h>

#include <cmath>
#include <cstdint>

#include "device/cp_async.cuh"
#include "device/sm90/swizzle.cuh"
#include "device/sm90/sync.cuh"
#include "device/sm90/wgmma.cuh"
#include "device/sm90/wgmma_fragment.cuh"
#include "kernels/attention_rows.cuh"
#include "kernels/sm90/consumer_handoff.cuh"
#include "kernels/sm90/consumer_options.cuh"
#include "kernels/sm90/consumer_scores.cuh"
#include "kernels/sm90/consumer_softmax.cuh"
#include "kernels/sm90/consumer_store.cuh"
#include "kernels/sm90/consumer_thread.cuh"
#include "kernels/sm90/mla_config.cuh"
#include "kernels/sm90/q_tile.cuh"
#include "kernels/sm90/timeline.cuh"

namespace mlakit::detail::sm90 {

namespace dev = mlakit::device::sm90;

// Options: consumer_options.cuh. Scheduled sequence seq addresses q / out / lse through
// seq_offset (the sparse decode schedules one sequence per (batch entry, query token)).
template <class Options>
class SeesawConsumer {
  using C = Sm90MlaConfig;
  using Elem = typename Options::Elem;
  using Params = typename Options::Params;  // DenseDecodeParams, SparseDecodeParams or SparsePrefillParams
  using Ops = device::ElemOps<Elem>;
  using Mma256 = device::sm90::Wgmma<256, Elem>;
  static constexpr bool kGathered = kGatheredTiles<Options>;
  static constexpr PairOrder kOrder = Options::kOrder;

 public:
  // Rows tile * 64 .. of kv head hk.
  // q_map: the Q tile by TMA (kernels/sm90/launch.h, make_q_tensor_map); nullptr: by cp.async.
  __device__ SeesawConsumer(const Params& p, Sm90MlaSmem& sm, int tile, int hk,
                          const CUtensorMap* q_map = nullptr)
      : p_(p), sm_(sm), q_map_(q_map), hk_(hk), tile_(tile), scores_(sm, me_), handoffs_(sm, me_) {}

  // Every segment of a part in order, each told the next one's sequence (planned operations).
  __device__ void run_part(const PartRange& range) {
    SegmentCursor cursor(p_.core, p_.schedule, range);
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
    if constexpr (Params::kPlanned) {
      if (!p_.schedule.no_splits && me_.t == 0) {
        device::prefetch_l2(p_.schedule.split_prefix + seq);
        device::prefetch_l2(p_.schedule.partial_prefix + seq);
      }
    }
    await_q();
    MLAKIT_SM90_STAMP(kConsumerQLoaded);
    lim_[0] = row_limit(me_.r0, L, key_end);
    lim_[1] = row_limit(me_.r0 + 8, L, key_end);
#pragma unroll
    for (int j = 0; j < C::kOutRegs; ++j) o_[j] = 0.f;
    softmax_.reset();
    bad_ = false;
    const int tiles = segment_tiles(p_.core, hk_, tile_, L, key_begin, key_end);
    for (int i = 0; i < tiles; i += 2) {
      const int start_a = key_begin + i * C::kKeys;
      const bool has_b = i + 1 < tiles;
      MLAKIT_SM90_STAMP(kConsumerPairStart);
      if (me_.w == 0) {
        pair_consumer0(start_a, has_b, key_end);
      } else if (!has_b) {
        lone_tile_consumer1();
      } else {
        pair_consumer1(start_a + C::kKeys, key_end);
      }
      MLAKIT_SM90_STAMP(kConsumerPairEnd);
    }
    store_segment<Options>(p_, sm_, me_, tile_, hk_, o_, softmax_, bad_, seq, split, [&] {
      if (next_seq >= 0) issue_q(next_seq);
    });
    MLAKIT_SM90_STAMP(kConsumerStored);
  }

 private:
  // ---- one pair of tiles, per consumer --------------------------------------------------

  __device__ void pair_consumer0(int start_a, bool has_b, int key_end) {
    float s[32];
    bad_ |= scores_.issue(s, 0, start_a, key_end, handoffs_);
    dev::wgmma_wait<0>();  // S_A, and the previous pair's P_B V_B,0
    dev::fence_registers(s);
    MLAKIT_SM90_STAMP(kConsumerScores);
    release(0, C::kHighSlabs);  // S_A was this consumer's last read of slabs 4..8 of stage 0
    float m_a[2], sum_a[2];
    if constexpr (kOrder == PairOrder::kSoftmaxBFirst) {
      float mx[2];
      scaled_logits(s, start_a, mx);
      Softmax::reference_max(mx, softmax_.m, m_a);
      handoffs_.publish_row_max(m_a);
      handoffs_.arrive(C::kMaxAReady);
      dev::fence_registers(s);  // the exponentials after the arrival (see pair_consumer1)
      Softmax::exponentiate(s, m_a, sum_a);
      handoffs_.template publish<false>(s, m_a, C::kP0Ready);
    } else {
      softmax(s, start_a, m_a, sum_a);
      handoffs_.publish(s, m_a, C::kP0Ready);
    }
    softmax_.rescale(o_, m_a);  // no wgmma pending on O: the wait above covered them
    softmax_.add_sums(sum_a);
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
      handoffs_.await(C::kP1Ready);
      MLAKIT_SM90_STAMP(kConsumerHandoff);
      if constexpr (kGathered) dev::fence_proxy_async_smem();  // V_B: generic-proxy writes (ScoreTiles::issue says why)
      bad_ |= scores_.stage_bad(1);
      float m_b[2];
      handoffs_.read_row_max(1, m_b);
      softmax_.rescale(o_, m_b);
      issue_values_ss(sm_.kv[1][C::kNopeSlabs], 1);
      dev::wgmma_wait<0>();
      dev::fence_registers(o_);
      release(1, C::kLowSlabs);
      release(1, C::kHighSlabs);  // P_B was read from slab 8
    }
  }

  // A lone tile A at the end of a segment: only its P·V for this consumer's columns.
  __device__ void lone_tile_consumer1() {
    float m_a[2];
    if constexpr (kOrder == PairOrder::kSoftmaxBFirst) {
      await_row_max_a(m_a);
      receive_p_a();
    } else {
      receive_tile_a(m_a);
    }
    softmax_.rescale(o_, m_a);
    issue_values_ss(sm_.kv[0][C::kNopeSlabs], 0);
    dev::wgmma_wait<0>();
    dev::fence_registers(o_);
    release(0, C::kHighSlabs);
  }

  // Consumer 1 over a pair: P_A V_A,1 and tile B's S, softmax and P_B V_B,1 in kOrder's order
  // (each order's function leaves P_B in s, with m_B and its row sums), then P_B V_B,1.
  __device__ void pair_consumer1(int start_b, int key_end) {
    float s[32], m_b[2], sum_b[2];
    if constexpr (kOrder == PairOrder::kSoftmaxBFirst) {
      softmax_b_first(s, start_b, key_end, m_b, sum_b);
    } else if constexpr (kOrder == PairOrder::kPvA1First) {
      pv_a1_first(s, start_b, key_end, m_b, sum_b);
    } else {
      pv_a1_during_softmax_b(s, start_b, key_end, m_b, sum_b);
    }
    softmax_.rescale(o_, m_b);
    softmax_.add_sums(sum_b);
    uint32_t frag[C::kPvSteps][4];
    pack_p(s, frag);
    issue_values_rs(frag, 1);
    dev::wgmma_wait<0>();
    dev::fence_registers(o_);
    dev::fence_registers(frag);
    release(1, C::kHighSlabs);
  }

  // PairOrder::kSoftmaxBFirst.
  __device__ void softmax_b_first(float (&s)[32], int start_b, int key_end, float (&m_b)[2], float (&sum_b)[2]) {
    bad_ |= scores_.issue(s, 1, start_b, key_end, handoffs_);
    dev::wgmma_wait<0>();
    dev::fence_registers(s);
    MLAKIT_SM90_STAMP(kConsumerScores);
    float mx[2], m_a[2];
    scaled_logits(s, start_b, mx);
    // S_B and the valid-slot mask (read by scaled_logits) were this consumer's last reads
    // of what the producer rewrites with slabs 0..3 of stage 1.
    release(1, C::kLowSlabs);
    // Register fences pin the softmax between the barrier waits: the compiler otherwise sank
    // the logits and the exponentials below both waits (register-only work is free to move
    // across a barrier), which serialised softmax B behind softmax A again.
    dev::fence_registers(s);
    dev::fence_registers(mx);
    await_row_max_a(m_a);
    Softmax::reference_max(mx, m_a, m_b);
    Softmax::exponentiate(s, m_b, sum_b);
    dev::fence_registers(s);
    // P_A is taken before P_B is published: consumer 0 publishes the next pair's m_A and P_A
    // only after it has P_B, so each hand-off completes once per pair.
    receive_p_a();
    MLAKIT_SM90_STAMP(kConsumerHandoff);
    handoffs_.publish(s, m_b, C::kP1Ready);
    softmax_.rescale(o_, m_a);  // no wgmma in flight
    issue_values_ss(sm_.kv[0][C::kNopeSlabs], 0);
    dev::wgmma_wait<0>();  // O moves on to m_B next
    dev::fence_registers(o_);
    release(0, C::kHighSlabs);
  }

  // PairOrder::kPvA1First: P_A V_A,1 runs while tile B lands, and frees stage 0 sooner.
  __device__ void pv_a1_first(float (&s)[32], int start_b, int key_end, float (&m_b)[2], float (&sum_b)[2]) {
    float m_a[2];
    receive_tile_a(m_a);
    MLAKIT_SM90_STAMP(kConsumerHandoff);
    softmax_.rescale(o_, m_a);  // no wgmma in flight: the previous pair ended with a wait
    issue_values_ss(sm_.kv[0][C::kNopeSlabs], 0);
    bad_ |= scores_.issue(s, 1, start_b, key_end, handoffs_);
    dev::wgmma_wait<0>();  // P_A V_A,1 and S_B
    dev::fence_registers(s);
    dev::fence_registers(o_);
    MLAKIT_SM90_STAMP(kConsumerScores);
    release(0, C::kHighSlabs);
    softmax(s, start_b, m_b, sum_b);
    handoffs_.publish(s, m_b, C::kP1Ready);
    // S_B and the valid-slot mask (read by the softmax) were this consumer's last reads of
    // what the producer rewrites with slabs 0..3 of stage 1.
    release(1, C::kLowSlabs);
  }

  // PairOrder::kPvA1DuringSoftmaxB.
  __device__ void pv_a1_during_softmax_b(float (&s)[32], int start_b, int key_end, float (&m_b)[2],
                                         float (&sum_b)[2]) {
    float m_a[2];
    bad_ |= scores_.issue(s, 1, start_b, key_end, handoffs_);  // queued behind S_A: the tensor cores work through softmax A
    receive_tile_a(m_a);
    MLAKIT_SM90_STAMP(kConsumerHandoff);
    // O is rescaled outside any wgmma group in flight (ptxas serialises the pipeline
    // otherwise), so S_B is waited for first; it was issued long before.
    dev::wgmma_wait<0>();
    dev::fence_registers(s);
    MLAKIT_SM90_STAMP(kConsumerScores);
    release(1, C::kLowSlabs);  // S_B was this consumer's last read of slabs 0..3 of stage 1
    softmax_.rescale(o_, m_a);
    issue_values_ss(sm_.kv[0][C::kNopeSlabs], 0);
    softmax(s, start_b, m_b, sum_b);  // overlaps P_A V_A,0 and P_A V_A,1
    handoffs_.publish(s, m_b, C::kP1Ready);
    dev::wgmma_wait<0>();
    dev::fence_registers(o_);
    release(0, C::kHighSlabs);
  }

  // Consumer 1's side of the tile-A hand-off: P_A is in shared memory.
  __device__ void receive_p_a() {
    handoffs_.await(C::kP0Ready);
    if constexpr (kGathered) dev::fence_proxy_async_smem();  // V_A: generic-proxy writes (ScoreTiles::issue says why)
    bad_ |= scores_.stage_bad(0);
  }

  // The hand-off with m_A, published together with P_A (every order but kSoftmaxBFirst).
  __device__ void receive_tile_a(float (&m_a)[2]) {
    receive_p_a();
    handoffs_.read_row_max(0, m_a);
  }

  // Consumer 1 in the kSoftmaxBFirst order: m_A, published before P_A.
  __device__ void await_row_max_a(float (&m_a)[2]) {
    handoffs_.await(C::kMaxAReady);
    handoffs_.read_row_max(0, m_a);
  }

  // ---- pieces ---------------------------------------------------------------------------

  using Softmax = OnlineSoftmax<Options::kMaxLogits>;

  // The online softmax of this consumer's tile: the new reference max m_new, P in place, row
  // sums of P.
  __device__ void softmax(float (&s)[32], int tile_start, float (&m_new)[2], float (&sum)[2]) {
    float mx[2];
    scaled_logits(s, tile_start, mx);
    Softmax::reference_max(mx, softmax_.m, m_new);
    Softmax::exponentiate(s, m_new, sum);
  }

  // Scaled logits, -inf where the key is not visible: gathered tiles by the producer's mask of
  // the slots that were valid (it also excludes keys past the segment; no causal limit
  // applies), TMA tiles by the row's visible-key bound.
  __device__ void scaled_logits(float (&s)[32], int tile_start, float (&mx)[2]) {
    if constexpr (kGathered) {
      const uint32_t listed = scores_.gathered_mask(me_.w);  // bit 2 (i >> 2) + (i & 1): key of register i
      softmax_.scaled_logits(s, p_.core.scale_log2, [&](int i) { return ((listed >> (2 * (i >> 2) + (i & 1))) & 1u) != 0; },
                             mx);
    } else {
      // Column of register i: dev::acc_col(lane, i) = lane_col + 8 (i >> 2) + (i & 1), summed
      // in this order (tile_start + acc_col(lane, i) compiles to other address arithmetic).
      const int lane_col = dev::acc_col(me_.lane, 0);
      softmax_.scaled_logits(
          s, p_.core.scale_log2,
          [&](int i) { return tile_start + 8 * (i >> 2) + lane_col + (i & 1) < lim_[dev::acc_row_half(i)]; }, mx);
    }
  }

  // Visible-key bound of tile row r (0 for padding rows).
  __device__ int row_limit(int r, int L, int key_end) const {
    const int row = tile_ * C::kRows + r;
    if (row >= p_.core.rows) return 0;
    return min(key_end, visible_keys(p_.core, L, row_coord(p_.core, hk_, row).t));
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
      if (me_.t == 0) {
        const RowCoord rc = row_coord(p_.core, hk_, tile_ * C::kRows);
        const int token = seq % p_.core.seq_divisor + rc.t, batch = seq / p_.core.seq_divisor;
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
      fill_q_row_offsets(p_.core, sm_, hk_, tile_, me_.t, C::kConsumerThreads);
      dev::named_barrier_sync(C::kBarConsumers, C::kConsumerThreads);
      q_offsets_ready_ = true;
    }
    copy_q_tile<Elem>(p_.core, sm_, seq, me_.t, C::kConsumerThreads);
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

  // This consumer's arrival on a half of a stage (empty_count in mla_config.cuh lists
  // them), once its wgmma reads of those slabs have completed: one per warp, by the lane that
  // read the tile's flags (ScoreTiles::stage_bad, gathered_mask).
  __device__ void release(int stage, int half) {
    if (me_.lane == 0) dev::mbarrier_arrive(&sm_.empty[stage][half]);
  }

  // V of a stage, this consumer's 256 columns, N-major: LBO = one slab, SBO = 8 keys.
  __device__ uint64_t v_desc(int stage) const {
    return dev::opaque_desc(dev::make_sw128_desc(dev::smem_u32(&sm_.kv[stage][4 * me_.w][0]), C::kSlabBytes, 1024));
  }

  // O_w += P V_w with P (64 x 64, K-major) from a shared P tile.
  __device__ void issue_values_ss(const uint8_t* p_tile, int stage) {
    const uint64_t p_desc = dev::opaque_desc(dev::make_sw128_desc(dev::smem_u32(p_tile), 16, 1024));
    const uint64_t vd = v_desc(stage);
    dev::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < C::kPvSteps; ++kk) {
      Mma256::template ss<1>(o_, dev::advance_desc(p_desc, kk * 32), dev::advance_desc(vd, kk * 16 * dev::kSwizzleRowBytes), true);
    }
    dev::wgmma_commit();
  }

  // O_w += P V_w with P from this consumer's registers.
  __device__ void issue_values_rs(const uint32_t (&frag)[C::kPvSteps][4], int stage) {
    const uint64_t vd = v_desc(stage);
    dev::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < C::kPvSteps; ++kk) {
      Mma256::template rs<1>(o_, frag[kk], dev::advance_desc(vd, kk * 16 * dev::kSwizzleRowBytes), true);
    }
    dev::wgmma_commit();
  }

  // RS A-fragments of P for key block kk (keys 16kk .. 16kk+15): register r packs S[8kk + 2r]
  // (low half) and S[8kk + 2r + 1] (docs/hopper.md, wgmma fragments).
  __device__ static void pack_p(const float (&s)[32], uint32_t (&frag)[C::kPvSteps][4]) {
#pragma unroll
    for (int kk = 0; kk < C::kPvSteps; ++kk) {
#pragma unroll
      for (int r = 0; r < 4; ++r) frag[kk][r] = Ops::pack(s[8 * kk + 2 * r], s[8 * kk + 2 * r + 1]);
    }
  }

  const Params& p_;
  Sm90MlaSmem& sm_;
  const CUtensorMap* const q_map_;
  const ConsumerThread me_;
  const int hk_, tile_;
  ScoreTiles<Options> scores_;
  ConsumerHandoffs<Elem> handoffs_;
  Softmax softmax_;
  int lim_[2] = {0, 0};
  bool bad_ = false;
  bool q_offsets_ready_ = false;  // sm_.q_row_offset filled
  bool q_issued_ = false;         // the next segment's Q copy is in flight
  uint32_t q_phase_ = 0;          // parity of the next wait on q_full
  float o_[C::kOutRegs];
};

}  // namespace mlakit::detail::sm90
