#include "host/gqa_decode_layout.h"

#include <algorithm>
#include <string>

#include "common/gqa_decode_tiling.h"
#include "host/check.h"
#include "host/decode_layout.h"

namespace mlakit::detail {

Status validate_gqa_decode_problem(const char* op, const GqaDecodeProblem& p) {
  if (p.b < 0 || p.b > (int64_t{1} << 30)) {
    return invalid(op, "problem.b: expected 0 <= b <= 2^30, got " + std::to_string(p.b));
  }
  if (p.s_q < 0 || p.s_q > 8) return invalid(op, "problem.s_q: expected 0 <= s_q <= 8, got " + std::to_string(p.s_q));
  if (p.h_kv < 1 || p.h_kv > 65535) {
    return invalid(op, "problem.h_kv: expected 1 <= h_kv <= 65535, got " + std::to_string(p.h_kv));
  }
  if (p.h_q < 0 || p.h_q % p.h_kv != 0) {
    return invalid(op, "problem.h_q: expected a multiple of h_kv = " + std::to_string(p.h_kv) + " (>= 0), got " +
                           std::to_string(p.h_q));
  }
  if (p.d != 64 && p.d != 128 && p.d != 256) {
    return unsupported(op, "problem.d: expected 64, 128 or 256, got " + std::to_string(p.d));
  }
  if (p.window < 0) return invalid(op, "problem.window: expected >= 0 (0: none), got " + std::to_string(p.window));
  if (gqa_decode_rows(p) > int64_t{65535} * gqa_tiling::kRows) {
    return unsupported(op, "problem: s_q * h_q / h_kv: expected <= " + std::to_string(65535 * gqa_tiling::kRows) +
                               " query rows per kv head, got " + std::to_string(gqa_decode_rows(p)));
  }
  return Status::ok();
}

int gqa_ctas_per_sm(int d, const DeviceInfo& device) {
  // The larger of the 16-bit and the 8-bit cache's footprint; 1 KB per CTA is reserved by the
  // runtime, and an SM holds 1 KB more than one CTA may opt in to.
  const int smem = std::max(gqa_tiling::smem_bytes(2, d), gqa_tiling::smem_bytes(1, d)) + 1024;
  return std::clamp((device.max_smem_per_block_optin + 1024) / smem, 1, 4);
}

Status make_gqa_decode_layout(const char* op, const GqaDecodeProblem& p, const DeviceInfo& device,
                              GqaDecodePlan* plan) {
  MLAKIT_RETURN_IF_ERROR(validate_gqa_decode_problem(op, p));
  GqaDecodePlan out;
  out.problem = p;
  out.device = device.ordinal;
  out.block_n = gqa_tiling::kKeys;
  out.overhead_blocks = gqa_tiling::kOverheadBlocks;
  out.rows_per_tile = gqa_tiling::kRows;
  // A problem without rows (h_q 0: the append alone) is laid out as one row tile.
  const int64_t row_tiles = std::max<int64_t>(1, (gqa_decode_rows(p) + gqa_tiling::kRows - 1) / gqa_tiling::kRows);
  const int64_t parts = int64_t{device.sm_count} * gqa_ctas_per_sm(p.d, device) / (int64_t{p.h_kv} * row_tiles);
  out.num_parts = static_cast<int>(std::max<int64_t>(1, parts));
  set_schedule_regions(schedule_regions(out.num_parts, p.b, p.h_kv, gqa_decode_rows(p), p.d), &out);
  *plan = out;
  return Status::ok();
}

}  // namespace mlakit::detail
