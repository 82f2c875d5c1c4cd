// mlakit-decode-timeline: where the time of the Hopper dense decode (or of the sparse FP8
// decode, for the benchmark's sparse_* cases) goes, per CTA and per segment (one sequence
// piece of a CTA's part). Builds a benchmark case (bench/cases.cpp or sparse_measure.cpp: the
// same lengths, block table / indices and data), plans it with the library, and launches a
// traced copy of the kernel (decode_timeline_kernel.cu) that stamps its roles' events in SM cycles
// (src/kernels/sm90/timeline.cuh) and every CTA's start and end on the global timer. Prints:
//   - the CTAs' start and end spread, and a least-squares fit of each CTA's duration to its
//     tiles and segments: what a tile and a segment cost beyond the pairs' steady rate;
//   - per-segment phases in cycles: Q load (previous segment stored -> Q loaded), the wait for
//     the segment's first tile, its pairs (first, middle, last), the store (split / direct);
//   - per tile, the producer's phases (low half, high half, wait for the next stage; for the
//     FP8 producer "tile issued" is its last slab converted).
// Usage: mlakit-decode-timeline CASE_FILTER [records per role (4096)]
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "bench/cases.h"
#include "bench/check.h"
#include "bench/measure.h"
#include "bench/sparse_measure.h"
#include "bench/timeline_trace.h"
#include "common/decode_schedule.h"
#include "dispatch/mla_decode_dispatch.h"
#include "dispatch/mla_sparse_decode_dispatch.h"
#include "dispatch/tma_tensor.h"
#include "host/mla_decode_validate.h"
#include "host/scheduler.h"
#include "kernels/sm90/launch.h"
#include "support/gpu_timing.h"

extern "C" cudaError_t traced_dense_decode(const void* params, const CUtensorMap* kv_map, int box_rows,
                                           const CUtensorMap* q_map, const void* timeline, cudaStream_t stream);
extern "C" cudaError_t traced_sparse_decode(const void* params, const CUtensorMap* q_map, const void* timeline,
                                            cudaStream_t stream);

namespace {

using namespace mlakit;
using timeline_tool::RoleTrace;
using timeline_tool::Stat;
using timeline_tool::TimelineEvent;

// One segment of a CTA as the planner scheduled it (the host replay of for_each_segment).
struct PlannedSegment {
  int tiles = 0;
  bool split = false;  // written as a partial for the combine
};

// The segments of part `part` for a row tile whose rows see every key (non-causal cases).
std::vector<PlannedSegment> planned_segments(const detail::PartRange& r, const std::vector<int32_t>& lengths,
                                             const std::vector<int32_t>& split_prefix, int block_n) {
  std::vector<PlannedSegment> out;
  for (const detail::ScheduledSegment& s : detail::part_segments(r, detail::dense_lengths(lengths.data()), block_n)) {
    const int key_end = static_cast<int>(std::min<int64_t>(s.block_end * block_n, lengths[s.seq]));
    const int key_begin = static_cast<int>(s.block_begin * block_n);
    out.push_back({(key_end - key_begin + 63) / 64, split_prefix[s.seq + 1] - split_prefix[s.seq] > 1});
  }
  return out;
}

// Least squares y = a x1 + b x2 + c (3 x 3 normal equations, Cramer's rule).
// False (and zeros) when the CTAs' tiles and segments do not determine it, e.g. every CTA
// with the same counts (whole-sequence plans).
bool fit3(const std::vector<double>& x1, const std::vector<double>& x2, const std::vector<double>& y, double* a,
          double* b, double* c) {
  double m[3][4] = {};
  for (size_t i = 0; i < y.size(); ++i) {
    const double v[3] = {x1[i], x2[i], 1.0};
    for (int r = 0; r < 3; ++r) {
      for (int k = 0; k < 3; ++k) m[r][k] += v[r] * v[k];
      m[r][3] += v[r] * y[i];
    }
  }
  auto det = [](double q[3][3]) {
    return q[0][0] * (q[1][1] * q[2][2] - q[1][2] * q[2][1]) - q[0][1] * (q[1][0] * q[2][2] - q[1][2] * q[2][0]) +
           q[0][2] * (q[1][0] * q[2][1] - q[1][1] * q[2][0]);
  };
  double base[3][3];
  for (int r = 0; r < 3; ++r)
    for (int k = 0; k < 3; ++k) base[r][k] = m[r][k];
  const double d = det(base);
  double out[3] = {0, 0, 0};
  for (int col = 0; col < 3 && std::fabs(d) > 1e-9; ++col) {
    double q[3][3];
    for (int r = 0; r < 3; ++r)
      for (int k = 0; k < 3; ++k) q[r][k] = k == col ? m[r][3] : m[r][k];
    out[col] = det(q) / d;
  }
  *a = out[0];
  *b = out[1];
  *c = out[2];
  return std::fabs(d) > 1e-9;
}

template <typename T>
std::vector<T> download(const void* base, std::size_t offset, std::size_t count) {
  std::vector<T> out(count);
  BENCH_CUDA(cudaMemcpy(out.data(), static_cast<const char*>(base) + offset, count * sizeof(T),
                        cudaMemcpyDeviceToHost));
  return out;
}

}  // namespace

// What a traced launch left: the role records, the CTA spans, the plan's parts and split
// prefix, and the lengths the plan scheduled.
struct TracedRun {
  std::string name;
  float ms = 0;
  int ctas = 0, row_tiles = 0, num_parts = 0, block_n = 64;
  std::vector<uint64_t> raw, span;
  std::vector<detail::PartRange> parts;
  std::vector<int32_t> lengths, split_prefix;
};

// Runs `launch` (the traced kernel, recording into `buffer`) three times after an L2 flush;
// the last run's records and time stay.
template <typename Launch>
void trace(support::L2Flusher& flusher, cudaStream_t stream, bench::DeviceBuffer& records, Launch launch, float* ms) {
  cudaEvent_t start, stop;
  BENCH_CUDA(cudaEventCreate(&start));
  BENCH_CUDA(cudaEventCreate(&stop));
  for (int run = 0; run < 3; ++run) {
    records.fill_bytes(0);
    flusher.flush(stream);
    BENCH_CUDA(cudaEventRecord(start, stream));
    BENCH_CUDA(launch());
    BENCH_CUDA(cudaEventRecord(stop, stream));
    BENCH_CUDA(cudaEventSynchronize(stop));
    BENCH_CUDA(cudaEventElapsedTime(ms, start, stop));
  }
  BENCH_CUDA(cudaEventDestroy(start));
  BENCH_CUDA(cudaEventDestroy(stop));
}

// The events of all roles of CTA 0 in two steady-state pairs (consumer 0's pairs 8 and
// 9: mid-segment in the benchmark cases), merged by clock (one SM, one clock) and relative to
// the first pair's start: who waits for whom within a pair.
void print_steady_pairs(const std::vector<uint64_t>& raw, int capacity) {
  RoleTrace role[timeline_tool::kRoles];
  timeline_tool::read_roles(raw, 0, capacity, role);
  const auto starts = role[1].at(TimelineEvent::kConsumerPairStart);
  if (starts.size() < 11) return;
  const uint32_t t0 = starts[8], t1 = starts[10];
  struct Row {
    int32_t at;
    int role;
    TimelineEvent event;
  };
  std::vector<Row> rows;
  for (int r = 0; r < timeline_tool::kRoles; ++r) {
    for (const auto& rec : role[r].records) {
      const int32_t at = static_cast<int32_t>(rec.clock - t0);
      if (at >= -2000 && static_cast<int32_t>(rec.clock - t1) < 0) rows.push_back({at, r, rec.event});
    }
  }
  std::sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) { return a.at < b.at; });
  std::printf("CTA 0, consumer 0's pairs 8-9 (cycles from pair 8's start; P0..P3: producer warps, C0, C1)\n");
  for (const Row& row : rows) {
    std::printf("  %7d  %s  %s\n", row.at, timeline_tool::role_name(row.role), timeline_tool::event_name(row.event));
  }
}

// Prints the CTA spans, the fit of each CTA's duration to its tiles and segments, and the
// per-segment and per-tile phases of the roles.
void report(const TracedRun& t, int capacity) {
  const int ctas = t.ctas, row_tiles = t.row_tiles, block_n = t.block_n;
  const auto& raw = t.raw;
  const auto& span = t.span;
  const auto& parts = t.parts;
  const auto& lengths = t.lengths;
  const auto& split_prefix = t.split_prefix;
  std::printf("\n== %s: %.1f us (traced kernel, no combine), %d CTAs (%d row tiles x %d parts)\n", t.name.c_str(),
              t.ms * 1e3, ctas, row_tiles, t.num_parts);
  // CTA spans on the global timer, and the fit of each duration to tiles and segments.
  uint64_t first_start = ~0ull, last_start = 0, last_end = 0;
  for (int i = 0; i < ctas; ++i) {
    first_start = std::min(first_start, span[2 * i]);
    last_start = std::max(last_start, span[2 * i]);
    last_end = std::max(last_end, span[2 * i + 1]);
  }
  std::vector<double> tiles_of, segs_of, dur_of;
  Stat end_spread;
  std::map<std::string, Stat> st;
  auto add = [&](const std::string& name, double v) { st[name].add(v); };
  bool truncated = false;
  for (int i = 0; i < ctas; ++i) {
    const int part = i / (ctas / t.num_parts);  // linear CTA index: row tile, kv head, then part
    const auto planned = planned_segments(parts[part], lengths, split_prefix, block_n);
    int tiles = 0;
    for (const auto& s : planned) tiles += s.tiles;
    tiles_of.push_back(tiles);
    segs_of.push_back(static_cast<double>(planned.size()));
    dur_of.push_back(static_cast<double>(span[2 * i + 1] - span[2 * i]));
    end_spread.add(static_cast<double>(last_end - span[2 * i + 1]) * 1e-3);

    RoleTrace role[timeline_tool::kRoles];
    timeline_tool::read_roles(raw, i, capacity, role);
    {
      // The producer per tile: issuing the low half (and waiting for the high half to be
      // free), issuing the high half, then waiting for the next tile's stage.
      const auto low_free = role[0].at(TimelineEvent::kProducerStageLowFree);
      const auto high_free = role[0].at(TimelineEvent::kProducerStageHighFree);
      const auto issued = role[0].at(TimelineEvent::kProducerTileIssued);
      for (size_t t = 0; t < low_free.size() && t < high_free.size() && t < issued.size(); ++t) {
        add("P  low free -> high free", static_cast<int32_t>(high_free[t] - low_free[t]));
        add("P  high free -> tile issued", static_cast<int32_t>(issued[t] - high_free[t]));
        if (t + 1 < low_free.size()) add("P  tile issued -> next low free", static_cast<int32_t>(low_free[t + 1] - issued[t]));
      }
    }
    for (int w = 0; w < 2; ++w) {
      const RoleTrace& c = role[1 + w];
      if (static_cast<int>(c.records.size()) >= capacity) truncated = true;
      const std::string cw = "C" + std::to_string(w) + " ";
      const auto q_loaded = c.at(TimelineEvent::kConsumerQLoaded);
      const auto stored = c.at(TimelineEvent::kConsumerStored);
      const auto pair_start = c.at(TimelineEvent::kConsumerPairStart);
      const auto pair_end = c.at(TimelineEvent::kConsumerPairEnd);
      const auto first_slab = c.at(TimelineEvent::kConsumerFirstSlab);
      if (stored.size() != planned.size() || q_loaded.size() != planned.size()) continue;
      const uint32_t t0 = role[0].records.empty() ? q_loaded[0] : role[0].records.front().clock;
      size_t pair = 0, slab = 0;
      for (size_t k = 0; k < planned.size(); ++k) {
        const int pairs = (planned[k].tiles + 1) / 2;
        const uint32_t before = k == 0 ? t0 : stored[k - 1];
        add(cw + (k == 0 ? "CTA start -> first Q loaded" : "Q load (stored -> Q loaded)"),
            static_cast<int32_t>(q_loaded[k] - before));
        if (pair + pairs > pair_end.size()) break;
        // Consumer 1 computes no S in a lone tile A: its first slab stamps skip those pairs.
        const bool own_tile = w == 0 || planned[k].tiles >= 2;
        if (own_tile && slab < first_slab.size()) {
          add(cw + "Q loaded -> own first slab", static_cast<int32_t>(first_slab[slab] - q_loaded[k]));
        }
        for (int j = 0; j < pairs; ++j, ++pair) {
          const double cycles = static_cast<int32_t>(pair_end[pair] - pair_start[pair]);
          const bool lone = j == pairs - 1 && planned[k].tiles % 2 == 1;
          add(cw + (j == 0 ? "pair, first of segment" : (j == pairs - 1 ? (lone ? "pair, last (lone tile A)" : "pair, last") : "pair, middle")),
              cycles);
          if (w == 0 || !lone) ++slab;
        }
        add(cw + (planned[k].split ? "store (split: f32 partial)" : "store (direct)"),
            static_cast<int32_t>(stored[k] - pair_end[pair - 1]));
        add(cw + "segment (stored -> stored)", static_cast<int32_t>(stored[k] - before));
      }
    }
  }
  double a = 0, b = 0, c = 0;
  const bool fitted = fit3(tiles_of, segs_of, dur_of, &a, &b, &c);
  Stat dur, tl, sg;
  for (size_t i = 0; i < dur_of.size(); ++i) {
    dur.add(dur_of[i] * 1e-3);
    tl.add(tiles_of[i]);
    sg.add(segs_of[i]);
  }
  std::printf("CTA starts spread over %.1f us; kernel span (first start -> last end) %.1f us\n",
              (last_start - first_start) * 1e-3, (last_end - first_start) * 1e-3);
  std::printf("CTA duration us mean %.1f min %.1f max %.1f; tiles mean %.1f max %.0f; segments mean %.2f max %.0f\n",
              dur.mean(), dur.lo, dur.hi, tl.mean(), tl.hi, sg.mean(), sg.hi);
  std::printf("CTA end before the last one: mean %.1f us, max %.1f us\n", end_spread.mean(), end_spread.hi);
  if (fitted) {
    std::printf("fit: duration = %.0f ns x tiles + %.0f ns x segments + %.0f ns\n", a, b, c);
  } else {
    std::printf("fit: none (the CTAs' tile and segment counts do not vary enough)\n");
  }
  if (truncated) std::printf("(some roles filled their %d records: raise the capacity)\n", capacity);
  std::printf("%-44s %10s %10s %10s %8s\n", "interval (cycles)", "mean", "min", "max", "count");
  for (const auto& [name, s] : st) {
    std::printf("%-44s %10.0f %10.0f %10.0f %8d\n", name.c_str(), s.mean(), s.lo, s.hi, s.n);
  }
  print_steady_pairs(raw, capacity);
}

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: mlakit-decode-timeline CASE_FILTER [records per role]\n");
    return 2;
  }
  const std::string filter = argv[1];
  const int capacity = argc > 2 ? std::atoi(argv[2]) : 4096;
  cudaStream_t stream = nullptr;
  support::L2Flusher flusher;
  auto buffers = [&](int ctas, bench::DeviceBuffer* records, bench::DeviceBuffer* spans) {
    *records = bench::DeviceBuffer(static_cast<std::size_t>(ctas) * timeline_tool::kRoles * capacity * 8);
    *spans = bench::DeviceBuffer(static_cast<std::size_t>(ctas) * 2 * 8);
    return detail::sm90::TimelineBuffer{.records = static_cast<uint64_t*>(records->get()),
                                        .first_cta = 0,
                                        .ctas = ctas,
                                        .capacity = capacity,
                                        .cta_spans = static_cast<uint64_t*>(spans->get())};
  };
  for (const bench::BenchCase& bc : bench::filter_cases(bench::bench_cases(false), filter)) {
    if (bc.causal) continue;  // planned_segments assumes every row sees every key
    bench::DeviceDecodeCase d = bench::make_device_case(bc, DType::kBF16, stream);
    const MlaDecodeProblem problem = d.host.problem();
    const MlaDecodeOptions options{.kernel = MlaKernel::kSm90};
    std::size_t workspace_bytes = 0;
    BENCH_STATUS(mla_decode_workspace_size(problem, &workspace_bytes, options));
    bench::DeviceBuffer workspace(workspace_bytes);
    MlaDecodePlan plan;
    BENCH_STATUS(mla_decode_plan(problem, d.args.cache_seqlens, workspace.get(), workspace_bytes, stream, &plan,
                                 options));
    const detail::DenseDecodeParams params = detail::make_decode_params(
        d.args, plan, detail::resolve_softmax_scale(d.args.softmax_scale, problem.d_qk));
    const int box_rows = detail::sm90_box_rows(bc.page);
    CUtensorMap kv_map;
    std::string why;
    if (box_rows == 0 || !detail::make_kv_tensor_map(detail::tma_tensor(d.args.kv_cache), box_rows, &kv_map, &why)) {
      bench::fail(bc.name + ": no tensor map: " + why);
    }
    CUtensorMap q_map;  // as the library's dispatch: the Q tile by TMA where the map exists
    const CUtensorMap* q_by_tma =
        detail::make_q_tensor_map(detail::tma_tensor(d.args.q), params.core.heads_per_kv, &q_map, &why) ? &q_map : nullptr;
    TracedRun t{.name = bc.name, .row_tiles = (params.core.rows + 63) / 64, .num_parts = params.schedule.num_parts,
                .block_n = params.schedule.block_n};
    t.ctas = t.row_tiles * params.core.h_kv * params.schedule.num_parts;
    bench::DeviceBuffer records, spans;
    const detail::sm90::TimelineBuffer buffer = buffers(t.ctas, &records, &spans);
    trace(flusher, stream, records, [&] { return traced_dense_decode(&params, &kv_map, box_rows, q_by_tma, &buffer, stream); },
          &t.ms);
    t.raw = records.download<uint64_t>();
    t.span = spans.download<uint64_t>();
    t.parts = download<detail::PartRange>(workspace.get(), plan.part_ranges_offset, plan.num_parts);
    t.split_prefix = download<int32_t>(workspace.get(), plan.split_prefix_offset, problem.b + 1);
    t.lengths = d.host.seqlens;
    report(t, capacity);
  }
  // The sparse FP8 decode's cases: one scheduled sequence of topk keys per (batch entry, query token).
  for (const bench::SparseBenchCase& c : bench::sparse_bench_cases(false, filter)) {
    bench::DeviceSparseCase d = bench::make_device_sparse_case(c, MlaKernel::kSm90, stream);
    std::size_t workspace_bytes = 0;
    BENCH_STATUS(mla_sparse_decode_workspace_size(d.problem, &workspace_bytes));
    bench::DeviceBuffer workspace(workspace_bytes);
    MlaDecodePlan plan;
    BENCH_STATUS(mla_sparse_decode_plan(d.problem, TensorRef{}, workspace.get(), workspace_bytes, stream, &plan));
    const detail::SeqLengths lengths{nullptr, c.topk, c.s_q, c.topk};
    const detail::SparseDecodeParams params = detail::make_sparse_decode_params(
        d.args, plan, lengths, detail::Fp8TokenLayout::kV32, detail::resolve_softmax_scale(d.args.softmax_scale, 576));
    TracedRun t{.name = c.name, .row_tiles = (params.core.rows + 63) / 64, .num_parts = params.schedule.num_parts,
                .block_n = params.schedule.block_n};
    t.ctas = t.row_tiles * params.schedule.num_parts;
    bench::DeviceBuffer records, spans;
    const detail::sm90::TimelineBuffer buffer = buffers(t.ctas, &records, &spans);
    CUtensorMap q_map;  // as the library's dispatch
    std::string why;
    const CUtensorMap* q_by_tma =
        detail::make_q_tensor_map(detail::tma_tensor(d.args.q), params.core.heads_per_kv, &q_map, &why) ? &q_map : nullptr;
    trace(flusher, stream, records, [&] { return traced_sparse_decode(&params, q_by_tma, &buffer, stream); }, &t.ms);
    t.raw = records.download<uint64_t>();
    t.span = spans.download<uint64_t>();
    t.parts = download<detail::PartRange>(workspace.get(), plan.part_ranges_offset, plan.num_parts);
    t.split_prefix = download<int32_t>(workspace.get(), plan.split_prefix_offset, plan.problem.b + 1);
    t.lengths.assign(static_cast<std::size_t>(plan.problem.b), c.topk);
    report(t, capacity);
  }
  return 0;
}
