// Reading the role timelines that a traced Hopper kernel wrote (src/kernels/sm90/timeline.cuh):
// one CTA's records per role, and running statistics of cycle intervals. Shared by the
// timeline tools (bench/timeline.cu, bench/decode_timeline.cpp); each is its own executable.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/sm90/timeline.cuh"

namespace timeline_tool {

using TimelineEvent = ::mlakit::detail::sm90::TimelineEvent;
// Producer warp 0, consumer 0, consumer 1, producer warps 1..3 (src/kernels/sm90/timeline.cuh).
inline constexpr int kRoles = ::mlakit::detail::sm90::kTimelineRoles;

// An event's name for listings (a switch, so a new event without a name is a -Wswitch warning).
inline const char* event_name(TimelineEvent e) {
  switch (e) {
    case TimelineEvent::kProducerStageLowFree: return "P  low half free";
    case TimelineEvent::kProducerStageHighFree: return "P  high half free";
    case TimelineEvent::kProducerTileIssued: return "P  tile issued";
    case TimelineEvent::kConsumerQLoaded: return "C  Q loaded";
    case TimelineEvent::kConsumerPairStart: return "C  pair start";
    case TimelineEvent::kConsumerFirstSlab: return "C  own first slab";
    case TimelineEvent::kConsumerLastSlab: return "C  own last slab";
    case TimelineEvent::kConsumerScores: return "C  S done";
    case TimelineEvent::kConsumerHandoff: return "C  P hand-off";
    case TimelineEvent::kConsumerPairEnd: return "C  pair end";
    case TimelineEvent::kConsumerStored: return "C  stored";
    case TimelineEvent::kConsumerPublished: return "C  P published";
    case TimelineEvent::kConsumerHighIssued: return "C  S high half issued";
    case TimelineEvent::kConsumerRowMax: return "C  row max";
    case TimelineEvent::kConsumerExpDone: return "C  P in registers";
  }
  return "?";
}

// A role's short name: P0..P3 the producer warps, C0 / C1 the consumers.
inline const char* role_name(int role) {
  static const char* const kNames[kRoles] = {"P0", "C0", "C1", "P1", "P2", "P3"};
  return role >= 0 && role < kRoles ? kNames[role] : "?";
}

struct Record {
  TimelineEvent event;
  uint32_t clock;
};

// The records of one role, and the clocks of its k-th occurrence of each event.
struct RoleTrace {
  std::vector<Record> records;
  std::vector<uint32_t> at(TimelineEvent e) const {
    std::vector<uint32_t> out;
    for (const Record& r : records) {
      if (r.event == e) out.push_back(r.clock);
    }
    return out;
  }
};

// The roles of traced CTA `cta` from the raw [ctas][3][capacity] buffer (zeroed before the
// run, so a zero record ends a role's list).
inline void read_roles(const std::vector<uint64_t>& raw, int cta, int capacity, RoleTrace (&role)[kRoles]) {
  for (int r = 0; r < kRoles; ++r) {
    role[r].records.clear();
    for (int k = 0; k < capacity; ++k) {
      const uint64_t v = raw[(static_cast<size_t>(cta) * kRoles + r) * capacity + k];
      if (v == 0) break;
      role[r].records.push_back({static_cast<TimelineEvent>(v >> 32), static_cast<uint32_t>(v)});
    }
  }
}

// Mean and range of a series of cycle counts.
struct Stat {
  double sum = 0, lo = 1e30, hi = -1e30;
  int n = 0;
  void add(double v) {
    sum += v;
    lo = std::min(lo, v);
    hi = std::max(hi, v);
    ++n;
  }
  double mean() const { return n > 0 ? sum / n : 0; }
};

}  // namespace timeline_tool
