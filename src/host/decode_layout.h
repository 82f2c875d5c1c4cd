// Host-side heuristics and workspace layout of the MLA decode: pure functions of the problem
// and the device, unit-tested on the CPU.
#pragma once

#include <cstdint>

#include "common/decode_schedule.h"
#include "host/device.h"
#include "mlakit/mla_decode.h"

namespace mlakit::detail {

// Fixed properties of a decode kernel family that the scheduler and the layout depend on.
struct DecodeKernelTraits {
  MlaDecodeKernel kernel;
  int rows_per_tile;    // query rows per CTA
  int block_n;          // keys per scheduling block
  int overhead_blocks;  // scheduling cost of one segment, in blocks
  // The same when a kv head's rows fit one row tile: no other CTA shares the part's cache
  // tiles, the kernel streams them at memory speed, and the producer's loads running ahead
  // hide most of a segment's Q load and output store.
  int streaming_overhead_blocks;
  int ctas_per_sm;      // resident CTAs per SM the kernel is designed for
};

inline constexpr int kWorkspaceAlignment = 256;

// The kernel family for a device and request: kSm90 on compute capability 9.0 (unless the
// portable kernel is asked for), kPortable elsewhere. Asking for kSm90 elsewhere is an error.
// `field` names the request in error messages.
Status select_decode_kernel(const char* op, const DeviceInfo& device, MlaDecodeKernel request,
                            DecodeKernelTraits* traits, const char* field = "options.kernel");
DecodeKernelTraits decode_kernel_traits(MlaDecodeKernel kernel);

// Query rows per kv head: s_q * h_q / h_kv.
int64_t decode_rows(const MlaDecodeProblem& problem);
int64_t decode_row_tiles(const MlaDecodeProblem& problem, const DecodeKernelTraits& traits);

// Parts (CTAs per kv head and row tile) so that one wave fills the GPU:
//   num_parts = max(1, sm_count * ctas_per_sm / (h_kv * row_tiles)).
// E.g. H100 (132 SMs), portable kernel (2 CTAs/SM, 32 rows/tile), h_q 128 h_kv 1 s_q 1:
//   row tiles 4, num_parts = 264 / 4 = 66.
int decode_num_parts(const MlaDecodeProblem& problem, const DecodeKernelTraits& traits,
                     int sm_count);

// The segment cost the schedule charges: streaming_overhead_blocks when the rows of a kv head
// fit one row tile, overhead_blocks otherwise.
int decode_overhead_blocks(const MlaDecodeProblem& problem, const DecodeKernelTraits& traits);

ScheduleConfig decode_schedule_config(const MlaDecodeProblem& problem,
                                      const DecodeKernelTraits& traits, int sm_count);

// Checks b, s_q, h_q, h_kv, d_qk, d_v of a problem (op names the calling entry point).
Status validate_decode_problem(const char* op, const MlaDecodeProblem& problem);

// Fills every field of `plan` but `workspace`, including workspace_bytes.
// Split sequences need at most 2 * num_parts partial slots: a sequence cut into s pieces
// crosses s - 1 of the num_parts - 1 part boundaries, so sum(s) <= 2 * (num_parts - 1).
Status make_decode_layout(const MlaDecodeProblem& problem, const DeviceInfo& device,
                          MlaDecodePlan* plan, MlaDecodeKernel request = MlaDecodeKernel::kAuto);

// Checks the caller's workspace against `layout` (non-null, 256-byte aligned, large enough,
// device memory) and attaches it.
Status attach_workspace(const char* op, void* workspace, std::size_t workspace_bytes, int device,
                        MlaDecodePlan* layout);

}  // namespace mlakit::detail
