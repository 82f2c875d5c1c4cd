#include "host/decode_layout.h"

#include <algorithm>
#include <string>

#include "host/check.h"

namespace mlakit::detail {
namespace {

constexpr int kSupportedDqk = 576;
constexpr int kSupportedDv = 512;

// The sparse FP8 decode's segment charge, for either kernel: its gathering producer restarts at
// every segment, and its schedule and the whole-sequence choice (b = 64 / 128 at h_q 128,
// topk 2048: 64 parts of 2 / 4 whole sequences, no combine) were measured with 5
// (docs/kernels/mla_sparse_decode_sm90.md); with the dense decode's 3 the choice falls back to
// split schedules, which measured slower.
constexpr int kSparseDecodeOverheadBlocks = 5;

std::size_t align_up(std::size_t x) {
  return (x + kWorkspaceAlignment - 1) / kWorkspaceAlignment * kWorkspaceAlignment;
}

}  // namespace

DecodeKernelTraits decode_kernel_traits(MlaKernel kernel) {
  if (kernel == MlaKernel::kSm90) {
    // 64 rows (one wgmma M) per CTA, one 227 KB CTA per SM.
    return DecodeKernelTraits{
        .kernel = MlaKernel::kSm90,
        .rows_per_tile = 64,
        .block_n = 64,
        // A segment (Q load, store, pipeline refill) costs ~2.4 tiles at h_q 128 s_q 1 s_k~4k
        // (mlakit-decode-timeline fit, H100, fd153cb: 6,034 ns per segment, 2,493 per tile).
        // Same call, two rounds, s_q 1 4k / 8k, s_q 2 4k: 3 blocks 291.7 / 519.3 / 470.9 and
        // 290.8 / 519.6 / 470.9 us, 4: 293.7 / 519.8 / 470.0 and 291.7 / 519.9 / 470.8, 5: 295.1
        // / 521.9 / 476.4 and 293.0 / 520.6 / 472.1. When a kv head's rows fit one row tile
        // (h_q 16 s_q 1, b 32, s_k 8192: streaming, earlier kernel) 1 / 2 / 3 / 5 gave 131.6 /
        // 130.0 / 129.6 / 130.8 us, so 3 serves both.
        .overhead_blocks = 3,
        .ctas_per_sm = 1,
    };
  }
  return DecodeKernelTraits{
      .kernel = MlaKernel::kPortable,
      .rows_per_tile = 32,
      .block_n = 64,
      .overhead_blocks = 5,
      .ctas_per_sm = 2,
  };
}

Status select_decode_kernel(const char* op, const DeviceInfo& device, MlaKernel request,
                            DecodeKernelTraits* traits, const char* field) {
  const bool hopper = device.cc_major == 9 && device.cc_minor == 0;
  if (request == MlaKernel::kSm90 && !hopper) {
    return Status(StatusCode::kUnsupportedArchitecture,
                  std::string(op) + ": " + field + ": kSm90 expected a compute capability 9.0 device, got " +
                      std::to_string(device.cc_major) + "." + std::to_string(device.cc_minor));
  }
  if (request != MlaKernel::kAuto && request != MlaKernel::kPortable &&
      request != MlaKernel::kSm90) {
    return invalid(op, std::string(field) + ": expected kAuto, kPortable or kSm90, got " +
                           std::to_string(static_cast<int>(request)));
  }
  const bool sm90 = request == MlaKernel::kSm90 || (request == MlaKernel::kAuto && hopper);
  *traits = decode_kernel_traits(sm90 ? MlaKernel::kSm90 : MlaKernel::kPortable);
  return Status::ok();
}

int64_t decode_rows(const MlaDecodeProblem& p) {
  return static_cast<int64_t>(p.s_q) * (p.h_q / p.h_kv);
}

int64_t decode_row_tiles(const MlaDecodeProblem& p, const DecodeKernelTraits& t) {
  return (decode_rows(p) + t.rows_per_tile - 1) / t.rows_per_tile;
}

int decode_num_parts(const MlaDecodeProblem& p, const DecodeKernelTraits& t, int sm_count) {
  // An empty problem (no rows) is laid out as if it had one row tile; nothing runs on it.
  const int64_t ctas_per_part = std::max<int64_t>(1, static_cast<int64_t>(p.h_kv) * decode_row_tiles(p, t));
  int64_t parts = static_cast<int64_t>(sm_count) * t.ctas_per_sm / ctas_per_part;
  return static_cast<int>(parts < 1 ? 1 : parts);
}

ScheduleConfig decode_schedule_config(const MlaDecodeProblem& p, const DecodeKernelTraits& t,
                                      int sm_count) {
  return ScheduleConfig{
      .num_parts = decode_num_parts(p, t, sm_count),
      .block_n = t.block_n,
      .overhead_blocks = t.overhead_blocks,
  };
}

Status validate_decode_problem(const char* op, const MlaDecodeProblem& p) {
  // b, s_q or h_q of 0: an empty problem, valid (the empty result; nothing is launched).
  if (p.b < 0 || p.b > (int64_t{1} << 30)) {
    return invalid(op, "b: expected 0 <= b <= 2^30, got " + std::to_string(p.b));
  }
  if (p.s_q < 0 || p.s_q > 1024) {
    return invalid(op, "s_q: expected 0 <= s_q <= 1024, got " + std::to_string(p.s_q));
  }
  if (p.h_kv < 1 || p.h_kv > 65535) {
    return invalid(op, "h_kv: expected 1 <= h_kv <= 65535, got " + std::to_string(p.h_kv));
  }
  if (p.h_q < 0) return invalid(op, "h_q: expected >= 0, got " + std::to_string(p.h_q));
  if (p.h_q % p.h_kv != 0) {
    return invalid(op, "h_q % h_kv: expected 0 (h_q a multiple of h_kv), got h_q = " +
                           std::to_string(p.h_q) + ", h_kv = " + std::to_string(p.h_kv));
  }
  if (p.d_qk != kSupportedDqk) {
    return unsupported(op, "d_qk: expected " + std::to_string(kSupportedDqk) +
                               " (512 NoPE + 64 RoPE), got " + std::to_string(p.d_qk));
  }
  if (p.d_v != kSupportedDv) {
    return unsupported(op, "d_v: expected " + std::to_string(kSupportedDv) + ", got " +
                               std::to_string(p.d_v));
  }
  return Status::ok();
}

Status make_decode_layout(const MlaDecodeProblem& p, const DeviceInfo& device,
                          MlaDecodePlan* plan, MlaKernel request, const char* op) {
  MLAKIT_RETURN_IF_ERROR(validate_decode_problem(op, p));
  DecodeKernelTraits traits;
  MLAKIT_RETURN_IF_ERROR(select_decode_kernel(op, device, request, &traits));
  MlaDecodePlan out;
  out.problem = p;
  out.kernel = traits.kernel;
  out.device = device.ordinal;
  out.block_n = traits.block_n;
  out.overhead_blocks = traits.overhead_blocks;
  out.rows_per_tile = traits.rows_per_tile;
  set_decode_num_parts(decode_num_parts(p, traits, device.sm_count), &out);
  *plan = out;
  return Status::ok();
}

ScheduleRegions schedule_regions(int num_parts, int64_t b, int h_kv, int64_t rows, int d_v) {
  ScheduleRegions r;
  r.partial_slots = 2 * static_cast<int64_t>(num_parts);
  const auto b1 = static_cast<std::size_t>(b + 1);
  const auto slots_rows = static_cast<std::size_t>(r.partial_slots) * h_kv * static_cast<std::size_t>(rows);
  std::size_t offset = 0;
  auto region = [&offset](std::size_t bytes) {
    std::size_t at = offset;
    offset = align_up(offset + bytes);
    return at;
  };
  r.part_ranges_offset = region(sizeof(PartRange) * num_parts);
  r.split_prefix_offset = region(sizeof(int32_t) * b1);
  r.partial_prefix_offset = region(sizeof(int32_t) * b1);
  r.cost_prefix_offset = region(sizeof(int64_t) * b1);
  r.partial_out_offset = region(sizeof(float) * slots_rows * d_v);
  r.partial_lse_offset = region(sizeof(float) * slots_rows);
  r.workspace_bytes = offset;
  return r;
}

void set_decode_num_parts(int num_parts, MlaDecodePlan* plan) {
  const MlaDecodeProblem& p = plan->problem;
  plan->num_parts = num_parts;
  set_schedule_regions(schedule_regions(num_parts, p.b, p.h_kv, decode_rows(p), p.d_v), plan);
}

WholeSequenceParts whole_sequence_parts(int64_t sequences, int64_t blocks, const ScheduleConfig& c) {
  const WholeSequenceParts fallback{c.num_parts, false};
  // Empty sequences are written by the combine, which a plan without splits skips.
  if (sequences < 1 || blocks < 1 || c.num_parts < 1) return fallback;
  const int64_t per_part = (sequences + c.num_parts - 1) / c.num_parts;
  if (sequences % per_part != 0) return fallback;  // P = T / parts would not fall on boundaries
  const int64_t cost = blocks + c.overhead_blocks;
  const int64_t default_part = part_size(sequences * cost, c);
  if (per_part * cost > default_part + c.overhead_blocks) return fallback;
  // sequences / per_part <= c.num_parts, so it fits an int and the default's workspace.
  return WholeSequenceParts{static_cast<int>(sequences / per_part), true};
}

Status make_sparse_decode_layout(const MlaDecodeProblem& scheduled, const SparseKeyLists& keys,
                                 const DeviceInfo& device, MlaKernel request, MlaDecodePlan* plan) {
  MlaDecodePlan out;
  MLAKIT_RETURN_IF_ERROR(make_decode_layout(scheduled, device, &out, request));
  // The schedule covers these index lists: the decode checks it gets the same.
  out.sparse_topk = keys.topk;
  out.sparse_topk_length = keys.topk_length;
  out.sparse_extra_topk = keys.extra_topk;
  out.sparse_extra_topk_length = keys.extra_topk_length;
  out.overhead_blocks = kSparseDecodeOverheadBlocks;
  if (!keys.varying()) {
    // Lengths known on the host: the default schedule's config decides whether whole
    // sequences per part keep its balance.
    const ScheduleConfig c{
        .num_parts = out.num_parts,
        .block_n = out.block_n,
        .overhead_blocks = out.overhead_blocks,
    };
    const WholeSequenceParts w = whole_sequence_parts(scheduled.b, key_blocks(keys.total(), c.block_n), c);
    if (w.num_parts != out.num_parts) set_decode_num_parts(w.num_parts, &out);
    out.no_splits = w.no_splits;
  }
  *plan = out;
  return Status::ok();
}

Status check_workspace(const char* op, const void* workspace, std::size_t workspace_bytes, std::size_t needed,
                       int device) {
  if (workspace == nullptr) return invalid(op, "workspace: expected a non-null pointer, got null");
  const auto address = reinterpret_cast<std::uintptr_t>(workspace);
  if (address % kWorkspaceAlignment != 0) {
    return invalid(op, "workspace: expected a " + std::to_string(kWorkspaceAlignment) +
                           "-byte aligned pointer, got an address = " + std::to_string(address % kWorkspaceAlignment) +
                           " mod " + std::to_string(kWorkspaceAlignment));
  }
  if (workspace_bytes < needed) {
    return Status(StatusCode::kWorkspaceTooSmall, std::string(op) + ": workspace_bytes: expected >= " +
                                                      std::to_string(needed) + " (the workspace-size query), got " +
                                                      std::to_string(workspace_bytes));
  }
  return check_device_pointer(op, "workspace", workspace, device);
}

Status attach_workspace(const char* op, void* workspace, std::size_t workspace_bytes, int device,
                        MlaDecodePlan* layout) {
  MLAKIT_RETURN_IF_ERROR(check_workspace(op, workspace, workspace_bytes, layout->workspace_bytes, device));
  layout->workspace = workspace;
  layout->workspace_bytes = workspace_bytes;
  return Status::ok();
}

}  // namespace mlakit::detail
