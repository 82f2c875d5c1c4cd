// mlakit-timeline: where a tile's time goes in the Hopper sparse prefill. Builds its own copy
// of the kernel with the role timeline compiled in (src/kernels/sm90/timeline.cuh); the
// target renames the namespace (-Dmlakit=mlakit_timeline), so this copy never shares a symbol
// with the library's kernel. Runs the benchmark's shape (s_q 4096, topk 2048, d_qk 576,
// indices uniform over s_kv), traces a few CTAs of the middle of the grid and prints, in SM
// cycles, the producer's issue and waits, the landing of each tile's first and last slab
// after its issue, and the consumers' pair phases.
// Usage: mlakit-timeline [h_q (128)] [s_kv (8192)] [traced CTAs (8)] [s_q (4096)]
// (a small s_q leaves most SMs idle: per-CTA times then tell a per-SM limit from a
// GPU-wide one)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "dispatch/mla_sparse_prefill_params.h"
#include "dispatch/tma_tensor.h"
#include "bench/timeline_trace.h"
#include "kernels/sm90/launch.h"
#include "kernels/sm90/mla_sparse_prefill_sm90_kernel.cuh"

#ifndef MLAKIT_SM90_TIMELINE
#error "mlakit-timeline needs MLAKIT_SM90_TIMELINE (set by its CMake target)"
#endif

namespace {

using mlakit::detail::sm90::TimelineBuffer;
using timeline_tool::RoleTrace;
using timeline_tool::Stat;
using timeline_tool::TimelineEvent;

#define CHECK_CUDA(call)                                                                    \
  do {                                                                                      \
    const cudaError_t e_ = (call);                                                          \
    if (e_ != cudaSuccess) {                                                                \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      std::exit(1);                                                                         \
    }                                                                                       \
  } while (0)

__device__ uint32_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  return static_cast<uint32_t>(x);
}
__global__ void fill_uniform_bf16(__nv_bfloat16* x, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    x[i] = __float2bfloat16(static_cast<float>(mix(seed * 0x9e3779b97f4a7c15ull + i) % 2001) / 1000.f - 1.f);
  }
}
__global__ void fill_indices(int32_t* x, int64_t n, int32_t s_kv, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    x[i] = static_cast<int32_t>(mix(seed * 0x9e3779b97f4a7c15ull + i) % static_cast<uint32_t>(s_kv));
  }
}

template <typename T>
T* device_alloc(int64_t n) {
  T* p = nullptr;
  CHECK_CUDA(cudaMalloc(&p, n * sizeof(T)));
  return p;
}

}  // namespace

int main(int argc, char** argv) {
  const int h_q = argc > 1 ? std::atoi(argv[1]) : 128;
  const int s_kv = argc > 2 ? std::atoi(argv[2]) : 8192;
  const int traced = argc > 3 ? std::atoi(argv[3]) : 8;
  const int s_q = argc > 4 ? std::atoi(argv[4]) : 4096;
  constexpr int kTopk = 2048, kDqk = 576, kDv = 512, kCapacity = 1024;
  using C = mlakit::detail::sm90::Sm90MlaConfig;
  const int row_tiles = (h_q + C::kRows - 1) / C::kRows;
  const int grid = s_q * row_tiles;

  auto* q = device_alloc<__nv_bfloat16>(int64_t{s_q} * h_q * kDqk);
  auto* kv = device_alloc<__nv_bfloat16>(int64_t{s_kv} * kDqk);
  auto* indices = device_alloc<int32_t>(int64_t{s_q} * kTopk);
  auto* out = device_alloc<__nv_bfloat16>(int64_t{s_q} * h_q * kDv);
  auto* max_logits = device_alloc<float>(int64_t{s_q} * h_q);
  auto* lse = device_alloc<float>(int64_t{s_q} * h_q);
  fill_uniform_bf16<<<1024, 256>>>(q, int64_t{s_q} * h_q * kDqk, 1);
  fill_uniform_bf16<<<1024, 256>>>(kv, int64_t{s_kv} * kDqk, 2);
  fill_indices<<<1024, 256>>>(indices, int64_t{s_q} * kTopk, s_kv, 3);
  CHECK_CUDA(cudaGetLastError());

  mlakit::MlaSparsePrefillArgs args;
  args.q = mlakit::make_tensor(q, mlakit::DType::kBF16, {s_q, h_q, kDqk});
  args.kv = mlakit::make_tensor(kv, mlakit::DType::kBF16, {s_kv, 1, kDqk});
  args.indices = mlakit::make_tensor(indices, mlakit::DType::kInt32, {s_q, 1, kTopk});
  args.out = mlakit::make_tensor(out, mlakit::DType::kBF16, {s_q, h_q, kDv});
  args.max_logits = mlakit::make_tensor(max_logits, mlakit::DType::kFP32, {s_q, h_q});
  args.lse = mlakit::make_tensor(lse, mlakit::DType::kFP32, {s_q, h_q});
  const mlakit::detail::SparsePrefillShape shape{s_q, s_kv, h_q, kDqk, kTopk};
  const mlakit::detail::SparsePrefillParams params =
      mlakit::detail::sparse_prefill_params(args, shape, 1.f / std::sqrt(static_cast<float>(kDqk)));

  // Trace CTAs of the middle of the grid: every SM is busy and the L2 is warm.
  TimelineBuffer buffer;
  buffer.first_cta = grid / 2 / row_tiles * row_tiles;
  buffer.ctas = traced;
  buffer.capacity = kCapacity;
  buffer.records = device_alloc<uint64_t>(int64_t{traced} * timeline_tool::kRoles * kCapacity);
  CHECK_CUDA(cudaMemcpyToSymbol(mlakit::detail::sm90::g_timeline, &buffer, sizeof(buffer)));

  CUtensorMap q_map;  // as the library's dispatch: the Q tile by TMA where the map exists
  std::string why;
  const bool q_by_tma = mlakit::detail::make_sparse_prefill_q_tensor_map(mlakit::detail::tma_tensor(args.q), &q_map, &why);
  // The timeline traces the d_qk 576 instance (its cases are the benchmark's).
  auto kernel = &mlakit::detail::sm90::mla_sparse_prefill_sm90_kernel<__nv_bfloat16, mlakit::detail::sm90::Sm90MlaConfig::kSlabs>;
  CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  mlakit::detail::sm90::kSm90SmemBytes));
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  float ms = 0;
  for (int run = 0; run < 3; ++run) {  // the last run's records stay
    CHECK_CUDA(cudaMemset(buffer.records, 0, int64_t{traced} * timeline_tool::kRoles * kCapacity * sizeof(uint64_t)));
    CHECK_CUDA(cudaEventRecord(start));
    kernel<<<grid, C::kThreads, mlakit::detail::sm90::kSm90SmemBytes>>>(params, q_map, q_by_tma);
    CHECK_CUDA(cudaEventRecord(stop));
    CHECK_CUDA(cudaEventSynchronize(stop));
    CHECK_CUDA(cudaGetLastError());
    CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
  }
  std::vector<uint64_t> raw(static_cast<size_t>(traced) * timeline_tool::kRoles * kCapacity);
  CHECK_CUDA(cudaMemcpy(raw.data(), buffer.records, raw.size() * sizeof(uint64_t), cudaMemcpyDeviceToHost));
  std::printf("sparse prefill h_q %d s_kv %d s_q %d topk %d: %.1f us (traced kernel), CTAs %d..%d traced\n", h_q,
              s_kv, s_q, kTopk, ms * 1e3, buffer.first_cta, buffer.first_cta + traced - 1);

  std::map<std::string, Stat> stats;
  auto add = [&](const char* name, double cycles) { stats[name].add(cycles); };
  // A pair's anatomy: every event of pair k (and the producer's tiles 2k .. 2k + 2) relative
  // to consumer 0's pair start, listed by mean time, so the critical chain reads top to bottom.
  std::map<std::string, Stat> anatomy;
  auto mark = [&](const std::string& name, uint32_t clock, uint32_t t0_pair) {
    anatomy[name].add(static_cast<int32_t>(clock - t0_pair));
  };
  const int tiles = kTopk / C::kKeys, pairs = tiles / 2, skip = 2;
  for (int cta = 0; cta < traced; ++cta) {
    RoleTrace role[timeline_tool::kRoles];
    timeline_tool::read_roles(raw, cta, kCapacity, role);
    const auto low_free = role[0].at(TimelineEvent::kProducerStageLowFree);
    const auto high_free = role[0].at(TimelineEvent::kProducerStageHighFree);
    const auto issued = role[0].at(TimelineEvent::kProducerTileIssued);
    if (static_cast<int>(issued.size()) != tiles) {
      std::printf("CTA %d: %zu producer tiles recorded, expected %d\n", cta, issued.size(), tiles);
      return 1;
    }
    const uint32_t t0 = role[0].records.front().clock;
    for (int i = 1; i < tiles; ++i) {
      add("P  wait for stage (low half)", static_cast<int32_t>(low_free[i] - issued[i - 1]));
      add("P  low half free -> high half free", static_cast<int32_t>(high_free[i] - low_free[i]));
      add("P  tile issue (low free -> issued)", static_cast<int32_t>(issued[i] - low_free[i]));
    }
    for (int w = 0; w < 2; ++w) {
      const RoleTrace& c = role[1 + w];
      const auto pair_start = c.at(TimelineEvent::kConsumerPairStart);
      const auto first = c.at(TimelineEvent::kConsumerFirstSlab);
      const auto last = c.at(TimelineEvent::kConsumerLastSlab);
      const auto scores = c.at(TimelineEvent::kConsumerScores);
      const auto handoff = c.at(TimelineEvent::kConsumerHandoff);
      const auto pair_end = c.at(TimelineEvent::kConsumerPairEnd);
      const auto q_loaded = c.at(TimelineEvent::kConsumerQLoaded);
      const auto stored = c.at(TimelineEvent::kConsumerStored);
      if (static_cast<int>(pair_end.size()) != pairs || first.size() != static_cast<size_t>(pairs)) {
        std::printf("CTA %d consumer %d: %zu pairs recorded, expected %d\n", cta, w, pair_end.size(), pairs);
        return 1;
      }
      const std::string cw = "C" + std::to_string(w) + " ";
      add((cw + "producer start -> Q loaded").c_str(), static_cast<int32_t>(q_loaded[0] - t0));
      add((cw + "last pair end -> stored").c_str(), static_cast<int32_t>(stored[0] - pair_end[pairs - 1]));
      add((cw + "producer start -> stored (CTA span)").c_str(), static_cast<int32_t>(stored[0] - t0));
      for (int k = skip; k < pairs - skip; ++k) {
        const int tile = 2 * k + w;  // consumer w computes S of tile 2k + w
        add((cw + "pair").c_str(), static_cast<int32_t>(pair_end[k] - pair_start[k]));
        add((cw + "pair start -> own first slab").c_str(), static_cast<int32_t>(first[k] - pair_start[k]));
        add((cw + "first slab -> last slab").c_str(), static_cast<int32_t>(last[k] - first[k]));
        add((cw + "last slab -> S done").c_str(), static_cast<int32_t>(scores[k] - last[k]));
        add((cw + "handoff passed - pair start").c_str(), static_cast<int32_t>(handoff[k] - pair_start[k]));
        add((cw + "own tile: stage free -> first slab landed").c_str(), static_cast<int32_t>(first[k] - low_free[tile]));
        add((cw + "own tile: issued -> last slab landed").c_str(), static_cast<int32_t>(last[k] - issued[tile]));
      }
    }
    const auto c0_start = role[1].at(TimelineEvent::kConsumerPairStart);
    for (int k = skip; k < pairs - skip; ++k) {
      const uint32_t t0_pair = c0_start[k];
      for (int i = 2 * k; i <= 2 * k + 2 && i < tiles; ++i) {
        const std::string tile = i == 2 * k ? "A" : (i == 2 * k + 1 ? "B" : "A'");
        mark("P  tile " + tile + ": low half free", low_free[i], t0_pair);
        mark("P  tile " + tile + ": high half free", high_free[i], t0_pair);
        mark("P  tile " + tile + ": issued", issued[i], t0_pair);
      }
      for (int w = 0; w < 2; ++w) {
        const std::string cw = "C" + std::to_string(w) + " ";
        for (const TimelineEvent e :
             {TimelineEvent::kConsumerPairStart, TimelineEvent::kConsumerFirstSlab, TimelineEvent::kConsumerLastSlab,
              TimelineEvent::kConsumerScores, TimelineEvent::kConsumerHandoff, TimelineEvent::kConsumerPublished,
              TimelineEvent::kConsumerPairEnd, TimelineEvent::kConsumerHighIssued, TimelineEvent::kConsumerRowMax,
              TimelineEvent::kConsumerExpDone}) {
          const auto at = role[1 + w].at(e);
          // A lone consumer-1 pair has no hand-off of its own P: events absent there are skipped.
          std::string name = timeline_tool::event_name(e);
          if (name.rfind("C  ", 0) == 0) name.erase(0, 3);  // "C  S done" -> "S done"
          if (static_cast<int>(at.size()) >= pairs) mark(cw + name, at[k], t0_pair);
        }
      }
    }
    if (cta == 0) {
      std::printf("\nCTA %d, pairs %d..%d (cycles from the producer's first record):\n", buffer.first_cta, skip,
                  skip + 1);
      for (int r = 0; r < 3; ++r) {
        std::printf("  %s:", r == 0 ? "producer  " : (r == 1 ? "consumer 0" : "consumer 1"));
        int shown = 0;
        for (const timeline_tool::Record& rec : role[r].records) {
          const int32_t t = static_cast<int32_t>(rec.clock - t0);
          if (shown < 24 && t > 0) {
            std::printf(" %u@%d", static_cast<unsigned>(rec.event), t);
            ++shown;
          }
        }
        std::printf("\n");
      }
    }
  }
  std::printf("\n%-48s %10s %10s %10s\n", "interval (cycles)", "mean", "min", "max");
  for (const auto& [name, s] : stats) {
    std::printf("%-48s %10.0f %10.0f %10.0f\n", name.c_str(), s.sum / s.n, s.lo, s.hi);
  }
  std::vector<std::pair<double, std::string>> order;
  for (const auto& [name, s] : anatomy) order.emplace_back(s.sum / s.n, name);
  std::sort(order.begin(), order.end());
  std::printf("\n%-48s %10s %10s %10s\n", "pair anatomy (cycles from C0's pair start)", "mean", "min", "max");
  for (const auto& [mean, name] : order) {
    const Stat& s = anatomy[name];
    std::printf("%-48s %10.0f %10.0f %10.0f\n", name.c_str(), mean, s.lo, s.hi);
  }
  std::printf("(events: 0 low free, 1 high free, 2 issued, 3 Q loaded, 4 pair start, 5 first slab, 6 last slab, "
              "7 S done, 8 handoff, 9 pair end, 10 stored)\n");
  return 0;
}
