// CPU reference of the token-sparse MLA prefill (docs/contract.md): float64 logits
// P = q.k * sm_scale * log2(e) over the valid listed rows, base-2 statistics (or natural).
#include <algorithm>
#include <cmath>
#include <vector>

#include "common/math_constants.h"
#include "host/mla_decode_validate.h"
#include "host/mla_sparse_prefill_validate.h"
#include "mlakit/mla_sparse_prefill.h"
#include "reference/guarded.h"
#include "reference/host_numeric.h"
#include "reference/parallel.h"

namespace mlakit::reference {
namespace {

constexpr const char* kOp = "reference::mla_sparse_prefill";
using detail::kLn2;
using detail::kLog2e;

void prefill_token(const MlaSparsePrefillArgs& a, const detail::SparsePrefillShape& s, double scale, int64_t i) {
  int64_t count = s.topk;
  if (!a.topk_length.empty()) {
    count = std::clamp<int64_t>(host::load_as<int32_t>(a.topk_length.data, i * a.topk_length.stride[0]), 0, s.topk);
  }
  // The valid listed kv rows (at most topk <= 2^20), duplicates kept.
  std::vector<int64_t> rows;
  rows.reserve(static_cast<std::size_t>(count));
  for (int64_t k = 0; k < count; ++k) {
    const int64_t row = host::load_as<int32_t>(a.indices.data, i * a.indices.stride[0] + k);
    if (row >= 0 && row < s.s_kv) rows.push_back(row);
  }
  const double base = a.lse_base == LseBase::kNatural ? kLn2 : 1.0;  // log2 units -> chosen base
  for (int h = 0; h < s.h_q; ++h) {
    std::vector<double> out(a.d_v, 0.0);
    double m = -INFINITY, lse2 = INFINITY;
    if (!rows.empty()) {
      std::vector<double> p(rows.size());
      for (size_t j = 0; j < rows.size(); ++j) {
        double dot = 0;
        for (int d = 0; d < s.d_qk; ++d) {
          dot += double(host::load_half(a.q.data, i * a.q.stride[0] + h * a.q.stride[1] + d, DType::kBF16)) *
                 host::load_half(a.kv.data, rows[j] * a.kv.stride[0] + d, DType::kBF16);
        }
        p[j] = dot * scale * kLog2e;
        m = std::max(m, p[j]);
      }
      double sum = 0;
      for (double v : p) sum += std::exp2(v - m);
      lse2 = m + std::log2(sum);
      double factor = 1.0;
      if (!a.attn_sink.empty()) {
        const double sink = host::load_as<float>(a.attn_sink.data, h * a.attn_sink.stride[0]);
        factor = 1.0 / (1.0 + std::exp(sink - lse2 * kLn2));
      }
      for (size_t j = 0; j < rows.size(); ++j) {
        const double w = std::exp2(p[j] - lse2) * factor;
        for (int d = 0; d < a.d_v; ++d) {
          out[d] += w * host::load_half(a.kv.data, rows[j] * a.kv.stride[0] + d, DType::kBF16);
        }
      }
    }
    const int64_t o = i * a.out.stride[0] + h * a.out.stride[1];
    for (int d = 0; d < a.d_v; ++d) {
      host::store_result(a.out.data, o + d, a.out.dtype, static_cast<float>(out[d]));
    }
    host::store_as<float>(a.max_logits.data, i * a.max_logits.stride[0] + h * a.max_logits.stride[1],
                          static_cast<float>(m * base));
    host::store_as<float>(a.lse.data, i * a.lse.stride[0] + h * a.lse.stride[1], static_cast<float>(lse2 * base));
  }
}

}  // namespace

Status mla_sparse_prefill(const MlaSparsePrefillArgs& args, int num_threads) {
  detail::SparsePrefillShape s;
  MLAKIT_RETURN_IF_ERROR(detail::validate_mla_sparse_prefill_args(kOp, args, /*allow_float_out=*/true, &s));
  if (detail::is_empty_problem(s)) return Status::ok();  // nothing to write
  const double scale = detail::resolve_softmax_scale(args.sm_scale, s.d_qk);
  return run_guarded(kOp, [&] {
    parallel_for(s.s_q, num_threads, [&](int64_t i) { prefill_token(args, s, scale, i); });
  });
}

}  // namespace mlakit::reference
