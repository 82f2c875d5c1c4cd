// Optional event timeline of the Hopper kernels' roles, for diagnosis: where a tile's time
// goes (the producer's waits and issue, each consumer's waits and hand-offs), per CTA, in SM
// clock cycles. Compiled in only where MLAKIT_SM90_TIMELINE is defined (bench/timeline.cu,
// which builds its own copy of the kernel); elsewhere every stamp is empty and the library's
// kernels carry no trace of it.
//
// Thread 0 of each warpgroup (role 0: producer warp 0, 1 and 2: consumers 0 and 1) and lane 0
// of producer warps 1..3 (roles 3..5: the slab barriers wait for the slowest producer warp) of
// the traced CTAs [first_cta, first_cta + ctas) (linear CTA index, x fastest) append (event <<
// 32 | low 32 bits of clock64) records to their row of `records` ([ctas][kTimelineRoles]
// [capacity]); the row's count is kept in shared memory. Where `cta_spans` is set, every CTA also writes the global timer
// (ns, comparable across SMs) at its start and at its consumers' end ([grid CTAs][2]).
#pragma once

#include <cstdint>

#include "device/sm90/warpgroup.cuh"
#include "device/special_registers.cuh"

namespace mlakit::detail::sm90 {

enum class TimelineEvent : uint32_t {
  kProducerStageLowFree,   // the producer passed empty[stage][low]: tile issue starts
  kProducerStageHighFree,  // ... empty[stage][high]
  kProducerTileIssued,     // every copy of the tile issued (before the warp's mask arrival)
  kConsumerQLoaded,        // segment start: Q in shared memory
  kConsumerPairStart,
  kConsumerFirstSlab,      // the first barrier of the consumer's own tile passed (slab group 0; gathered: its one barrier)
  kConsumerLastSlab,       // full[stage][8] passed: S fully issued
  kConsumerScores,         // S done (wgmma wait)
  kConsumerHandoff,        // the other consumer's P received (bar.sync passed)
  kConsumerPairEnd,
  kConsumerStored,         // segment outputs written
  kConsumerPublished,      // own P tile and row max published to the other consumer
  kConsumerHighIssued,     // gathered halves: S over the tile's high half issued
  kConsumerRowMax,         // softmax: scaled logits and row max done
  kConsumerExpDone,        // softmax: P and row sums in registers
};

inline constexpr int kTimelineRoles = 6;  // producer warp 0, consumers 0 and 1, producer warps 1..3

struct TimelineBuffer {
  uint64_t* records = nullptr;
  int first_cta = 0;
  int ctas = 0;
  int capacity = 0;  // records per role
  uint64_t* cta_spans = nullptr;
};

#ifdef MLAKIT_SM90_TIMELINE
__device__ TimelineBuffer g_timeline;
__shared__ uint32_t timeline_count[kTimelineRoles];  // records written per role

// Before the kernel's first CTA-wide barrier.
__device__ __forceinline__ void timeline_reset() {
  if (threadIdx.x < kTimelineRoles) timeline_count[threadIdx.x] = 0;
}

__device__ __forceinline__ int64_t timeline_linear_cta() {
  return blockIdx.x + static_cast<int64_t>(gridDim.x) * (blockIdx.y + static_cast<int64_t>(gridDim.y) * blockIdx.z);
}

// Global timer of this CTA's start (end = false) or end, by one thread.
__device__ __forceinline__ void timeline_cta_span(bool end) {
  if (g_timeline.cta_spans == nullptr) return;
  g_timeline.cta_spans[2 * timeline_linear_cta() + (end ? 1 : 0)] = device::globaltimer();
}

// The clock is read before anything that depends on a load: g_timeline's fields can miss L1
// (the gathers evict it) and wait behind a role's loads in flight, which put stamps up to
// ~1,000 cycles late when the clock was read after the `cta` test.
__device__ __forceinline__ void timeline_stamp(TimelineEvent e) {
  const uint32_t clock = static_cast<uint32_t>(clock64());
  using device::sm90::kWarpgroupThreads, device::sm90::kWarpSize, device::sm90::kWarpsPerWarpgroup;
  const int warp = threadIdx.x / kWarpSize;
  const bool recorder =
      threadIdx.x % kWarpgroupThreads == 0 || (warp < kWarpsPerWarpgroup && threadIdx.x % kWarpSize == 0);
  if (!recorder) return;
  const int64_t cta = timeline_linear_cta() - g_timeline.first_cta;
  if (cta < 0 || cta >= g_timeline.ctas) return;
  const int role = threadIdx.x % kWarpgroupThreads == 0 ? threadIdx.x / kWarpgroupThreads : 2 + warp;
  const uint32_t n = timeline_count[role];
  if (n < static_cast<uint32_t>(g_timeline.capacity)) {
    g_timeline.records[(static_cast<int64_t>(cta) * kTimelineRoles + role) * g_timeline.capacity + n] =
        (static_cast<uint64_t>(e) << 32) | clock;
  }
  timeline_count[role] = n + 1;
}
#define MLAKIT_SM90_TIMELINE_RESET() ::mlakit::detail::sm90::timeline_reset()
#define MLAKIT_SM90_STAMP(event) ::mlakit::detail::sm90::timeline_stamp(::mlakit::detail::sm90::TimelineEvent::event)
#define MLAKIT_SM90_CTA_SPAN(end) ::mlakit::detail::sm90::timeline_cta_span(end)
#else
#define MLAKIT_SM90_TIMELINE_RESET() ((void)0)
#define MLAKIT_SM90_STAMP(event) ((void)0)
#define MLAKIT_SM90_CTA_SPAN(end) ((void)0)
#endif

}  // namespace mlakit::detail::sm90
