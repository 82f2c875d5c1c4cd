// Host-side heuristics and workspace layout of the MLA decode: pure functions of the problem
// and the device, unit-tested on the CPU.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/decode_schedule.h"
#include "host/device.h"
#include "mlakit/mla_decode.h"

namespace mlakit::detail {

// Fixed properties of a decode kernel family that the scheduler and the layout depend on.
struct DecodeKernelTraits {
  MlaKernel kernel;
  int rows_per_tile;    // query rows per CTA
  int block_n;          // keys per scheduling block
  int overhead_blocks;  // scheduling cost of one segment, in blocks
  int ctas_per_sm;      // resident CTAs per SM the kernel is designed for
};

inline constexpr int kWorkspaceAlignment = 256;

// The kernel family for a device and request: kSm90 on compute capability 9.0 (unless the
// portable kernel is asked for), kPortable elsewhere. Asking for kSm90 elsewhere is an error.
// `field` names the request in error messages.
Status select_decode_kernel(const char* op, const DeviceInfo& device, MlaKernel request,
                            DecodeKernelTraits* traits, const char* field = "options.kernel");
DecodeKernelTraits decode_kernel_traits(MlaKernel kernel);

// Query rows per kv head: s_q * h_q / h_kv.
int64_t decode_rows(const MlaDecodeProblem& problem);
int64_t decode_row_tiles(const MlaDecodeProblem& problem, const DecodeKernelTraits& traits);

// Parts (CTAs per kv head and row tile) so that one wave fills the GPU:
//   num_parts = max(1, sm_count * ctas_per_sm / (h_kv * row_tiles)).
// E.g. H100 (132 SMs), portable kernel (2 CTAs/SM, 32 rows/tile), h_q 128 h_kv 1 s_q 1:
//   row tiles 4, num_parts = 264 / 4 = 66.
int decode_num_parts(const MlaDecodeProblem& problem, const DecodeKernelTraits& traits,
                     int sm_count);

ScheduleConfig decode_schedule_config(const MlaDecodeProblem& problem,
                                      const DecodeKernelTraits& traits, int sm_count);

// Checks b, s_q, h_q, h_kv, d_qk, d_v of a problem (op names the calling entry point). b, s_q
// and h_q may be 0 (an empty problem, see is_empty_problem).
Status validate_decode_problem(const char* op, const MlaDecodeProblem& problem);

// No query row at all (b, s_q or h_q is 0): the plan and the decode launch nothing, since
// there is nothing to write (and a grid of zero blocks is a launch error).
inline bool is_empty_problem(const MlaDecodeProblem& p) { return p.b == 0 || p.s_q == 0 || p.h_q == 0; }

// Fills every field of `plan` but `workspace`, including workspace_bytes.
// Split sequences need at most 2 * num_parts partial slots: a sequence cut into s pieces
// crosses s - 1 of the num_parts - 1 part boundaries, so sum(s) <= 2 * (num_parts - 1).
// `op` names the entry point in errors.
Status make_decode_layout(const MlaDecodeProblem& problem, const DeviceInfo& device,
                          MlaDecodePlan* plan, MlaKernel request = MlaKernel::kAuto,
                          const char* op = "mla_decode_plan");

// Byte offsets of a planned decode's workspace regions (docs/design.md, "Workspace"): the
// schedule (part ranges, split and partial prefixes, planner scratch) and the partial results
// of split sequences, [partial_slots, h_kv, rows, d_v] floats and their LSEs. Split sequences
// need at most 2 * num_parts partial slots: a sequence cut into s pieces crosses s - 1 of the
// num_parts - 1 part boundaries, so sum(s) <= 2 * (num_parts - 1). The MLA and GQA plans
// both lay their workspace out with it.
struct ScheduleRegions {
  std::size_t part_ranges_offset, split_prefix_offset, partial_prefix_offset, cost_prefix_offset;
  std::size_t partial_out_offset, partial_lse_offset;
  int64_t partial_slots;
  std::size_t workspace_bytes;
};
ScheduleRegions schedule_regions(int num_parts, int64_t b, int h_kv, int64_t rows, int d_v);

// Copies the regions into a plan (MlaDecodePlan or GqaDecodePlan: the same field names).
template <typename Plan>
void set_schedule_regions(const ScheduleRegions& r, Plan* plan) {
  plan->part_ranges_offset = r.part_ranges_offset;
  plan->split_prefix_offset = r.split_prefix_offset;
  plan->partial_prefix_offset = r.partial_prefix_offset;
  plan->cost_prefix_offset = r.cost_prefix_offset;
  plan->partial_out_offset = r.partial_out_offset;
  plan->partial_lse_offset = r.partial_lse_offset;
  plan->partial_slots = r.partial_slots;
  plan->workspace_bytes = r.workspace_bytes;
}

// Sets plan->num_parts and lays the workspace regions out again for it (part ranges and
// partial slots scale with num_parts; workspace_bytes shrinks with it).
void set_decode_num_parts(int num_parts, MlaDecodePlan* plan);

// Parts for `sequences` sequences of `blocks` key blocks each (the sparse decode without
// topk_length: every length is topk), from the default schedule config c.
//
// Why: with m = ceil(sequences / c.num_parts) whole sequences per part and sequences % m == 0,
// sequences / m parts cut the cost line at P = m * (blocks + overhead) exactly, on sequence
// boundaries: no split, so no partial stores and no combine, and fewer segments per CTA.
// That is taken when it keeps the balance: m * (blocks + overhead) <= P_default + overhead,
// P_default = ceil(sequences * (blocks + overhead) / c.num_parts), i.e. the largest part
// costs at most what the default schedule's may (P + the overhead of a continued sequence).
// With no more sequences than parts (m = 1) it passes only when P_default >= blocks, i.e.
// when the default schedule would not split either: few long sequences fail it (one per SM
// would leave the other SMs idle, splitting spreads them over all of them).
//
// Example (Hopper kernel, 132 SMs, h_q 128: 66 parts, overhead 5; topk 2048: 32 blocks):
//   128 sequences: m = 2, P_default = ceil(128 * 37 / 66) = 72, 2 * 37 = 74 <= 77 -> 64 parts;
//   256 sequences: m = 4, P_default = 144, 4 * 37 = 148 <= 149 -> 64 parts;
//   148 sequences: m = 3, 148 % 3 != 0 -> 66 parts (splits); 8 sequences: m = 1, 37 > 5 + 5
//   -> 66 parts (splits).
struct WholeSequenceParts {
  int num_parts;   // c.num_parts when the test fails
  bool no_splits;  // every sequence lies in one part (blocks >= 1: none is empty either)
};
WholeSequenceParts whole_sequence_parts(int64_t sequences, int64_t blocks, const ScheduleConfig& c);

// The index lists a sparse decode plan is made for: topk per query token (plus extra_topk into
// a second cache), and whether topk_length (extra_topk_length) will give the lengths.
struct SparseKeyLists {
  int topk = 0;
  bool topk_length = false;
  int extra_topk = 0;
  bool extra_topk_length = false;
  int total() const { return topk + extra_topk; }                    // <= 2^21
  bool varying() const { return topk_length || extra_topk_length; }  // else every row has total() keys
};

// The sparse decode's layout (all but `workspace`) for its scheduled problem (one sequence
// per (batch entry, query token): b = b * s_q, s_q 1, h_kv 1): make_decode_layout's, for
// keys.total() keys per row; without length tensors every row has that many, and
// whole_sequence_parts may lower num_parts (the regions follow) and set no_splits. Never more
// workspace than the default.
Status make_sparse_decode_layout(const MlaDecodeProblem& scheduled, const SparseKeyLists& keys,
                                 const DeviceInfo& device, MlaKernel request, MlaDecodePlan* plan);

// Checks a caller's workspace: non-null, 256-byte aligned, at least `needed` bytes, device
// memory of `device`.
Status check_workspace(const char* op, const void* workspace, std::size_t workspace_bytes, std::size_t needed,
                       int device);

// Checks the caller's workspace against `layout` (check_workspace) and attaches it.
Status attach_workspace(const char* op, void* workspace, std::size_t workspace_bytes, int device,
                        MlaDecodePlan* layout);

}  // namespace mlakit::detail
