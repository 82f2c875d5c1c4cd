// The Hopper consumers' hand-offs through shared memory (Sm90MlaSmem::handoff, mbarriers of
// 128 arrivals, Sm90MlaConfig::kP0Ready ..): a consumer publishes its P tile over the dead
// RoPE slab of its stage, and its reference row max, for the other consumer's P·V.
//
// Every thread of the writer arrives after its own stores (and the proxy fence that shows them
// to the other consumer's wgmma), every thread of the reader waits: compute-sanitizer racecheck
// follows an exchange only when each accessing thread takes part in the barrier itself
// (docs/kernels/mla_decode_sm90.md, "Every shared-memory exchange between roles").
#pragma once

#include <cstdint>

#include "device/numeric.cuh"
#include "device/sm90/matrix_store.cuh"
#include "device/sm90/swizzle.cuh"
#include "device/sm90/sync.cuh"
#include "kernels/sm90/consumer_thread.cuh"
#include "kernels/sm90/mla_config.cuh"
#include "kernels/sm90/timeline.cuh"

namespace mlakit::detail::sm90 {

template <typename Elem>
class ConsumerHandoffs {
  using C = Sm90MlaConfig;
  using Ops = device::ElemOps<Elem>;

 public:
  __device__ ConsumerHandoffs(Sm90MlaSmem& sm, ConsumerThread me) : sm_(sm), me_(me) {}

  __device__ void arrive(int handoff) { device::sm90::mbarrier_arrive(&sm_.handoff[handoff]); }

  // Waits for the next completion of a hand-off this thread receives (each completes once per
  // wait of its receiver, so one parity bit tracks it).
  __device__ void await(int handoff) {
    device::sm90::mbarrier_wait(&sm_.handoff[handoff], (phases_ >> handoff) & 1u);
    phases_ ^= 1u << handoff;
  }

  // The reference max of this consumer's tile for the other consumer (released by the next
  // arrival): with P, or ahead of it where m_A goes out first (PairOrder::kSoftmaxBFirst).
  __device__ void publish_row_max(const float (&m_new)[2]) {
    if (me_.lane % 4 == 0) {
      sm_.row_max[me_.w][me_.r0] = m_new[0];
      sm_.row_max[me_.w][me_.r0 + 8] = m_new[1];
    }
  }

  // The reference max that consumer `consumer` published, for this thread's rows.
  __device__ void read_row_max(int consumer, float (&m)[2]) const {
    m[0] = sm_.row_max[consumer][me_.r0];
    m[1] = sm_.row_max[consumer][me_.r0 + 8];
  }

  // Writes P (q's dtype, 128B-swizzled [64 rows][64 keys]) over the RoPE slab of this
  // consumer's stage (its S is done) and the row max (kWithRowMax: false where it went out
  // ahead), then arrives on `handoff`.
  template <bool kWithRowMax = true>
  __device__ void publish(const float (&s)[32], const float (&m_new)[2], int handoff) {
    // The 8 x 8 blocks of this warp's 16 rows by stmatrix, four at a time: block (h, j) (rows
    // 16 warp + 8 h .., columns 8 j ..) is registers s[4 j + 2 h], s[4 j + 2 h + 1] of each
    // thread; lane l addresses row l % 8 of block (l / 8 % 2, 2 k + l / 16) of call k, at its
    // swizzled 16-byte chunk j (row % 8 = lane % 8).
    namespace dev = device::sm90;
    const uint32_t tile = dev::smem_u32(sm_.kv[me_.w][C::kNopeSlabs]);
    const int block = me_.lane / 8;
    const int row = 16 * ((me_.t % dev::kWarpgroupThreads) / dev::kWarpSize) + 8 * (block % 2) + me_.lane % 8;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int j = 2 * k + block / 2;
      device::sm90::stmatrix_x4(tile + row * dev::kSwizzleRowBytes + dev::sw128_chunk_offset(me_.lane, j), Ops::pack(s[8 * k], s[8 * k + 1]),
                                Ops::pack(s[8 * k + 2], s[8 * k + 3]), Ops::pack(s[8 * k + 4], s[8 * k + 5]),
                                Ops::pack(s[8 * k + 6], s[8 * k + 7]));
    }
    if constexpr (kWithRowMax) publish_row_max(m_new);
    device::sm90::fence_proxy_async_smem();
    arrive(handoff);
    MLAKIT_SM90_STAMP(kConsumerPublished);
  }

 private:
  Sm90MlaSmem& sm_;
  const ConsumerThread me_;  // by value: plain registers, no address taken
  uint32_t phases_ = 0;  // bit h: parity of the next wait on handoff[h]
};

}  // namespace mlakit::detail::sm90
