// CPU reference of the dense MHA prefill backward (include/mlakit/mha_prefill.h): float64
// throughout, from the forward's given out and lse (FlashAttention's backward: D = rowsum(dO *
// O), P = exp(s - lse), neither recomputed from a softmax).
//
// Two kinds of work item, each the single writer of its output rows, so no two threads touch
// one row and every sum runs in a fixed order (the results do not depend on num_threads):
// - (sequence, kv head, block of kKeyBlock keys): dk and dv of those keys, summed over the
//   query heads of the kv head (in order) and their queries (in order);
// - (sequence, query): dq of that query for every head, summed over its keys (in order).
// Memory per item: one block of keys and values and their accumulators, or one row of each
// operand; never Lq x Lk.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>
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

constexpr const char* kOp = "reference::mha_prefill_backward";
constexpr int64_t kKeyBlock = 64;

struct Problem {
  const MhaPrefillBackwardArgs& a;
  const detail::MhaPrefillShape& s;
  double scale;
  int group;  // query heads per kv head
};

// Element `index` of a 16-bit or float32 tensor (out may be the reference forward's float32).
double load(const TensorRef& t, int64_t index) {
  return t.dtype == DType::kFP32 ? double{host::load_as<float>(t.data, index)}
                                 : double{host::load_half(t.data, index, t.dtype)};
}

// Row `row`, head `head` of a [rows, heads, n] tensor into dst[0, n).
void load_row(const TensorRef& t, int64_t row, int head, int n, double* dst) {
  const int64_t base = row * t.stride[0] + head * t.stride[1];
  for (int d = 0; d < n; ++d) dst[d] = load(t, base + d);
}

void store_row(const TensorRef& t, int64_t row, int head, int n, const double* src, double factor) {
  const int64_t base = row * t.stride[0] + head * t.stride[1];
  for (int d = 0; d < n; ++d) host::store_result(t.data, base + d, t.dtype, static_cast<float>(src[d] * factor));
}

double dot(const double* x, const double* y, int n) {
  double sum = 0;
  for (int d = 0; d < n; ++d) sum += x[d] * y[d];
  return sum;
}

// The last key query t sees ([0, last]; -1: none), as in the forward.
int64_t last_key(const Problem& p, const MhaSequence& seq, int64_t t) {
  return p.a.causal ? std::min(seq.lk - 1, t + seq.lk - seq.lq) : seq.lk - 1;
}

// What one (query, head) contributes everywhere: its q and dO rows, D and lse.
struct QueryRow {
  std::vector<double> q, dout;
  double delta = 0, lse = 0;
  explicit QueryRow(const detail::MhaPrefillShape& s)
      : q(static_cast<std::size_t>(s.d_qk)), dout(static_cast<std::size_t>(s.d_v)) {}
  void load(const Problem& p, int64_t row, int h) {
    const MhaPrefillBackwardArgs& a = p.a;
    load_row(a.q, row, h, p.s.d_qk, q.data());
    load_row(a.dout, row, h, p.s.d_v, dout.data());
    const int64_t oo = row * a.out.stride[0] + h * a.out.stride[1];
    delta = 0;
    for (int d = 0; d < p.s.d_v; ++d) delta += dout[d] * reference::load(a.out, oo + d);
    lse = double{host::load_as<float>(a.lse.data, h * a.lse.stride[0] + row * a.lse.stride[1])};
  }
};

// dq of query t of `seq`, every head.
void query_item(const Problem& p, const MhaSequence& seq, int64_t t) {
  const detail::MhaPrefillShape& s = p.s;
  const int64_t row = seq.q0 + t, last = last_key(p, seq, t);
  std::vector<double> dq(static_cast<std::size_t>(s.d_qk)), k(static_cast<std::size_t>(s.d_qk)),
      v(static_cast<std::size_t>(s.d_v));
  QueryRow r(s);
  for (int h = 0; h < s.h_q; ++h) {
    std::fill(dq.begin(), dq.end(), 0.0);
    if (last >= 0) {  // a query that sees no key: dq 0, its lse (+inf) unread
      const int hk = h / p.group;
      r.load(p, row, h);
      for (int64_t j = 0; j <= last; ++j) {
        load_row(p.a.k, seq.k0 + j, hk, s.d_qk, k.data());
        load_row(p.a.v, seq.k0 + j, hk, s.d_v, v.data());
        const double prob = std::exp(p.scale * dot(r.q.data(), k.data(), s.d_qk) - r.lse);
        const double ds = prob * (dot(r.dout.data(), v.data(), s.d_v) - r.delta);
        for (int d = 0; d < s.d_qk; ++d) dq[d] += ds * k[d];
      }
    }
    store_row(p.a.dq, row, h, s.d_qk, dq.data(), p.scale);
  }
}

// dk and dv of keys [j0, j1) of `seq` for kv head hk.
void key_block_item(const Problem& p, const MhaSequence& seq, int hk, int64_t j0, int64_t j1) {
  const detail::MhaPrefillShape& s = p.s;
  const auto n = static_cast<std::size_t>(j1 - j0);
  const auto dqk = static_cast<std::size_t>(s.d_qk), dv_ = static_cast<std::size_t>(s.d_v);
  std::vector<double> k(n * dqk), v(n * dv_), dk(n * dqk, 0.0), dv(n * dv_, 0.0);
  for (std::size_t j = 0; j < n; ++j) {
    load_row(p.a.k, seq.k0 + j0 + static_cast<int64_t>(j), hk, s.d_qk, &k[j * dqk]);
    load_row(p.a.v, seq.k0 + j0 + static_cast<int64_t>(j), hk, s.d_v, &v[j * dv_]);
  }
  // Causal: query t sees key j iff j <= t + Lk - Lq, so the block's first key is seen from
  // t = j0 - (Lk - Lq) on.
  const int64_t t_first = p.a.causal ? std::max<int64_t>(0, j0 - (seq.lk - seq.lq)) : 0;
  QueryRow r(s);
  for (int h = hk * p.group; h < (hk + 1) * p.group; ++h) {
    for (int64_t t = t_first; t < seq.lq; ++t) {
      const int64_t end = std::min(j1 - 1, last_key(p, seq, t));  // visible keys of the block: [j0, end]
      r.load(p, seq.q0 + t, h);
      for (int64_t jj = j0; jj <= end; ++jj) {
        const auto j = static_cast<std::size_t>(jj - j0);
        const double* kj = &k[j * dqk];
        const double* vj = &v[j * dv_];
        const double prob = std::exp(p.scale * dot(r.q.data(), kj, s.d_qk) - r.lse);
        const double ds = prob * (dot(r.dout.data(), vj, s.d_v) - r.delta);
        double* dkj = &dk[j * dqk];
        double* dvj = &dv[j * dv_];
        for (int d = 0; d < s.d_v; ++d) dvj[d] += prob * r.dout[d];
        for (int d = 0; d < s.d_qk; ++d) dkj[d] += ds * r.q[d];
      }
    }
  }
  for (std::size_t j = 0; j < n; ++j) {  // keys no query sees: 0
    store_row(p.a.dk, seq.k0 + j0 + static_cast<int64_t>(j), hk, s.d_qk, &dk[j * dqk], p.scale);
    store_row(p.a.dv, seq.k0 + j0 + static_cast<int64_t>(j), hk, s.d_v, &dv[j * dv_], 1.0);
  }
}

}  // namespace

Status mha_prefill_backward(const MhaPrefillBackwardArgs& args, int num_threads) {
  detail::MhaPrefillShape s;
  MLAKIT_RETURN_IF_ERROR(detail::validate_mha_prefill_backward_args(kOp, args, /*allow_float=*/true, &s));
  if (s.b == 0) return Status::ok();
  std::vector<MhaSequence> seqs;
  MLAKIT_RETURN_IF_ERROR(read_mha_sequences(kOp, args.cu_seqlens_q, args.cu_seqlens_k, args.max_seqlen_q,
                                            args.max_seqlen_k, s, &seqs));
  // No early return for total_q = 0 or h_q = 0 (the forward's empty problem): the key rows
  // inside sequences still get their gradient, 0.
  const Problem p{args, s, detail::resolve_softmax_scale(args.softmax_scale, s.d_qk), s.h_q / s.h_kv};
  std::vector<std::pair<int64_t, int64_t>> blocks;  // (sequence, first key), each for every kv head
  std::vector<std::pair<int64_t, int64_t>> queries;  // (sequence, query)
  return run_guarded(kOp, [&] {
    for (int64_t i = 0; i < s.b; ++i) {
      const MhaSequence& seq = seqs[static_cast<std::size_t>(i)];
      for (int64_t j0 = 0; j0 < seq.lk; j0 += kKeyBlock) blocks.emplace_back(i, j0);
      if (s.h_q > 0) {
        for (int64_t t = 0; t < seq.lq; ++t) queries.emplace_back(i, t);
      }
    }
    // Key blocks first (the larger items), then the queries.
    const int64_t n_blocks = static_cast<int64_t>(blocks.size()) * s.h_kv;
    parallel_for(n_blocks + static_cast<int64_t>(queries.size()), num_threads, [&](int64_t item) {
      if (item < n_blocks) {
        const auto [i, j0] = blocks[static_cast<std::size_t>(item / s.h_kv)];
        const MhaSequence& seq = seqs[static_cast<std::size_t>(i)];
        key_block_item(p, seq, static_cast<int>(item % s.h_kv), j0, std::min(seq.lk, j0 + kKeyBlock));
      } else {
        const auto [i, t] = queries[static_cast<std::size_t>(item - n_blocks)];
        query_item(p, seqs[static_cast<std::size_t>(i)], t);
      }
    });
  });
}

}  // namespace mlakit::reference
