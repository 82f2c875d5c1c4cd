// Fuzz drivers of the sparse prefill, the FP8 cache tools of V3.2 and V4 (GPU entry points and
// references), make_tensor and reference::merge_states.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "host/check.h"
#include "mlakit/fp8_cache.h"
#include "mlakit/mla_sparse_prefill.h"
#include "mlakit/reference.h"
#include "validation_fuzz_runner.h"

namespace mlakit::fuzz {
namespace {

using enum DType;

void run_sparse_prefill(Rng& rng, Recorder& rec, int64_t index, bool reference) {
  Symbols s{{"s_q", rng.size(0, 3)}, {"h_q", rng.size(0, 4)}, {"d_qk", rng.chance(0.5) ? 576 : 512},
            {"s_kv", rng.size(0, 24)}, {"topk", rng.size(1, 40)}};
  if (rng.chance(0.03)) s["d_qk"] = rng.edge_size();
  FuzzCase c{.op = reference ? "reference::mla_sparse_prefill" : "mla_sparse_prefill", .host_memory = reference};
  c.args = make_args(
      rng,
      {{.name = "q", .dims = {sym("s_q"), sym("h_q"), sym("d_qk")}, .dtypes = {kBF16}},
       {.name = "kv", .dims = {sym("s_kv"), fixed(1), sym("d_qk")}, .dtypes = {kBF16}},
       {.name = "indices", .dims = {sym("s_q"), fixed(1), sym("topk")}, .dtypes = {kInt32}, .fill = Fill::kIndex,
        .index_below = s.at("s_kv")},
       {.name = "topk_length", .dims = {sym("s_q")}, .dtypes = {kInt32}, .optional = true, .fill = Fill::kIndex,
        .index_below = std::min<int64_t>(s.at("topk"), INT32_MAX) + 1},
       {.name = "attn_sink", .dims = {sym("h_q")}, .dtypes = {kFP32}, .optional = true, .fill = Fill::kFloat},
       {.name = "out", .dims = {sym("s_q"), sym("h_q"), fixed(512)}, .dtypes = {kBF16}, .or_float32 = reference,
        .output = true, .fill = Fill::kPoison},
       {.name = "max_logits", .dims = {sym("s_q"), sym("h_q")}, .dtypes = {kFP32}, .output = true, .fill = Fill::kPoison},
       {.name = "lse", .dims = {sym("s_q"), sym("h_q")}, .dtypes = {kFP32}, .output = true, .fill = Fill::kPoison}},
      s);
  const std::optional<float> scale = random_scale(rng);
  const int d_v = rng.chance(0.95) ? 512 : rng.edge_int();
  const auto lse_base = static_cast<LseBase>(rng.chance(0.9) ? static_cast<int>(rng.uniform(0, 1)) : rng.edge_int());
  const auto kernel = static_cast<MlaKernel>(rng.chance(0.9) ? static_cast<int>(rng.uniform(-1, 1)) : rng.edge_int());
  const int threads = reference_threads(rng);
  c.scalars = {{"sm_scale", str(scale)},
               {"d_v", std::to_string(d_v)},
               {"lse_base", std::to_string(static_cast<int>(lse_base))},
               {"kernel", std::to_string(static_cast<int>(kernel))},
               {"num_threads", std::to_string(threads)}};
  const std::vector<Arg>& a = c.args;  // filled with pointers by call_and_check before the call
  call_and_check(
      rng, rec, index, c,
      [&] {
        const MlaSparsePrefillArgs p{.q = a[0].ref, .kv = a[1].ref, .indices = a[2].ref, .topk_length = a[3].ref,
                                     .attn_sink = a[4].ref, .out = a[5].ref, .max_logits = a[6].ref, .lse = a[7].ref,
                                     .sm_scale = scale, .d_v = d_v, .lse_base = lse_base, .kernel = kernel};
        return reference ? reference::mla_sparse_prefill(p, threads) : mla_sparse_prefill(p, nullptr);
      },
      [&](const Symbols& got, std::vector<Violation>* v) {
        if (const int64_t h_q = symbol(got, "h_q"); h_q < 0 || h_q > INT32_MAX) problem_violation("h_q", h_q, v);
        if (const int64_t d = symbol(got, "d_qk", 576); d != 576 && d != 512) problem_violation("d_qk", d, v);
        if (const int64_t topk = symbol(got, "topk"); topk < 1 || topk > INT32_MAX) problem_violation("topk", topk, v);
        if (d_v != 512) problem_violation("d_v", d_v, v);
        if (lse_base != LseBase::kBase2 && lse_base != LseBase::kNatural) {
          problem_violation("lse_base", static_cast<int>(lse_base), v);
        }
        check_scale("sm_scale", scale, v);
      });
}

// Leading dimensions collapse into rows of one stride (fp8_cache.h): stride[i] = stride[i+1] *
// shape[i+1] for every leading dimension of size > 1 above the last two. A tensor without
// elements has no rows to address: exempt.
void check_collapsible(const Arg& arg, std::vector<Violation>* v) {
  const TensorRef& t = arg.ref;
  const int rank = std::clamp(t.rank, 0, kMaxRank);
  if (std::any_of(t.shape, t.shape + rank, [](int64_t n) { return n == 0; })) return;
  for (int i = 0; i + 2 < rank; ++i) {
    const __int128 want = static_cast<__int128>(t.stride[i + 1]) * t.shape[i + 1];
    if (t.shape[i] > 1 && t.stride[i] != want) {
      v->push_back({"stride", arg.spec.name + ".stride[" + std::to_string(i) + "]: leading dimensions not collapsible, accepted"});
    }
  }
}

// quantize (bf16 [..., 576] -> uint8 [..., 656]) or dequantize (the reverse).
void run_fp8_convert(Rng& rng, Recorder& rec, int64_t index, bool quantize, bool reference) {
  const Symbols s{{"L0", rng.size(0, 3)}, {"L1", rng.size(1, 3)}};
  std::vector<Dim> src_dims, dst_dims;
  for (const char* lead : {"L0", "L1"}) {
    if (rng.chance(0.5)) break;
    src_dims.push_back(sym(lead));
    dst_dims.push_back(sym(lead));
  }
  src_dims.push_back(fixed(quantize ? 576 : 656));
  dst_dims.push_back(fixed(quantize ? 656 : 576));
  const std::string name = std::string(quantize ? "" : "de") + "quantize_mla_cache_fp8";
  FuzzCase c{.op = (reference ? "reference::" : "") + name, .host_memory = reference};
  c.args = make_args(rng,
                     {{.name = "src", .dims = src_dims, .dtypes = {quantize ? kBF16 : kUInt8}, .any_leading_rank = true,
                       .fill = quantize ? Fill::kHalf : Fill::kFp8Tokens},
                      {.name = "dst", .dims = dst_dims, .dtypes = {quantize ? kUInt8 : kBF16}, .output = true,
                       .any_leading_rank = true, .fill = Fill::kPoison}},
                     s);
  const std::vector<Arg>& a = c.args;
  call_and_check(
      rng, rec, index, c,
      [&] {
        if (reference) {
          return quantize ? reference::quantize_mla_cache_fp8(a[0].ref, a[1].ref)
                          : reference::dequantize_mla_cache_fp8(a[0].ref, a[1].ref);
        }
        return quantize ? quantize_mla_cache_fp8(a[0].ref, a[1].ref, nullptr)
                        : dequantize_mla_cache_fp8(a[0].ref, a[1].ref, nullptr);
      },
      [&](const Symbols&, std::vector<Violation>* v) {
        check_collapsible(a[0], v);
        check_collapsible(a[1], v);
      });
}

void run_fp8_append(Rng& rng, Recorder& rec, int64_t index, bool reference) {
  Symbols s{{"n", rng.size(0, 4)}, {"blocks", rng.size(0, 3)}, {"page", rng.size(1, 8)}};
  int64_t slots = 0;
  if (__builtin_mul_overflow(s.at("blocks"), s.at("page"), &slots)) slots = INT32_MAX;
  FuzzCase c{.op = reference ? "reference::append_mla_cache_fp8" : "append_mla_cache_fp8", .host_memory = reference};
  c.args = make_args(rng,
                     {{.name = "tokens", .dims = {sym("n"), fixed(576)}, .dtypes = {kBF16}},
                      {.name = "slots", .dims = {sym("n")}, .dtypes = {kInt32}, .fill = Fill::kIndex, .index_below = slots},
                      {.name = "cache", .dims = {sym("blocks"), sym("page"), fixed(1), fixed(656)},
                       .dtypes = {kUInt8, kFP8E4M3, kInt8}, .output = true, .fill = Fill::kFp8Tokens}},
                     s);
  const std::vector<Arg>& a = c.args;
  call_and_check(
      rng, rec, index, c,
      [&] {
        return reference ? reference::append_mla_cache_fp8(a[0].ref, a[1].ref, a[2].ref)
                         : append_mla_cache_fp8(a[0].ref, a[1].ref, a[2].ref, nullptr);
      },
      [&](const Symbols& got, std::vector<Violation>* v) {
        if (symbol(got, "page") < 1) problem_violation("cache.shape[1] (page_size)", symbol(got, "page"), v);
      });
}

// The V4 cache's own layout (fp8_cache.h), beyond the generic contract: [num_blocks, page_size,
// 1, 584] with 1 <= page_size, stride[1] 584, blocks at least page_size * 584 bytes and a
// multiple of 16 apart, the data 16-byte aligned.
void check_v4_cache_layout(const Arg& arg, std::vector<Violation>* v) {
  const TensorRef& t = arg.ref;
  const std::string& n = arg.spec.name;
  if (t.rank != 4) return;  // the generic contract's rank rule reports it
  if (t.shape[1] < 1) problem_violation(n + ".shape[1] (page_size)", t.shape[1], v);
  if (std::any_of(t.shape, t.shape + 4, [](int64_t d) { return d == 0; })) return;
  if (t.stride[1] != 584) v->push_back({"stride", n + ".stride[1] = " + std::to_string(t.stride[1]) + " accepted"});
  if (t.shape[0] > 1 && (t.stride[0] < t.shape[1] * 584 || t.stride[0] % 16 != 0)) {
    v->push_back({"stride", n + ".stride[0] = " + std::to_string(t.stride[0]) + ": blocks overlap or misaligned, accepted"});
  }
  if (reinterpret_cast<std::uintptr_t>(t.data) % 16 != 0) v->push_back({"alignment", n + ": misaligned data accepted"});
}

// The V4 cache tools: quantize (bf16 [blocks, page, (1,) 512] -> a V4 cache), dequantize (the
// reverse), append (tokens [n, 512], slots [n] -> a V4 cache in place).
enum class V4Tool { kQuantize, kDequantize, kAppend };

void run_fp8_v4(Rng& rng, Recorder& rec, int64_t index, V4Tool tool, bool reference) {
  using enum V4Tool;
  Symbols s{{"blocks", rng.size(0, 3)}, {"page", rng.size(1, 8)}, {"n", rng.size(0, 4)}};
  int64_t slots = 0;
  if (__builtin_mul_overflow(s.at("blocks"), s.at("page"), &slots)) slots = INT32_MAX;
  std::vector<Dim> rows_dims = {sym("blocks"), sym("page"), fixed(1), fixed(512)};
  if (rng.chance(0.5)) rows_dims.erase(rows_dims.begin() + 2);  // [blocks, page, 512]
  const TensorSpec rows{.name = tool == kQuantize ? "src" : "dst", .dims = rows_dims, .dtypes = {kBF16},
                        .output = tool == kDequantize, .fill = tool == kQuantize ? Fill::kHalf : Fill::kPoison};
  const TensorSpec cache{.name = tool == kQuantize ? "dst" : tool == kDequantize ? "src" : "cache",
                         .dims = {sym("blocks"), sym("page"), fixed(1), fixed(584)},
                         .dtypes = {kUInt8, kFP8E4M3, kInt8}, .output = tool != kDequantize, .fill = Fill::kFp8Tokens};
  const char* name = tool == kQuantize     ? "quantize_mla_cache_fp8_v4"
                     : tool == kDequantize ? "dequantize_mla_cache_fp8_v4"
                                           : "append_mla_cache_fp8_v4";
  FuzzCase c{.op = std::string(reference ? "reference::" : "") + name, .host_memory = reference};
  if (tool == kQuantize) c.args = make_args(rng, {rows, cache}, s);
  if (tool == kDequantize) c.args = make_args(rng, {cache, rows}, s);
  if (tool == kAppend) {
    c.args = make_args(rng,
                       {{.name = "tokens", .dims = {sym("n"), fixed(512)}, .dtypes = {kBF16}},
                        {.name = "slots", .dims = {sym("n")}, .dtypes = {kInt32}, .fill = Fill::kIndex, .index_below = slots},
                        cache},
                       s);
  }
  const std::vector<Arg>& a = c.args;
  call_and_check(
      rng, rec, index, c,
      [&] {
        switch (tool) {
          case kQuantize:
            return reference ? reference::quantize_mla_cache_fp8_v4(a[0].ref, a[1].ref)
                             : quantize_mla_cache_fp8_v4(a[0].ref, a[1].ref, nullptr);
          case kDequantize:
            return reference ? reference::dequantize_mla_cache_fp8_v4(a[0].ref, a[1].ref)
                             : dequantize_mla_cache_fp8_v4(a[0].ref, a[1].ref, nullptr);
          case kAppend:
            break;
        }
        return reference ? reference::append_mla_cache_fp8_v4(a[0].ref, a[1].ref, a[2].ref)
                         : append_mla_cache_fp8_v4(a[0].ref, a[1].ref, a[2].ref, nullptr);
      },
      [&](const Symbols&, std::vector<Violation>* v) {
        check_v4_cache_layout(a[tool == kQuantize ? 1 : tool == kDequantize ? 0 : 2], v);
      });
}

// make_tensor keeps what it is given, computes row-major strides (a product beyond int64
// saturates at INT64_MAX, negative sizes count as 0: tensor.cpp), and turns lists it cannot
// hold (longer than kMaxRank, or shape and stride lists of different lengths) into tensors
// every validator rejects.
void run_make_tensor(Rng& rng, Recorder& rec, int64_t index) {
  FuzzCase c{.op = "make_tensor"};
  const auto n = static_cast<std::size_t>(rng.uniform(0, 8));
  for (std::size_t i = 0; i < n; ++i) c.list.push_back(rng.chance(0.7) ? rng.uniform(0, 8) : rng.edge_size());
  const bool with_stride = rng.chance(0.5);
  std::vector<int64_t> stride;
  const std::size_t m = rng.chance(0.9) ? n : static_cast<std::size_t>(rng.uniform(0, 8));
  for (std::size_t i = 0; with_stride && i < m; ++i) stride.push_back(rng.chance(0.7) ? rng.uniform(0, 8) : rng.edge_stride());
  void* data = rng.chance(0.8) ? device_stand_in() : nullptr;
  const DType dtype = rng.dtype();
  std::string stride_text = with_stride ? "{" : "(none)";
  for (std::size_t i = 0; i < stride.size(); ++i) stride_text += (i ? ", " : "") + std::to_string(stride[i]);
  c.scalars = {{"data", data ? "stand-in" : "null"},
               {"dtype", std::to_string(static_cast<int>(dtype))},
               {"stride", stride_text + (with_stride ? "}" : "")}};
  if (!rec.begin(index, c)) return;
  const TensorRef t = with_stride ? make_tensor_from(data, dtype, c.list, stride) : make_tensor_from(data, dtype, c.list);
  if (t.data != data || t.dtype != dtype) rec.fail("fields", "data or dtype not kept");
  // Row-major strides as documented, computed in 128 bits and saturated.
  std::vector<int64_t> row_major(n);
  __int128 step = 1;
  for (int d = static_cast<int>(n) - 1; d >= 0; --d) {
    row_major[d] = static_cast<int64_t>(std::min<__int128>(step, INT64_MAX));
    step = std::min<__int128>(step * std::max<int64_t>(c.list[d], 0), INT64_MAX);
  }
  const bool holdable = n <= static_cast<std::size_t>(kMaxRank) && (!with_stride || m == n);
  if (holdable) {
    bool same = t.rank == static_cast<int>(n);
    for (std::size_t d = 0; same && d < n; ++d) {
      same = t.shape[d] == c.list[d] && (with_stride ? t.stride[d] == stride[d] : t.stride[d] == row_major[d]);
    }
    if (!same) rec.fail("fields", "shape or strides differ from the lists given: " + describe(t));
  }
  // Whatever came out, a validator must handle it (the GPU entry never reads the stand-in);
  // a list make_tensor could not hold must be rejected.
  const Status st = quantize_mla_cache_fp8(t, t, nullptr);
  if (!st.is_ok() && st.message().rfind("quantize_mla_cache_fp8: ", 0) != 0) rec.fail("message", st.to_string());
  if (!holdable && reached_device(st)) {
    rec.fail("accepted", "a tensor make_tensor could not represent passed validation: " + describe(t));
  }
  // A saturated stride on a dimension of size > 1 of a tensor with elements spans beyond
  // int64: the check every entry point starts with must reject it (tensor.cpp relies on it).
  bool saturated = false, elements = true;
  for (std::size_t d = 0; holdable && !with_stride && d < n; ++d) {
    saturated |= row_major[d] == INT64_MAX && c.list[d] > 1;
    elements &= c.list[d] != 0;
  }
  if (saturated && elements && detail::check_tensor_wellformed("make_tensor", "t", t).is_ok()) {
    rec.fail("accepted", "a saturated row-major stride passed check_tensor_wellformed: " + describe(t));
  }
  const std::size_t size = dtype_size(dtype);
  const bool valid = static_cast<int>(dtype) >= 0 && static_cast<int>(dtype) <= static_cast<int>(kUInt8);
  if (dtype_name(dtype) == nullptr || (valid ? size == 0 : size != 0)) rec.fail("dtype", "dtype_name / dtype_size");
}

double edge_lse(Rng& rng) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  static const double kValues[] = {std::numeric_limits<double>::quiet_NaN(), kInf, -kInf, 0.0, -0.0, 1e308, -1e308,
                                   745.0, -745.0, 710.0, std::numeric_limits<double>::denorm_min()};
  return rng.chance(0.5) ? static_cast<double>(rng.uniform(-50000, 50000)) / 1000.0 : rng.pick(kValues);
}

// docs/contract.md, Merging states, on finite partial outputs: empty states (LSE +-inf) contribute nothing,
// two empty states give o = 0, lse = +inf, otherwise a convex combination, never NaN.
// merge_states takes raw pointers: real buffers of d values, or now and then a null pointer,
// which (like d < 1) must be an InvalidArgument naming the op, with nothing written.
void run_merge_states(Rng& rng, Recorder& rec, int64_t index) {
  const int64_t d = rng.chance(0.9) ? rng.uniform(0, 8) : rng.uniform(0, 600);
  std::vector<double> o_a(d), o_b(d), o(d);
  for (int64_t i = 0; i < d; ++i) {
    o_a[i] = static_cast<double>(rng.uniform(-1000000, 1000000)) / 1000.0;
    o_b[i] = static_cast<double>(rng.uniform(-1000000, 1000000)) / 1000.0;
  }
  const double lse_a = edge_lse(rng), lse_b = edge_lse(rng);
  const int64_t alias = rng.uniform(0, 2);  // o separate, o = o_a, o = o_b (documented as allowed)
  const int64_t null_arg = rng.chance(0.05) ? rng.uniform(0, 3) : -1;  // o_a, o_b, o, lse
  FuzzCase c{.op = "reference::merge_states"};
  c.scalars = {{"d", std::to_string(d)}, {"lse_a", str(static_cast<float>(lse_a))},
               {"lse_b", str(static_cast<float>(lse_b))}, {"o aliases", alias == 0 ? "none" : alias == 1 ? "o_a" : "o_b"},
               {"null argument", null_arg < 0 ? "none" : std::to_string(null_arg)}};
  if (!rec.begin(index, c)) return;
  const std::vector<double> a = o_a, b = o_b;
  double* out = alias == 0 ? o.data() : alias == 1 ? o_a.data() : o_b.data();
  const std::vector<double> out_before(out, out + d);
  double lse = 0.0;
  const Status st = reference::merge_states(null_arg == 0 ? nullptr : o_a.data(), lse_a, null_arg == 1 ? nullptr : o_b.data(),
                                            lse_b, d, null_arg == 2 ? nullptr : out, null_arg == 3 ? nullptr : &lse);
  const bool valid = d >= 1 && null_arg < 0;
  rec.check_status(st, reference_codes(), st.is_ok(), {});
  if (st.is_ok() != valid) rec.fail("merge", std::string(valid ? "valid call rejected: " : "invalid call accepted: ") + st.to_string());
  if (!st.is_ok()) {
    if (lse != 0.0 || !std::equal(out, out + d, out_before.begin())) rec.fail("merge", "written although rejected");
    return;
  }
  if (std::isnan(lse_a) || std::isnan(lse_b)) return;  // no contract for NaN statistics
  const bool empty_a = std::isinf(lse_a), empty_b = std::isinf(lse_b);
  if (empty_a && empty_b && !(lse == INFINITY)) rec.fail("merge", "two empty states: lse " + str(static_cast<float>(lse)));
  if (empty_a != empty_b && lse != (empty_a ? lse_b : lse_a)) rec.fail("merge", "one empty state: lse changed");
  if (std::isnan(lse)) rec.fail("merge", "lse NaN");
  for (int64_t i = 0; i < d; ++i) {
    const double lo = empty_a && empty_b ? 0.0 : std::min(empty_a ? b[i] : a[i], empty_b ? a[i] : b[i]);
    const double hi = empty_a && empty_b ? 0.0 : std::max(empty_a ? b[i] : a[i], empty_b ? a[i] : b[i]);
    const double tol = 1e-12 * std::max(1.0, std::fabs(hi) + std::fabs(lo));
    if (!(out[i] >= lo - tol && out[i] <= hi + tol)) {
      rec.fail("merge", "o[" + std::to_string(i) + "] = " + std::to_string(out[i]) + " outside [" + std::to_string(lo) + ", " +
                            std::to_string(hi) + "]");
      break;
    }
  }
}

}  // namespace

std::vector<OpDriver> other_drivers() {
  return {
      {"mla_sparse_prefill", [](Rng& r, Recorder& rec, int64_t i) { run_sparse_prefill(r, rec, i, false); }},
      {"reference::mla_sparse_prefill", [](Rng& r, Recorder& rec, int64_t i) { run_sparse_prefill(r, rec, i, true); }},
      {"quantize_mla_cache_fp8", [](Rng& r, Recorder& rec, int64_t i) { run_fp8_convert(r, rec, i, true, false); }},
      {"reference::quantize_mla_cache_fp8", [](Rng& r, Recorder& rec, int64_t i) { run_fp8_convert(r, rec, i, true, true); }},
      {"dequantize_mla_cache_fp8", [](Rng& r, Recorder& rec, int64_t i) { run_fp8_convert(r, rec, i, false, false); }},
      {"reference::dequantize_mla_cache_fp8", [](Rng& r, Recorder& rec, int64_t i) { run_fp8_convert(r, rec, i, false, true); }},
      {"append_mla_cache_fp8", [](Rng& r, Recorder& rec, int64_t i) { run_fp8_append(r, rec, i, false); }},
      {"reference::append_mla_cache_fp8", [](Rng& r, Recorder& rec, int64_t i) { run_fp8_append(r, rec, i, true); }},
      {"quantize_mla_cache_fp8_v4", [](Rng& r, Recorder& rec, int64_t i) { run_fp8_v4(r, rec, i, V4Tool::kQuantize, false); }},
      {"reference::quantize_mla_cache_fp8_v4", [](Rng& r, Recorder& rec, int64_t i) { run_fp8_v4(r, rec, i, V4Tool::kQuantize, true); }},
      {"dequantize_mla_cache_fp8_v4", [](Rng& r, Recorder& rec, int64_t i) { run_fp8_v4(r, rec, i, V4Tool::kDequantize, false); }},
      {"reference::dequantize_mla_cache_fp8_v4", [](Rng& r, Recorder& rec, int64_t i) { run_fp8_v4(r, rec, i, V4Tool::kDequantize, true); }},
      {"append_mla_cache_fp8_v4", [](Rng& r, Recorder& rec, int64_t i) { run_fp8_v4(r, rec, i, V4Tool::kAppend, false); }},
      {"reference::append_mla_cache_fp8_v4", [](Rng& r, Recorder& rec, int64_t i) { run_fp8_v4(r, rec, i, V4Tool::kAppend, true); }},
      {"make_tensor", run_make_tensor},
      {"reference::merge_states", run_merge_states},
  };
}

}  // namespace mlakit::fuzz
