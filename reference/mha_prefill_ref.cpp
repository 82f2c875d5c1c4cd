// CPU reference of the dense MHA prefill forward (include/mlakit/mha_prefill.h): float64
// logits and softmax per (sequence, query, head), natural-log LSE.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "host/check.h"
#include "host/mha_prefill_validate.h"
#include "host/mla_decode_validate.h"
#include "mlakit/mha_prefill.h"
#include "reference/guarded.h"
#include "reference/host_numeric.h"
#include "reference/mha_prefill_sequences.h"
#include "reference/parallel.h"

namespace mlakit::reference {
namespace {

constexpr const char* kOp = "reference::mha_prefill";

void query_row(const MhaPrefillArgs& a, const detail::MhaPrefillShape& s, double scale, const MhaSequence& seq,
               int64_t t, int h) {
  const int hk = h / (s.h_q / s.h_kv);
  const int64_t last = a.causal ? std::min(seq.lk - 1, t + seq.lk - seq.lq) : seq.lk - 1;  // visible keys [0, last]
  const DType dt = a.q.dtype;
  const int64_t qo = (seq.q0 + t) * a.q.stride[0] + h * a.q.stride[1];
  std::vector<double> out(static_cast<std::size_t>(s.d_v), 0.0);
  double lse = INFINITY;
  if (last >= 0) {
    std::vector<double> logit(static_cast<std::size_t>(last + 1));
    double m = -INFINITY;
    for (int64_t j = 0; j <= last; ++j) {
      const int64_t ko = (seq.k0 + j) * a.k.stride[0] + hk * a.k.stride[1];
      double dot = 0;
      for (int d = 0; d < s.d_qk; ++d) dot += double(host::load_half(a.q.data, qo + d, dt)) * host::load_half(a.k.data, ko + d, dt);
      logit[j] = dot * scale;
      m = std::max(m, logit[j]);
    }
    double sum = 0;
    for (double x : logit) sum += std::exp(x - m);
    for (int64_t j = 0; j <= last; ++j) {
      const double w = std::exp(logit[j] - m) / sum;
      const int64_t vo = (seq.k0 + j) * a.v.stride[0] + hk * a.v.stride[1];
      for (int d = 0; d < s.d_v; ++d) out[d] += w * host::load_half(a.v.data, vo + d, dt);
    }
    lse = m + std::log(sum);
  }
  const int64_t oo = (seq.q0 + t) * a.out.stride[0] + h * a.out.stride[1];
  for (int d = 0; d < s.d_v; ++d) host::store_result(a.out.data, oo + d, a.out.dtype, static_cast<float>(out[d]));
  if (!a.lse.empty()) {
    host::store_as<float>(a.lse.data, h * a.lse.stride[0] + (seq.q0 + t) * a.lse.stride[1], static_cast<float>(lse));
  }
}

}  // namespace

Status read_mha_sequences(const char* op, const TensorRef& cu_seqlens_q, const TensorRef& cu_seqlens_k,
                          int max_seqlen_q, int max_seqlen_k, const detail::MhaPrefillShape& s,
                          std::vector<MhaSequence>* out) {
  auto entry = [](const TensorRef& t, int64_t i) { return int64_t{host::load_as<int32_t>(t.data, i * t.stride[0])}; };
  out->resize(static_cast<std::size_t>(s.b));
  struct Side {
    const char* name;
    const TensorRef& cu;
    int64_t total;
    int max_len;
    const char* max_name;
  };
  const Side sides[] = {{"cu_seqlens_q", cu_seqlens_q, s.total_q, max_seqlen_q, "max_seqlen_q"},
                        {"cu_seqlens_k", cu_seqlens_k, s.total_k, max_seqlen_k, "max_seqlen_k"}};
  for (int side = 0; side < 2; ++side) {
    const Side& d = sides[side];
    if (entry(d.cu, 0) != 0) {
      return detail::invalid(op, std::string(d.name) + "[0]: expected 0, got " + std::to_string(entry(d.cu, 0)));
    }
    for (int64_t i = 0; i < s.b; ++i) {  // ordered first: a length is only meaningful then
      const int64_t begin = entry(d.cu, i), end = entry(d.cu, i + 1);
      if (end < begin || end > d.total) {
        return detail::invalid(op, std::string(d.name) + "[" + std::to_string(i + 1) + "]: expected " +
                                       std::to_string(begin) + " <= value <= " + std::to_string(d.total) +
                                       " (ordered prefix sums within the rows), got " + std::to_string(end));
      }
    }
    for (int64_t i = 0; i < s.b; ++i) {
      const int64_t begin = entry(d.cu, i), end = entry(d.cu, i + 1);
      if (end - begin > d.max_len) {
        return detail::invalid(op, std::string(d.max_name) + ": expected >= every length, got " +
                                       std::to_string(d.max_len) + " with sequence " + std::to_string(i) +
                                       " of length " + std::to_string(end - begin));
      }
      MhaSequence& q = (*out)[static_cast<std::size_t>(i)];
      (side == 0 ? q.q0 : q.k0) = begin;
      (side == 0 ? q.lq : q.lk) = end - begin;
    }
  }
  return Status::ok();
}

Status mha_prefill(const MhaPrefillArgs& args, int num_threads) {
  detail::MhaPrefillShape s;
  MLAKIT_RETURN_IF_ERROR(detail::validate_mha_prefill_args(kOp, args, /*allow_float_out=*/true, &s));
  if (s.b == 0) return Status::ok();
  std::vector<MhaSequence> seqs;
  MLAKIT_RETURN_IF_ERROR(read_mha_sequences(kOp, args.cu_seqlens_q, args.cu_seqlens_k, args.max_seqlen_q,
                                            args.max_seqlen_k, s, &seqs));
  if (detail::is_empty_problem(s)) return Status::ok();
  const double scale = detail::resolve_softmax_scale(args.softmax_scale, s.d_qk);
  // One work item per (sequence, query row): rows of one sequence share its keys.
  std::vector<std::pair<int64_t, int64_t>> rows;  // (sequence, query)
  return run_guarded(kOp, [&] {
    for (int64_t i = 0; i < s.b; ++i) {
      for (int64_t t = 0; t < seqs[i].lq; ++t) rows.emplace_back(i, t);
    }
    parallel_for(static_cast<int64_t>(rows.size()), num_threads, [&](int64_t r) {
      const auto [i, t] = rows[static_cast<std::size_t>(r)];
      for (int h = 0; h < s.h_q; ++h) query_row(args, s, scale, seqs[static_cast<std::size_t>(i)], t, h);
    });
  });
}

}  // namespace mlakit::reference
