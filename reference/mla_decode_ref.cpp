// CPU reference of the dense MLA decode: float64 logits, softmax and accumulation, written
// for obviousness (one query row at a time), parallel over sequences.
//
// The block table is checked before anything is allocated: a row whose visible keys reach a
// table entry outside [0, num_blocks) or past the table's width is a NaN row, found in
// O(table width) whatever the length says, so buffers never exceed the keys that can be
// dereferenced (table width * page size).
#include <algorithm>
#include <cmath>
#include <vector>

#include "host/decode_layout.h"
#include "host/mla_decode_validate.h"
#include "mlakit/reference.h"
#include "reference/guarded.h"
#include "reference/host_numeric.h"
#include "reference/parallel.h"

namespace mlakit::reference {
namespace {

constexpr const char* kOp = "reference::mla_decode";

// What every row of one sequence shares.
struct SequenceView {
  const MlaDecodeArgs& a;
  const MlaDecodeProblem& p;
  double scale;
  int64_t seq;
  int64_t length;         // cache_seqlens[seq], negative counted as 0
  int64_t usable_blocks;  // leading table entries within [0, num_blocks)
};

// The number of leading entries of the sequence's table row that can be dereferenced,
// scanning no further than the `needed` blocks the length covers.
int64_t usable_blocks(const MlaDecodeArgs& a, int64_t seq, int64_t needed) {
  const int64_t num_blocks = a.kv_cache.shape[0];
  const int64_t scan = std::min(needed, a.block_table.shape[1]);
  const int64_t row = seq * a.block_table.stride[0];
  for (int64_t logical = 0; logical < scan; ++logical) {
    const int32_t block = host::load_as<int32_t>(a.block_table.data, row + logical);
    if (block < 0 || block >= num_blocks) return logical;
  }
  return scan;
}

int64_t visible_keys(const SequenceView& s, int t) {
  if (s.a.causal && s.p.s_q > 1) return std::clamp<int64_t>(s.length - s.p.s_q + t + 1, 0, s.length);
  return s.length;
}

// Element offset of key j's row for kv head `hk` (j within the usable blocks).
int64_t key_offset(const SequenceView& s, int64_t j, int hk) {
  const int64_t page = s.a.kv_cache.shape[1];
  const int64_t block = host::load_as<int32_t>(s.a.block_table.data, s.seq * s.a.block_table.stride[0] + j / page);
  return block * s.a.kv_cache.stride[0] + (j % page) * s.a.kv_cache.stride[1] + hk * s.a.kv_cache.stride[2];
}

// Attention of query row (t, head) over its `visible` keys into out (d_v); returns the
// natural-log LSE. `q` and `logits` are scratch of d_qk and >= visible elements.
double attend_row(const SequenceView& s, int t, int head, int64_t visible, std::vector<double>& q,
                  std::vector<double>& logits, std::vector<double>& out) {
  const DType dt = s.a.q.dtype;
  const int hk = head / (s.p.h_q / s.p.h_kv);
  const int64_t q_base = s.seq * s.a.q.stride[0] + t * s.a.q.stride[1] + head * s.a.q.stride[2];
  for (int d = 0; d < s.p.d_qk; ++d) q[d] = host::load_half(s.a.q.data, q_base + d, dt);

  for (int64_t j = 0; j < visible; ++j) {
    const int64_t key = key_offset(s, j, hk);
    double dot = 0.0;
    for (int d = 0; d < s.p.d_qk; ++d) dot += q[d] * host::load_half(s.a.kv_cache.data, key + d, dt);
    logits[j] = dot * s.scale;
  }
  const double m = *std::max_element(logits.begin(), logits.begin() + visible);
  double sum = 0.0;
  for (int64_t j = 0; j < visible; ++j) {
    const int64_t key = key_offset(s, j, hk);
    const double w = std::exp(logits[j] - m);
    sum += w;
    for (int d = 0; d < s.p.d_v; ++d) out[d] += w * host::load_half(s.a.kv_cache.data, key + d, dt);
  }
  for (double& v : out) v /= sum;
  return m + std::log(sum);
}

void store_row(const SequenceView& s, int t, int head, const std::vector<double>& out, double lse) {
  const MlaDecodeArgs& a = s.a;
  const int64_t out_base = s.seq * a.out.stride[0] + t * a.out.stride[1] + head * a.out.stride[2];
  for (int d = 0; d < s.p.d_v; ++d) {
    host::store_result(a.out.data, out_base + d, a.out.dtype, static_cast<float>(out[d]));
  }
  host::store_as<float>(a.lse.data, s.seq * a.lse.stride[0] + head * a.lse.stride[1] + t * a.lse.stride[2],
                        static_cast<float>(lse));
}

void decode_sequence(const MlaDecodeArgs& a, const MlaDecodeProblem& p, double scale, int64_t seq) {
  const int64_t page = a.kv_cache.shape[1];
  const int64_t length = std::max<int32_t>(host::load_as<int32_t>(a.cache_seqlens.data, seq), 0);
  const int64_t needed_blocks = (length + page - 1) / page;
  const SequenceView s{a, p, scale, seq, length, usable_blocks(a, seq, needed_blocks)};
  const int64_t usable_keys = std::min(length, s.usable_blocks * page);

  std::vector<double> q(p.d_qk), out(p.d_v), logits;
  for (int t = 0; t < p.s_q; ++t) {
    const int64_t visible = visible_keys(s, t);
    for (int head = 0; head < p.h_q; ++head) {
      double lse = INFINITY;  // no visible key: output 0, lse +inf
      std::fill(out.begin(), out.end(), 0.0);
      if (visible > usable_keys) {  // a key behind an invalid entry: never dereferenced
        std::fill(out.begin(), out.end(), NAN);
        lse = NAN;
      } else if (visible > 0) {
        if (logits.size() < static_cast<std::size_t>(visible)) logits.resize(visible);
        lse = attend_row(s, t, head, visible, q, logits, out);
      }
      store_row(s, t, head, out, lse);
    }
  }
}

}  // namespace

Status mla_decode(const MlaDecodeArgs& args, int num_threads) {
  MlaDecodeProblem p;
  MLAKIT_RETURN_IF_ERROR(detail::validate_mla_decode_args(kOp, args, &p, /*allow_float_out=*/true));
  // b may be up to 2^30 with s_q or h_q 0: no loop over an empty result.
  if (detail::is_empty_problem(p)) return Status::ok();
  const double scale = detail::resolve_softmax_scale(args.softmax_scale, p.d_qk);
  return run_guarded(kOp, [&] {
    parallel_for(p.b, num_threads, [&](int64_t seq) { decode_sequence(args, p, scale, seq); });
  });
}

}  // namespace mlakit::reference
