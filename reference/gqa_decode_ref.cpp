// CPU reference of the GQA decode (include/mlakit/gqa_decode.h): float64 logits, softmax and
// accumulation, one query row at a time, parallel over batch entries.
//
// Order of work: validate the arguments, then check the data the host can read (lengths,
// appended slots) so that an error writes nothing, then append k_new / v_new for every batch
// entry, then attend. The append finishes before any row is read, so a batch entry that reads
// a page another entry appends to (a shared prefix) sees the appended row.
//
// Data rules (the reference's own, as the GPU path cannot read device data on the host):
//   - cache_seqlens[i] must be in [0, max_blocks_per_seq * page_size], and >= s_q with k_new
//     (the new tokens occupy positions L - s_q .. L - 1): else InvalidArgument;
//   - two appended tokens may not land on one cache slot (the GPU writes would race):
//     InvalidArgument naming both;
//   - a block-table entry outside [0, num_blocks) is never dereferenced: a token appended
//     there is dropped, and a row whose visible keys [first, last] reach such a block is a
//     NaN row (out and lse NaN), as the MLA reference does (mla_decode_ref.cpp);
//   - finished entries are skipped entirely: their lengths and table are not read.
// Buffers: per thread d-sized rows and the visible logits, and per sequence one count per
// table entry its length covers; all bounded by the table width * page size.
#include <algorithm>
#include <array>
#include <cmath>
#include <string>
#include <vector>

#include "common/rotary.h"
#include "host/check.h"
#include "host/gqa_decode_validate.h"
#include "host/mla_decode_validate.h"
#include "mlakit/gqa_decode.h"
#include "reference/gqa_cache_ref.h"
#include "reference/guarded.h"
#include "reference/host_numeric.h"
#include "reference/parallel.h"

namespace mlakit::reference {
namespace {

using detail::GqaDecodeShape;
using detail::GqaScaleLayout;

constexpr const char* kOp = "reference::gqa_decode";

// One of the two caches with its scale layout: element offsets of a (block, row, kv head).
struct Cache {
  const TensorRef& values;
  const TensorRef& scale;
  GqaScaleLayout layout;

  int64_t row(int64_t block, int64_t slot_row, int hk) const {
    return block * values.stride[0] + slot_row * values.stride[1] + hk * values.stride[2];
  }
  int64_t scale_at(int64_t block, int64_t slot_row, int hk) const {
    return block * scale.stride[0] + slot_row * scale.stride[1] + hk * scale.stride[2];
  }
  double scale_of(int64_t block, int64_t slot_row, int hk) const {
    switch (layout) {
      case GqaScaleLayout::kPerTensor:
        return host::load_as<float>(scale.data, 0);
      case GqaScaleLayout::kPerToken:
        return host::load_as<float>(scale.data, scale_at(block, slot_row, hk));
      default:
        return 1.0;
    }
  }
  // Dequantized row: stored * scale, in float64.
  void load(int64_t block, int64_t slot_row, int hk, int d, double* dst) const {
    const double s = scale_of(block, slot_row, hk);
    const int64_t base = row(block, slot_row, hk);
    for (int c = 0; c < d; ++c) dst[c] = load_cache_value(values.data, base + c, values.dtype) * s;
  }
  // Appends row src[src_index, + d) (rotated by `rope` at `pos`) as the GPU does.
  void append(int64_t block, int64_t slot_row, int hk, const TensorRef& src, int64_t src_index, int d,
              const RowRope& rope, int64_t pos) const {
    const bool per_tensor = layout == GqaScaleLayout::kPerTensor;
    const float tensor_scale = per_tensor ? host::load_as<float>(scale.data, 0) : 0.0f;
    const float s = append_cache_row(src.data, src_index, src.dtype, d, rope, pos, values.dtype, per_tensor,
                                     tensor_scale, values.data, row(block, slot_row, hk));
    if (layout == GqaScaleLayout::kPerToken) host::store_as<float>(scale.data, scale_at(block, slot_row, hk), s);
  }
};

struct Context {
  const GqaDecodeArgs& a;
  const GqaDecodeShape& p;
  double softmax_scale;
  Cache k, v;

  bool finished(int64_t i) const {
    return !a.finished.empty() && host::load_as<uint8_t>(a.finished.data, i * a.finished.stride[0]) != 0;
  }
  int64_t length(int64_t i) const { return host::load_as<int32_t>(a.cache_seqlens.data, i * a.cache_seqlens.stride[0]); }
  // Physical block of logical block `logical` of entry i, or -1 when outside [0, num_blocks).
  int64_t block(int64_t i, int64_t logical) const {
    const int32_t b = host::load_as<int32_t>(a.block_table.data, i * a.block_table.stride[0] + logical);
    return b >= 0 && b < p.num_blocks ? b : -1;
  }
};

Status check_data(const Context& c) {
  const GqaDecodeShape& p = c.p;
  const int64_t capacity = int64_t{p.max_blocks_per_seq} * p.page_size;  // < 2^61
  std::vector<std::array<int64_t, 3>> slots;  // (slot, entry, token) of every appended token
  for (int64_t i = 0; i < p.b; ++i) {
    if (c.finished(i)) continue;
    const int64_t L = c.length(i);
    auto bad = [&](const std::string& expected) {
      return detail::invalid(kOp, "cache_seqlens[" + std::to_string(i) + "]: expected " + expected + ", got " +
                                      std::to_string(L));
    };
    if (L < 0) return bad(">= 0");
    if (L > capacity) {
      return bad("<= max_blocks_per_seq * page_size = " + std::to_string(capacity) + " (the block table's reach)");
    }
    if (p.append && L < p.s_q) {
      return bad(">= s_q = " + std::to_string(p.s_q) + " (k_new / v_new are written at positions L - s_q .. L - 1)");
    }
    if (!p.append) continue;
    for (int t = 0; t < p.s_q; ++t) {
      const int64_t pos = L - p.s_q + t, block = c.block(i, pos / p.page_size);
      if (block >= 0) slots.push_back({block * p.page_size + pos % p.page_size, i, t});
    }
  }
  std::sort(slots.begin(), slots.end());
  for (std::size_t n = 1; n < slots.size(); ++n) {
    if (slots[n][0] != slots[n - 1][0]) continue;
    auto who = [](const std::array<int64_t, 3>& s) {
      return "entry " + std::to_string(s[1]) + " token " + std::to_string(s[2]);
    };
    return detail::invalid(kOp, "block_table: expected distinct cache slots for the appended tokens, got block " +
                                    std::to_string(slots[n][0] / p.page_size) + " row " +
                                    std::to_string(slots[n][0] % p.page_size) + " written by " + who(slots[n - 1]) +
                                    " and " + who(slots[n]));
  }
  return Status::ok();
}

// Writes entry i's s_q new tokens as the GPU's append does (append_cache_row): k rotated at
// its position in float by the shared rotary code (common/rotary.h), both quantized to the
// cache's format. (q is rotated in float64, apply_rope: it is never stored.)
void append_sequence(const Context& c, int64_t i) {
  const GqaDecodeArgs& a = c.a;
  const GqaDecodeShape& p = c.p;
  const int64_t L = c.length(i);
  const RowRope k_rope{a.rope.style, p.rotary_dim, detail::rope_log_theta(a.rope.theta)};
  for (int t = 0; t < p.s_q; ++t) {
    const int64_t pos = L - p.s_q + t, block = c.block(i, pos / p.page_size), slot_row = pos % p.page_size;
    if (block < 0) continue;  // never dereferenced; the rows that read it are NaN rows
    for (int hk = 0; hk < p.h_kv; ++hk) {
      const int64_t k_base = i * a.k_new.stride[0] + t * a.k_new.stride[1] + hk * a.k_new.stride[2];
      c.k.append(block, slot_row, hk, a.k_new, k_base, p.d, k_rope, pos);
      const int64_t v_base = i * a.v_new.stride[0] + t * a.v_new.stride[1] + hk * a.v_new.stride[2];
      c.v.append(block, slot_row, hk, a.v_new, v_base, p.d, RowRope{}, pos);
    }
  }
}

// Scratch of one thread.
struct Rows {
  std::vector<double> q, key, out, logits;
};

// Attention of row (t, head) of entry i over the visible positions [first, last] into r.out;
// returns the natural-log LSE.
double attend_row(const Context& c, int64_t i, int t, int head, int64_t pos, int64_t first, int64_t last, Rows& r) {
  const GqaDecodeArgs& a = c.a;
  const GqaDecodeShape& p = c.p;
  const int hk = head / (p.h_q / p.h_kv);
  const int64_t q_base = i * a.q.stride[0] + t * a.q.stride[1] + head * a.q.stride[2];
  for (int d = 0; d < p.d; ++d) r.q[d] = host::load_half(a.q.data, q_base + d, a.q.dtype);
  apply_rope(r.q.data(), a.rope.style, a.rope.theta, p.rotary_dim, static_cast<double>(pos));
  const double slope = a.alibi_slopes.empty() ? 0.0 : host::load_as<float>(a.alibi_slopes.data, head);

  const int64_t n = last - first + 1;
  if (r.logits.size() < static_cast<std::size_t>(n)) r.logits.resize(n);
  for (int64_t j = first; j <= last; ++j) {
    c.k.load(c.block(i, j / p.page_size), j % p.page_size, hk, p.d, r.key.data());
    double s = 0.0;
    for (int d = 0; d < p.d; ++d) s += r.q[d] * r.key[d];
    s *= c.softmax_scale;
    if (a.softcap > 0) s = a.softcap * std::tanh(s / a.softcap);
    r.logits[j - first] = s + slope * static_cast<double>(j - pos);
  }
  const double m = *std::max_element(r.logits.begin(), r.logits.begin() + n);
  double sum = 0.0;
  for (int64_t j = first; j <= last; ++j) {
    const double w = std::exp(r.logits[j - first] - m);
    sum += w;
    c.v.load(c.block(i, j / p.page_size), j % p.page_size, hk, p.d, r.key.data());
    for (int d = 0; d < p.d; ++d) r.out[d] += w * r.key[d];
  }
  for (double& o : r.out) o /= sum;
  return m + std::log(sum);
}

void store_row(const Context& c, int64_t i, int t, int head, const std::vector<double>& out, double lse) {
  const GqaDecodeArgs& a = c.a;
  const int64_t base = i * a.out.stride[0] + t * a.out.stride[1] + head * a.out.stride[2];
  for (int d = 0; d < c.p.d; ++d) host::store_result(a.out.data, base + d, a.out.dtype, static_cast<float>(out[d]));
  if (!a.lse.empty()) {
    host::store_as<float>(a.lse.data, i * a.lse.stride[0] + head * a.lse.stride[1] + t * a.lse.stride[2],
                          static_cast<float>(lse));
  }
}

void decode_sequence(const Context& c, int64_t i) {
  const GqaDecodeShape& p = c.p;
  const int64_t L = c.length(i);
  // invalid[n]: table entries outside [0, num_blocks) among the first n logical blocks.
  const int64_t needed = (L + p.page_size - 1) / p.page_size;
  std::vector<int64_t> invalid(needed + 1, 0);
  for (int64_t n = 0; n < needed; ++n) invalid[n + 1] = invalid[n] + (c.block(i, n) < 0);

  Rows r{std::vector<double>(p.d), std::vector<double>(p.d), std::vector<double>(p.d), {}};
  for (int t = 0; t < p.s_q; ++t) {
    const int64_t pos = L - p.s_q + t;  // negative only without k_new (L < s_q)
    const int64_t last = c.a.causal ? pos : L - 1;
    const int64_t first = c.a.window > 0 ? std::max<int64_t>(0, last - c.a.window + 1) : 0;
    const bool empty = last < first;
    const bool unreadable = !empty && invalid[last / p.page_size + 1] > invalid[first / p.page_size];
    for (int head = 0; head < p.h_q; ++head) {
      std::fill(r.out.begin(), r.out.end(), 0.0);
      double lse = INFINITY;  // no visible key: out 0, lse +inf (docs/contract.md, Empty rows)
      if (unreadable) {
        std::fill(r.out.begin(), r.out.end(), NAN);
        lse = NAN;
      } else if (!empty) {
        lse = attend_row(c, i, t, head, pos, first, last, r);
      }
      store_row(c, i, t, head, r.out, lse);
    }
  }
}

}  // namespace

Status gqa_decode(const GqaDecodeArgs& args, int num_threads) {
  GqaDecodeShape p;
  MLAKIT_RETURN_IF_ERROR(detail::validate_gqa_decode_args(kOp, args, &p, /*allow_float_out=*/true));
  if (detail::is_empty_problem(p)) return Status::ok();
  const Context c{args,
                  p,
                  detail::resolve_softmax_scale(args.softmax_scale, p.d),
                  {args.k_cache.values, args.k_cache.scale, p.scale_layout},
                  {args.v_cache.values, args.v_cache.scale, p.scale_layout}};
  Status data;
  const Status run = run_guarded(kOp, [&] {
    data = check_data(c);
    if (!data.is_ok()) return;
    auto live = [&](auto f) {
      return [&c, f](int64_t i) {
        if (!c.finished(i)) f(c, i);
      };
    };
    if (p.append) parallel_for(p.b, num_threads, live(append_sequence));
    parallel_for(p.b, num_threads, live(decode_sequence));
  });
  return run.is_ok() ? data : run;
}

}  // namespace mlakit::reference
