// CPU reference of the dense MLA decode: float64 logits, softmax and accumulation, written
// for obviousness (one query row at a time), parallel over sequences.
#include <algorithm>
#include <cmath>
#include <vector>

#include "host/mla_decode_validate.h"
#include "mlakit/reference.h"
#include "reference/host_numeric.h"
#include "reference/parallel.h"

namespace mlakit::reference {
namespace {

struct RowResult {
  std::vector<double> out;
  double lse;  // natural log; +inf for a row with no visible key; NaN for an invalid table
};

// Attention of query row (seq, t, head) over its visible keys.
RowResult attend_row(const MlaDecodeArgs& a, const MlaDecodeProblem& p, double scale, int64_t seq,
                     int t, int head, int32_t seqlen) {
  const DType dt = a.q.dtype;
  const int64_t page = a.kv_cache.shape[1];
  const int64_t num_blocks = a.kv_cache.shape[0];
  const int64_t table_width = a.block_table.shape[1];
  const int hk = head / (p.h_q / p.h_kv);
  const int64_t L = std::max<int32_t>(seqlen, 0);
  int64_t visible = L;
  if (a.causal && p.s_q > 1) visible = std::clamp<int64_t>(L - p.s_q + t + 1, 0, L);

  RowResult r{std::vector<double>(p.d_v, 0.0), INFINITY};
  if (visible == 0) return r;

  const int64_t q_base = seq * a.q.stride[0] + t * a.q.stride[1] + head * a.q.stride[2];
  std::vector<double> q(p.d_qk);
  for (int d = 0; d < p.d_qk; ++d) q[d] = host::load_half(a.q.data, q_base + d, dt);

  const auto* table = static_cast<const int32_t*>(a.block_table.data);
  std::vector<int64_t> key_base(visible);
  std::vector<double> logits(visible);
  for (int64_t j = 0; j < visible; ++j) {
    const int64_t logical = j / page;
    const int32_t block = logical < table_width ? table[seq * a.block_table.stride[0] + logical] : -1;
    if (block < 0 || block >= num_blocks) {
      r.out.assign(p.d_v, NAN);
      r.lse = NAN;
      return r;
    }
    key_base[j] = block * a.kv_cache.stride[0] + (j % page) * a.kv_cache.stride[1] + hk * a.kv_cache.stride[2];
    double dot = 0.0;
    for (int d = 0; d < p.d_qk; ++d) dot += q[d] * host::load_half(a.kv_cache.data, key_base[j] + d, dt);
    logits[j] = dot * scale;
  }
  const double m = *std::max_element(logits.begin(), logits.end());
  double sum = 0.0;
  for (int64_t j = 0; j < visible; ++j) {
    const double w = std::exp(logits[j] - m);
    sum += w;
    for (int d = 0; d < p.d_v; ++d) r.out[d] += w * host::load_half(a.kv_cache.data, key_base[j] + d, dt);
  }
  for (double& v : r.out) v /= sum;
  r.lse = m + std::log(sum);
  return r;
}

void decode_sequence(const MlaDecodeArgs& a, const MlaDecodeProblem& p, double scale, int64_t seq) {
  const int32_t seqlen = static_cast<const int32_t*>(a.cache_seqlens.data)[seq];
  auto* lse = static_cast<float*>(a.lse.data);
  for (int t = 0; t < p.s_q; ++t) {
    for (int head = 0; head < p.h_q; ++head) {
      RowResult r = attend_row(a, p, scale, seq, t, head, seqlen);
      const int64_t out_base = seq * a.out.stride[0] + t * a.out.stride[1] + head * a.out.stride[2];
      for (int d = 0; d < p.d_v; ++d) {
        if (a.out.dtype == DType::kFP32) {
          static_cast<float*>(a.out.data)[out_base + d] = static_cast<float>(r.out[d]);
        } else {
          host::store_half(a.out.data, out_base + d, a.out.dtype, static_cast<float>(r.out[d]));
        }
      }
      lse[seq * a.lse.stride[0] + head * a.lse.stride[1] + t * a.lse.stride[2]] = static_cast<float>(r.lse);
    }
  }
}

}  // namespace

Status mla_decode(const MlaDecodeArgs& args, int num_threads) {
  MlaDecodeProblem p;
  MLAKIT_RETURN_IF_ERROR(detail::validate_mla_decode_args("reference::mla_decode", args, &p,
                                                           /*allow_float_out=*/true));
  const double scale = detail::resolve_softmax_scale(args.softmax_scale, p.d_qk);
  parallel_for(p.b, num_threads, [&](int64_t seq) { decode_sequence(args, p, scale, seq); });
  return Status::ok();
}

}  // namespace mlakit::reference
