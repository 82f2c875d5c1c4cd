// Fuzz drivers of the attention operations added after the MLA ones: the MHA prefill (forward:
// workspace-size query, GPU entry, reference; backward: reference), the GQA decode
// (workspace-size query, plan, decode, reference) and the GQA cache tools (quantize, dequantize,
// append: GPU entry points and references). GPU entry points get device stand-ins, references
// host buffers of exactly the bytes each tensor claims (validation_fuzz.h).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "mlakit/gqa_cache.h"
#include "mlakit/gqa_decode.h"
#include "mlakit/mha_prefill.h"
#include "validation_fuzz_runner.h"

namespace mlakit::fuzz {
namespace {

using enum DType;

// a * b, or `fallback` when it overflows (edge sizes).
int64_t product_or(int64_t a, int64_t b, int64_t fallback) {
  int64_t r;
  return __builtin_mul_overflow(a, b, &r) ? fallback : r;
}

// Fill::kIndex's bound for values in [0, n] (n possibly an edge size).
int64_t up_to(int64_t n) { return std::clamp<int64_t>(n, 0, INT32_MAX - 1) + 1; }

int random_int(Rng& rng, int lo, int hi) { return rng.chance(0.05) ? rng.edge_int() : static_cast<int>(rng.uniform(lo, hi)); }

MlaKernel random_kernel(Rng& rng) {
  return static_cast<MlaKernel>(rng.chance(0.9) ? static_cast<int>(rng.uniform(-1, 1)) : rng.edge_int());
}

// A head dim of the GQA decode and its cache tools: 64, 128 or 256, now and then an edge size.
int64_t random_gqa_d(Rng& rng) { return rng.chance(0.04) ? rng.edge_size() : rng.pick({int64_t{64}, int64_t{128}, int64_t{256}}); }

std::string yes_no(bool b) { return b ? "true" : "false"; }

// The codes of a query that needs no device (mha_prefill_workspace_size: shapes only).
const std::vector<StatusCode>& query_codes() {
  static const std::vector<StatusCode> codes = {StatusCode::kOk, StatusCode::kInvalidArgument, StatusCode::kUnsupported};
  return codes;
}

// ---------------------------------------------------------------------------------------------
// MHA prefill (include/mlakit/mha_prefill.h; docs/contract.md, MHA prefill)

Symbols mha_symbols(Rng& rng) {
  static constexpr int64_t kHeadDims[][2] = {{64, 64}, {128, 128}, {192, 128}, {256, 256}};
  const auto& dims = rng.pick(kHeadDims);
  Symbols s{{"d_qk", dims[0]}, {"d_v", dims[1]}};
  if (rng.chance(0.05)) {  // an unsupported pair or an edge size
    s[rng.chance(0.5) ? "d_qk" : "d_v"] = rng.chance(0.5) ? rng.pick({int64_t{64}, int64_t{128}, int64_t{192}, int64_t{256},
                                                                        int64_t{512}, int64_t{576}})
                                                          : rng.edge_size();
  }
  s["h_kv"] = rng.uniform(1, 2);
  s["h_q"] = s["h_kv"] * rng.uniform(0, 2);  // 0: the empty problem
  for (const char* name : {"h_kv", "h_q"}) {
    if (rng.chance(0.04)) s[name] = rng.edge_size();
  }
  s["b1"] = rng.size(1, 3);  // b + 1 prefix-sum entries
  // Small totals: the references' work is total_q x total_k per head. The prefix sums hold
  // values in [0, total] (Fill::kIndex; most reference cases get ordered ones, HostInts).
  s["total_q"] = rng.size(0, 3);
  s["total_k"] = rng.size(0, 4);
  return s;
}

TensorSpec rows_spec(const char* name, const char* rows, const char* heads, const char* d) {
  return {.name = name, .dims = {sym(rows), sym(heads), sym(d)}, .dtypes = {kBF16, kFP16}, .same_dtype_as = "q"};
}

TensorSpec prefix_sums_spec(const char* name, const Symbols& s, const char* total) {
  return {.name = name, .dims = {sym("b1")}, .dtypes = {kInt32}, .fill = Fill::kIndex, .index_below = up_to(s.at(total))};
}

// max_seqlen_*: mostly the total (>= every length), sometimes 0, small or an edge value.
int random_max_seqlen(Rng& rng, int64_t total) {
  if (rng.chance(0.85)) return static_cast<int>(std::clamp<int64_t>(total, 0, INT32_MAX));
  return rng.chance(0.5) ? static_cast<int>(rng.uniform(0, 2)) : rng.edge_int();
}

// The int32 data the references read on the host (prefix sums, lengths) bound their work:
// lengths above this would cost a case minutes (an edge-sized total or page with broadcast rows
// makes them valid) and are replaced (HostInts).
constexpr int32_t kMaxLength = 64;

// Replacement contents for int32 vectors a reference reads as data. Fill::kIndex draws every
// entry at random, which almost never makes prefix sums from 0 (nearly every MHA reference call
// would stop at its data check before reading q, k, v), and can make valid lengths of 2^30. In
// the call (after call_and_check mutated the arguments and attached Memory's buffers), `attach`
// points such an argument at a buffer of its own, of exactly the bytes its layout claims,
// holding the values at its stride; Memory's buffer, no longer referenced, stays unchanged, and
// `check_unchanged` is the "input-written" check of the replacement.
class HostInts {
 public:
  // The entries of `arg` when it is a rank-1 int32 tensor of 1 to 4096 entries with a host
  // buffer (the only ones replaced).
  static std::optional<std::vector<int32_t>> read(const Arg& arg) {
    const TensorRef& t = arg.ref;
    int64_t span = 0;  // elements from the first entry to the last
    if (t.data == nullptr || t.rank != 1 || t.dtype != kInt32 || t.shape[0] < 1 || t.shape[0] > 4096 || t.stride[0] < 0 ||
        __builtin_mul_overflow(t.shape[0] - 1, t.stride[0], &span) || span >= Memory::kMaxBytes / 4) {
      return std::nullopt;
    }
    std::vector<int32_t> values(static_cast<std::size_t>(t.shape[0]));
    for (std::size_t i = 0; i < values.size(); ++i) {
      std::memcpy(&values[i], static_cast<const std::byte*>(t.data) + i * t.stride[0] * 4, 4);
    }
    return values;
  }

  // `arg` as `read` accepts it; `values` has one entry per element.
  void attach(Arg& arg, const std::vector<int32_t>& values) {
    TensorRef& t = arg.ref;
    const auto bytes = static_cast<std::size_t>((t.shape[0] - 1) * t.stride[0] + 1) * 4;
    Buffer b{.name = arg.spec.name, .storage = std::make_unique<std::byte[]>(bytes + arg.misalign_bytes)};
    b.data = b.storage.get() + arg.misalign_bytes;
    std::memset(b.data, 0x7f, bytes);  // between the entries (a stride > 1): never read
    for (std::size_t i = 0; i < values.size(); ++i) std::memcpy(b.data + i * t.stride[0] * 4, &values[i], 4);
    b.before.assign(b.data, b.data + bytes);
    t.data = b.data;
    buffers_.push_back(std::move(b));
  }

  void check_unchanged(std::vector<Violation>* v) const {
    for (const Buffer& b : buffers_) {
      if (std::memcmp(b.data, b.before.data(), b.before.size()) != 0) v->push_back({"input-written", b.name + ": input changed"});
    }
  }

 private:
  struct Buffer {
    std::string name{};
    std::unique_ptr<std::byte[]> storage{};
    std::byte* data = nullptr;
    std::vector<std::byte> before{};
  };
  std::vector<Buffer> buffers_;
};

// The prefix sums `cu` of a reference call over the rows of `rows` (q or k): with `ordered`,
// 0 = cu[0] <= ... <= cu[b] <= min(total, kMaxLength); else the random fill, unless an entry
// in (kMaxLength, total] could make a costly valid sequence (then ordered ones as well).
void prepare_prefix_sums(Rng& rng, HostInts& own, Arg& cu, const TensorRef& rows, bool ordered) {
  const std::optional<std::vector<int32_t>> entries = HostInts::read(cu);
  if (!entries) return;
  const int64_t total = rows.rank >= 1 ? std::clamp<int64_t>(rows.shape[0], 0, INT32_MAX) : 0;
  if (!ordered && std::none_of(entries->begin(), entries->end(), [&](int32_t x) { return x > kMaxLength && x <= total; })) {
    return;
  }
  const int64_t top = std::min<int64_t>(total, kMaxLength);
  std::vector<int32_t> sums(entries->size());
  for (int32_t& x : sums) x = static_cast<int32_t>(rng.uniform(0, top));
  std::sort(sums.begin(), sums.end());
  sums[0] = 0;
  if (rng.chance(0.5)) sums.back() = static_cast<int32_t>(top);
  own.attach(cu, sums);
}

// The forward's and the backward's problem rules: h_q a multiple of h_kv >= 1, a supported
// (d_qk, d_v) pair, b + 1 >= 1 prefix-sum entries, max_seqlen_* >= 0, a finite scale. Sizes
// the kernels index with int must fit it ("dims-narrowed").
void mha_problem_violations(const Symbols& got, int max_seqlen_q, int max_seqlen_k, std::optional<float> scale,
                            std::vector<Violation>* v) {
  const int64_t h_q = symbol(got, "h_q", 0), h_kv = symbol(got, "h_kv");
  if (h_kv < 1 || h_q % h_kv != 0) problem_violation("h_kv (a divisor of h_q = " + std::to_string(h_q) + ")", h_kv, v);
  if (h_q > INT32_MAX) problem_violation("h_q", h_q, v);
  if (h_kv > INT32_MAX) problem_violation("h_kv", h_kv, v);
  const int64_t d_qk = symbol(got, "d_qk", 64), d_v = symbol(got, "d_v", 64);
  const bool pair = (d_qk == 64 && d_v == 64) || (d_qk == 128 && d_v == 128) || (d_qk == 192 && d_v == 128) ||
                    (d_qk == 256 && d_v == 256);
  if (!pair) v->push_back({"problem", "(d_qk, d_v) = (" + std::to_string(d_qk) + ", " + std::to_string(d_v) + ") accepted"});
  if (const int64_t b1 = symbol(got, "b1"); b1 < 1) problem_violation("cu_seqlens_q.shape[0] (b + 1)", b1, v);
  if (max_seqlen_q < 0) problem_violation("max_seqlen_q", max_seqlen_q, v);
  if (max_seqlen_k < 0) problem_violation("max_seqlen_k", max_seqlen_k, v);
  check_scale("softmax_scale", scale, v);
}

// The GPU entry's layout rule: the rows of a tensor with elements start at multiples of
// `bytes` (data pointer, and the token and head strides of dimensions of size > 1).
void check_rows_aligned(const Arg& arg, int64_t bytes, std::vector<Violation>* v) {
  const TensorRef& t = arg.ref;
  const auto elem = static_cast<int64_t>(dtype_size(t.dtype));
  if (t.rank != 3 || elem == 0 || std::any_of(t.shape, t.shape + 3, [](int64_t n) { return n == 0; })) return;
  bool aligned = reinterpret_cast<std::uintptr_t>(t.data) % bytes == 0;
  for (int i = 0; i < 2; ++i) aligned &= t.shape[i] <= 1 || static_cast<__int128>(t.stride[i]) * elem % bytes == 0;
  if (!aligned) v->push_back({"stride", arg.spec.name + ": rows not " + std::to_string(bytes) + "-byte aligned, accepted"});
}

enum class Entry { kQuery, kGpu, kReference };

// mha_prefill_workspace_size (kQuery), mha_prefill (kGpu) or reference::mha_prefill.
void run_mha_prefill(Rng& rng, Recorder& rec, int64_t index, Entry entry) {
  const bool reference = entry == Entry::kReference;
  const Symbols s = mha_symbols(rng);
  FuzzCase c{.op = entry == Entry::kQuery ? "mha_prefill_workspace_size" : reference ? "reference::mha_prefill" : "mha_prefill",
             .host_memory = reference};
  c.args = make_args(rng,
                     {{.name = "q", .dims = {sym("total_q"), sym("h_q"), sym("d_qk")}, .dtypes = {kBF16, kFP16}},
                      rows_spec("k", "total_k", "h_kv", "d_qk"),
                      rows_spec("v", "total_k", "h_kv", "d_v"),
                      prefix_sums_spec("cu_seqlens_q", s, "total_q"),
                      prefix_sums_spec("cu_seqlens_k", s, "total_k"),
                      {.name = "out", .dims = {sym("total_q"), sym("h_q"), sym("d_v")}, .dtypes = {kBF16, kFP16},
                       .same_dtype_as = "q", .or_float32 = reference, .output = true, .fill = Fill::kPoison},
                      {.name = "lse", .dims = {sym("h_q"), sym("total_q")}, .dtypes = {kFP32}, .optional = true,
                       .output = true, .fill = Fill::kPoison}},
                     s);
  const int max_q = random_max_seqlen(rng, s.at("total_q")), max_k = random_max_seqlen(rng, s.at("total_k"));
  const bool causal = rng.chance(0.5);
  const std::optional<float> scale = random_scale(rng);
  const MlaKernel kernel = random_kernel(rng);
  const int threads = reference_threads(rng);
  void* workspace = rng.chance(0.7) ? device_stand_in() : nullptr;
  const auto workspace_bytes = static_cast<std::size_t>(rng.chance(0.9) ? rng.uniform(0, 1 << 20) : rng.edge_size());
  const bool null_out = entry == Entry::kQuery && rng.chance(0.05);
  c.scalars = {{"max_seqlen_q", std::to_string(max_q)}, {"max_seqlen_k", std::to_string(max_k)},
               {"causal", yes_no(causal)},               {"softmax_scale", str(scale)},
               {"kernel", std::to_string(static_cast<int>(kernel))}};
  if (reference) c.scalars.push_back({"num_threads", std::to_string(threads)});
  if (entry == Entry::kGpu) {
    c.scalars.push_back({"workspace, bytes", (workspace ? "stand-in, " : "null, ") + std::to_string(workspace_bytes)});
  }
  if (entry == Entry::kQuery) c.scalars.push_back({"bytes pointer", null_out ? "null" : "given"});
  const std::vector<Arg>& t = c.args;  // pointed at memory before the call
  auto args = [&] {
    return MhaPrefillArgs{.q = t[0].ref, .k = t[1].ref, .v = t[2].ref, .cu_seqlens_q = t[3].ref, .cu_seqlens_k = t[4].ref,
                          .max_seqlen_q = max_q, .max_seqlen_k = max_k, .causal = causal, .softmax_scale = scale,
                          .out = t[5].ref, .lse = t[6].ref, .kernel = kernel};
  };
  auto problem = [&](const Symbols& got, std::vector<Violation>* v) {
    mha_problem_violations(got, max_q, max_k, scale, v);
    if (entry != Entry::kGpu) return;
    // docs/contract.md, MHA prefill: rows 4-byte aligned; kSm90 needs q, k, v rows 16-byte aligned.
    for (int i : {0, 1, 2, 5}) check_rows_aligned(t[i], 4, v);
    if (kernel == MlaKernel::kSm90) {
      for (int i : {0, 1, 2}) check_rows_aligned(t[i], 16, v);
    }
  };
  if (entry != Entry::kQuery) {
    const bool ordered = reference && rng.chance(0.8);
    HostInts own;
    call_and_check(
        rng, rec, index, c,
        [&] {
          if (!reference) return mha_prefill(args(), workspace, workspace_bytes, nullptr);
          prepare_prefix_sums(rng, own, c.args[3], t[0].ref, ordered);
          prepare_prefix_sums(rng, own, c.args[4], t[1].ref, ordered);
          return reference::mha_prefill(args(), threads);
        },
        [&](const Symbols& got, std::vector<Violation>* v) {
          problem(got, v);
          own.check_unchanged(v);
        });
    return;
  }
  // The query reads no memory and needs no device: Ok is its answer to valid arguments.
  mutate_args(rng, c.args);
  Memory::attach_device_stand_in(c.args);
  if (!rec.begin(index, c)) return;
  std::size_t bytes = 1;
  const Status st = mha_prefill_workspace_size(args(), null_out ? nullptr : &bytes);
  std::vector<Violation> v;
  if (st.is_ok()) {
    Symbols got;
    v = contract_violations(c.args, &got);
    problem(got, &v);
    if (null_out) v.push_back({"null", "bytes: null accepted"});
  }
  rec.check_status(st, query_codes(), st.is_ok(), v);
}

void run_mha_prefill_backward(Rng& rng, Recorder& rec, int64_t index) {
  const Symbols s = mha_symbols(rng);
  FuzzCase c{.op = "reference::mha_prefill_backward", .host_memory = true};
  auto gradient = [](const char* name, const char* rows, const char* heads, const char* d) {
    TensorSpec g = rows_spec(name, rows, heads, d);
    g.or_float32 = true;
    g.output = true;
    g.fill = Fill::kPoison;
    return g;
  };
  TensorSpec out = rows_spec("out", "total_q", "h_q", "d_v");
  out.or_float32 = true;  // the reference forward's unrounded out
  c.args = make_args(rng,
                     {{.name = "q", .dims = {sym("total_q"), sym("h_q"), sym("d_qk")}, .dtypes = {kBF16, kFP16}},
                      rows_spec("k", "total_k", "h_kv", "d_qk"),
                      rows_spec("v", "total_k", "h_kv", "d_v"),
                      rows_spec("dout", "total_q", "h_q", "d_v"),
                      out,
                      {.name = "lse", .dims = {sym("h_q"), sym("total_q")}, .dtypes = {kFP32}, .fill = Fill::kFloat},
                      prefix_sums_spec("cu_seqlens_q", s, "total_q"),
                      prefix_sums_spec("cu_seqlens_k", s, "total_k"),
                      gradient("dq", "total_q", "h_q", "d_qk"),
                      gradient("dk", "total_k", "h_kv", "d_qk"),
                      gradient("dv", "total_k", "h_kv", "d_v")},
                     s);
  const int max_q = random_max_seqlen(rng, s.at("total_q")), max_k = random_max_seqlen(rng, s.at("total_k"));
  const bool causal = rng.chance(0.5), deterministic = rng.chance(0.5);
  const std::optional<float> scale = random_scale(rng);
  const MlaKernel kernel = random_kernel(rng);
  const int threads = reference_threads(rng);
  c.scalars = {{"max_seqlen_q", std::to_string(max_q)}, {"max_seqlen_k", std::to_string(max_k)},
               {"causal", yes_no(causal)},               {"softmax_scale", str(scale)},
               {"deterministic", yes_no(deterministic)}, {"kernel", std::to_string(static_cast<int>(kernel))},
               {"num_threads", std::to_string(threads)}};
  const bool ordered = rng.chance(0.8);
  HostInts own;
  const std::vector<Arg>& t = c.args;
  call_and_check(
      rng, rec, index, c,
      [&] {
        prepare_prefix_sums(rng, own, c.args[6], t[0].ref, ordered);
        prepare_prefix_sums(rng, own, c.args[7], t[1].ref, ordered);
        const MhaPrefillBackwardArgs a{.dout = t[3].ref, .q = t[0].ref, .k = t[1].ref, .v = t[2].ref, .out = t[4].ref,
                                       .lse = t[5].ref, .cu_seqlens_q = t[6].ref, .cu_seqlens_k = t[7].ref,
                                       .max_seqlen_q = max_q, .max_seqlen_k = max_k, .causal = causal,
                                       .softmax_scale = scale, .deterministic = deterministic, .dq = t[8].ref,
                                       .dk = t[9].ref, .dv = t[10].ref, .kernel = kernel};
        return reference::mha_prefill_backward(a, threads);
      },
      [&](const Symbols& got, std::vector<Violation>* v) {
        mha_problem_violations(got, max_q, max_k, scale, v);
        own.check_unchanged(v);
      });
}

// ---------------------------------------------------------------------------------------------
// GQA paged caches (include/mlakit/gqa_decode.h, GqaPagedCache): shared by the decode and the tools

// How a case's cache stores its values: the activations' 16-bit dtype (no scales), int8 with
// per-(token, head) scales, fp8 with per-(token, head) scales, or fp8 with one scale.
enum class CacheFormat { kDense, kInt8, kFp8PerToken, kFp8PerTensor };

CacheFormat random_format(Rng& rng, bool dense_allowed) {
  return static_cast<CacheFormat>(rng.uniform(dense_allowed ? 0 : 1, 3));
}

bool is_16bit(DType d) { return d == kBF16 || d == kFP16; }

// A cache's values: generated in `format`'s dtype (16-bit: `dense_of`'s), any of them allowed
// by the contract check once the arguments exist (widen_cache_dtypes).
TensorSpec cache_values_spec(const char* name, const std::vector<Dim>& dims, CacheFormat format, const char* dense_of,
                             bool output) {
  TensorSpec t{.name = name, .dims = dims, .output = output, .fill = Fill::kFp8Tokens};
  switch (format) {
    case CacheFormat::kDense:
      t.dtypes = {kBF16, kFP16};
      t.same_dtype_as = dense_of;
      t.fill = Fill::kHalf;
      break;
    case CacheFormat::kInt8: t.dtypes = {kInt8}; break;
    default: t.dtypes = {kFP8E4M3}; break;
  }
  return t;
}

// After make_args: the contract allows a cache of the activations' dtype, int8 or fp8 (the
// pairing rules are checked by check_cache_dtype and check_cache_scales).
void widen_cache_dtypes(Arg& values) {
  values.spec.dtypes = {kBF16, kFP16, kInt8, kFP8E4M3};
  values.spec.same_dtype_as.clear();
}

// A cache's scale: [blocks, page, h_kv] per token, written when the cache is (`written`), or [1]
// per tensor, read; a 16-bit cache takes none (given half of the time, which must be refused).
TensorSpec cache_scale_spec(const char* name, CacheFormat format, bool written) {
  const bool per_tensor = format == CacheFormat::kFp8PerTensor;
  return {.name = name,
          .dims = per_tensor ? std::vector<Dim>{fixed(1)} : std::vector<Dim>{sym("blocks"), sym("page"), sym("h_kv")},
          .dtypes = {kFP32},
          .optional = format == CacheFormat::kDense,
          .output = written && !per_tensor,
          .fill = Fill::kFloat};
}

// A 16-bit cache holds the activations' dtype.
void check_cache_dtype(const Arg& values, DType dense, std::vector<Violation>* v) {
  if (is_16bit(values.ref.dtype) && values.ref.dtype != dense) {
    v->push_back({"dtype", values.spec.name + ".dtype " + dtype_name(values.ref.dtype) + " accepted with activations of " +
                               dtype_name(dense)});
  }
}

// The scales of a cache of `cache_dtype` (GqaPagedCache): none for a 16-bit cache; else float32
// [num_blocks, page_size, h_kv] per (token, kv head), or [1] per tensor for fp8 only, k's and
// v's alike. The spec fixed one layout when the case was made and a mutation may turn a scale
// into the other, equally valid one, so the generic check of the scales is replaced by a check
// against the layout each accepted scale has.
void check_cache_scales(const std::vector<Arg>& args, std::initializer_list<std::size_t> scales, DType cache_dtype,
                        bool written, const Symbols& got, std::vector<Violation>* v) {
  const bool quantized = cache_dtype == kInt8 || cache_dtype == kFP8E4M3;
  int layout_rank = 0;
  for (std::size_t i : scales) {
    const Arg& a = args[i];
    const std::string& name = a.spec.name;
    std::erase_if(*v, [&](const Violation& x) { return x.detail.rfind(name + ".", 0) == 0 || x.detail.rfind(name + ":", 0) == 0; });
    if (a.ref.empty()) {
      if (quantized) v->push_back({"null", name + ": none accepted for a " + dtype_name(cache_dtype) + " cache"});
      continue;
    }
    if (!quantized) {
      v->push_back({"dtype", name + ": a scale accepted for a " + std::string(dtype_name(cache_dtype)) + " cache"});
      continue;
    }
    const bool per_tensor = a.ref.rank == 1;
    if (per_tensor && cache_dtype != kFP8E4M3) v->push_back({"rank", name + ": a per-tensor scale accepted for int8"});
    if (layout_rank == 0) {
      layout_rank = a.ref.rank;
    } else if (a.ref.rank != layout_rank) {
      v->push_back({"rank", name + ": rank " + std::to_string(a.ref.rank) + " accepted, the other scale's is " +
                                std::to_string(layout_rank)});
    }
    Arg as = a;
    as.spec.dims = per_tensor ? std::vector<Dim>{fixed(1)} : std::vector<Dim>{sym("blocks"), sym("page"), sym("h_kv")};
    as.spec.optional = false;
    as.spec.output = written && !per_tensor;
    Symbols s = got;
    for (const Violation& x : contract_violations({as}, &s)) v->push_back(x);
  }
}

// docs/contract.md, GQA decode: style kNone / kNeox / kGptj, theta finite and > 0, rotary_dim 0
// (the head dim) or even in [2, d].
RotaryEmbedding random_rope(Rng& rng) {
  RotaryEmbedding r;
  r.style = static_cast<RopeStyle>(rng.chance(0.9) ? static_cast<int>(rng.uniform(0, 2)) : rng.edge_int());
  if (rng.chance(0.15)) r.theta = rng.chance(0.5) ? rng.pick({0.0, -1.0, 1.5, 1e300}) : rng.edge_float();
  if (rng.chance(0.3)) r.rotary_dim = rng.chance(0.7) ? static_cast<int>(2 * rng.uniform(1, 64)) : rng.edge_int();
  return r;
}

std::string rope_text(const RotaryEmbedding& r) {
  return "{style " + std::to_string(static_cast<int>(r.style)) + ", theta " + str(static_cast<float>(r.theta)) +
         ", rotary_dim " + std::to_string(r.rotary_dim) + "}";
}

void rope_violations(const RotaryEmbedding& r, int64_t d, std::vector<Violation>* v) {
  if (const int style = static_cast<int>(r.style); style < 0 || style > 2) problem_violation("rope.style", style, v);
  if (!(std::isfinite(r.theta) && r.theta > 0)) v->push_back({"problem", "rope.theta = " + std::to_string(r.theta) + " accepted"});
  if (r.rotary_dim != 0 && (r.rotary_dim < 2 || r.rotary_dim > d || r.rotary_dim % 2 != 0)) {
    problem_violation("rope.rotary_dim (d = " + std::to_string(d) + ")", r.rotary_dim, v);
  }
}

void head_dim_violation(const Symbols& got, std::vector<Violation>* v) {
  if (const int64_t d = symbol(got, "d", 64); d != 64 && d != 128 && d != 256) problem_violation("d", d, v);
}

void page_violation(const Symbols& got, const char* cache, std::vector<Violation>* v) {
  if (symbol(got, "page") < 1) problem_violation(std::string(cache) + ".shape[1] (page_size)", symbol(got, "page"), v);
}

// finished: all zero (no entry skipped) or random bytes (nearly every entry skipped).
TensorSpec finished_spec(Rng& rng) {
  return {.name = "finished", .dims = {sym("b")}, .dtypes = {kUInt8}, .optional = true,
          .fill = rng.chance(0.5) ? Fill::kFp8Tokens : Fill::kIndex, .index_below = 1};
}

// ---------------------------------------------------------------------------------------------
// GQA decode (include/mlakit/gqa_decode.h; docs/contract.md, GQA decode)

// The problem rules of the decode and its plan: b >= 0, 0 <= s_q <= 8 (0 and b = 0 are the
// empty problem), h_kv >= 1, h_q a non-negative multiple of h_kv, d 64 / 128 / 256.
void gqa_problem_violations(int64_t b, int64_t s_q, int64_t h_q, int64_t h_kv, int64_t d, std::vector<Violation>* v) {
  if (b < 0) problem_violation("b", b, v);
  if (s_q < 0 || s_q > 8) problem_violation("s_q", s_q, v);
  if (h_kv < 1) problem_violation("h_kv", h_kv, v);
  if (h_q < 0 || (h_kv >= 1 && h_q % h_kv != 0)) problem_violation("h_q (a multiple of h_kv " + std::to_string(h_kv) + ")", h_q, v);
  if (h_q > INT32_MAX) problem_violation("h_q", h_q, v);
  if (d != 64 && d != 128 && d != 256) problem_violation("d", d, v);
}

Symbols gqa_decode_symbols(Rng& rng) {
  Symbols s;
  s["h_kv"] = rng.uniform(1, 2);
  s["h_q"] = s["h_kv"] * rng.uniform(0, 3);
  for (const char* name : {"h_kv", "h_q"}) {
    if (rng.chance(0.04)) s[name] = rng.edge_size();
  }
  s["b"] = rng.size(0, 2);
  s["s_q"] = rng.chance(0.05) ? rng.uniform(9, 12) : rng.size(0, 3);
  s["d"] = random_gqa_d(rng);
  s["blocks"] = rng.size(0, 4);
  s["page"] = rng.size(1, 8);
  s["width"] = rng.size(0, 3);
  return s;
}

// A plan for the GPU decode: empty, or plausible fields (never a real workspace: the stand-in is
// host memory, which a device build must reject).
GqaDecodePlan random_gqa_plan(Rng& rng, const Symbols& s, bool causal, int window) {
  GqaDecodePlan p;
  if (rng.chance(0.3)) return p;
  p.problem = GqaDecodeProblem{.b = symbol(s, "b"), .s_q = static_cast<int>(symbol(s, "s_q")),
                               .h_q = static_cast<int>(symbol(s, "h_q")), .h_kv = static_cast<int>(symbol(s, "h_kv")),
                               .d = static_cast<int>(symbol(s, "d")), .causal = causal, .window = window};
  p.device = rng.chance(0.9) ? 0 : rng.edge_int();
  p.num_parts = random_int(rng, 1, 8);
  p.workspace = rng.chance(0.9) ? device_stand_in() : nullptr;
  p.workspace_bytes = static_cast<std::size_t>(rng.uniform(0, 1 << 20));
  return p;
}

std::string gqa_plan_text(const GqaDecodePlan& p) {
  return p.workspace == nullptr ? "{} (empty)"
                                : "{problem b=" + std::to_string(p.problem.b) + " s_q=" + std::to_string(p.problem.s_q) +
                                      " h_q=" + std::to_string(p.problem.h_q) + ", num_parts=" +
                                      std::to_string(p.num_parts) + ", device=" + std::to_string(p.device) + "}";
}

// The reference decode attends over up to L keys per row: a length in (kMaxLength, width *
// page_size] is valid and may be 2^30 (an edge-sized page of a broadcast cache), so such
// lengths are replaced by small ones; lengths beyond the table's reach stay (an error).
void bound_lengths(Rng& rng, HostInts& own, Arg& cache_seqlens, const TensorRef& block_table, const TensorRef& cache) {
  std::optional<std::vector<int32_t>> lengths = HostInts::read(cache_seqlens);
  if (!lengths) return;
  int64_t capacity = INT64_MAX;
  if (block_table.rank == 2 && cache.rank == 4) capacity = product_or(block_table.shape[1], cache.shape[1], INT64_MAX);
  bool replaced = false;
  for (int32_t& length : *lengths) {
    if (length > kMaxLength && length <= capacity) {
      length = static_cast<int32_t>(rng.uniform(0, kMaxLength));
      replaced = true;
    }
  }
  if (replaced) own.attach(cache_seqlens, *lengths);
}

// Argument positions of the decode's case.
enum GqaArg : std::size_t { kQ, kKValues, kKScale, kVValues, kVScale, kBlockTable, kSeqlens, kKNew, kVNew, kAlibi,
                            kFinished, kOut, kLse };

void run_gqa_decode(Rng& rng, Recorder& rec, int64_t index, bool reference) {
  const Symbols s = gqa_decode_symbols(rng);
  const CacheFormat format = random_format(rng, true);
  bool append = rng.chance(0.5);
  // Lengths mostly within the block table's reach (width * page), some beyond it.
  const int64_t reach = std::min<int64_t>(product_or(s.at("width"), s.at("page"), INT32_MAX), INT32_MAX - 1);
  const std::vector<Dim> cache_dims = {sym("blocks"), sym("page"), sym("h_kv"), sym("d")};
  const std::vector<Dim> new_dims = {sym("b"), sym("s_q"), sym("h_kv"), sym("d")};
  FuzzCase c{.op = reference ? "reference::gqa_decode" : "gqa_decode", .host_memory = reference};
  TensorSpec v_values = cache_values_spec("v_cache.values", cache_dims, format, "q", append);
  v_values.same_dtype_as = "k_cache.values";
  c.args = make_args(
      rng,
      {{.name = "q", .dims = {sym("b"), sym("s_q"), sym("h_q"), sym("d")}, .dtypes = {kBF16, kFP16}},
       cache_values_spec("k_cache.values", cache_dims, format, "q", append),
       cache_scale_spec("k_cache.scale", format, append),
       v_values,
       cache_scale_spec("v_cache.scale", format, append),
       {.name = "block_table", .dims = {sym("b"), sym("width")}, .dtypes = {kInt32}, .fill = Fill::kIndex,
        .index_below = s.at("blocks")},
       {.name = "cache_seqlens", .dims = {sym("b")}, .dtypes = {kInt32}, .fill = Fill::kIndex, .index_below = reach + 1},
       {.name = "k_new", .dims = new_dims, .dtypes = {kBF16, kFP16}, .same_dtype_as = "q", .optional = !append},
       {.name = "v_new", .dims = new_dims, .dtypes = {kBF16, kFP16}, .same_dtype_as = "q", .optional = !append},
       {.name = "alibi_slopes", .dims = {sym("h_q")}, .dtypes = {kFP32}, .optional = true, .fill = Fill::kFloat},
       finished_spec(rng),
       {.name = "out", .dims = {sym("b"), sym("s_q"), sym("h_q"), sym("d")}, .dtypes = {kBF16, kFP16},
        .same_dtype_as = "q", .or_float32 = reference, .output = true, .fill = Fill::kPoison},
       {.name = "lse", .dims = {sym("b"), sym("h_q"), sym("s_q")}, .dtypes = {kFP32}, .optional = true, .output = true,
        .fill = Fill::kPoison}},
      s);
  if (!append && rng.chance(0.8)) c.args[kKNew].ref = c.args[kVNew].ref = TensorRef{};  // mostly both or neither
  // With k_new and v_new the caches and their per-token scales are written (outputs).
  append = !c.args[kKNew].ref.empty() && !c.args[kVNew].ref.empty();
  for (std::size_t i : {kKValues, kVValues}) c.args[i].spec.output = append;
  for (std::size_t i : {kKScale, kVScale}) c.args[i].spec.output = append && format != CacheFormat::kFp8PerTensor;
  widen_cache_dtypes(c.args[kKValues]);
  for (std::size_t i : {kKNew, kVNew}) c.args[i].spec.optional = true;  // required only with each other
  const RotaryEmbedding rope = random_rope(rng);
  const std::optional<float> scale = random_scale(rng);
  const bool causal = rng.chance(0.5);
  const int window = rng.chance(0.7) ? 0 : random_int(rng, 1, 16);
  const float softcap = rng.chance(0.7) ? 0.f : rng.chance(0.7) ? static_cast<float>(rng.uniform(1, 50)) : rng.edge_float();
  const int threads = reference_threads(rng);
  const GqaDecodePlan plan = random_gqa_plan(rng, s, causal, window);
  c.scalars = {{"rope", rope_text(rope)},  {"softmax_scale", str(scale)}, {"causal", yes_no(causal)},
               {"window", std::to_string(window)}, {"softcap", str(softcap)}};
  c.scalars.push_back(reference ? std::pair{std::string("num_threads"), std::to_string(threads)}
                                : std::pair{std::string("plan"), gqa_plan_text(plan)});
  HostInts own;
  const std::vector<Arg>& t = c.args;
  call_and_check(
      rng, rec, index, c,
      [&] {
        if (reference) bound_lengths(rng, own, c.args[kSeqlens], t[kBlockTable].ref, t[kKValues].ref);
        const GqaDecodeArgs a{.q = t[kQ].ref, .k_cache = {t[kKValues].ref, t[kKScale].ref},
                              .v_cache = {t[kVValues].ref, t[kVScale].ref}, .block_table = t[kBlockTable].ref,
                              .cache_seqlens = t[kSeqlens].ref, .k_new = t[kKNew].ref, .v_new = t[kVNew].ref,
                              .rope = rope, .alibi_slopes = t[kAlibi].ref, .finished = t[kFinished].ref,
                              .out = t[kOut].ref, .lse = t[kLse].ref, .softmax_scale = scale, .causal = causal,
                              .window = window, .softcap = softcap};
        return reference ? reference::gqa_decode(a, threads) : gqa_decode(a, plan, nullptr);
      },
      [&](const Symbols& got, std::vector<Violation>* v) {
        gqa_problem_violations(symbol(got, "b"), symbol(got, "s_q"), symbol(got, "h_q"), symbol(got, "h_kv"),
                               symbol(got, "d", 64), v);
        page_violation(got, "k_cache.values", v);
        // A mutation may have left out k_new and v_new: then nothing is written, and the caches
        // are inputs, which may be broadcast views.
        const bool written = !t[kKNew].ref.empty() && !t[kVNew].ref.empty();
        if (!written) {
          std::erase_if(*v, [](const Violation& x) {
            return x.kind == "overlap" && (x.detail.rfind("k_cache.", 0) == 0 || x.detail.rfind("v_cache.", 0) == 0);
          });
        }
        check_cache_dtype(t[kKValues], t[kQ].ref.dtype, v);
        check_cache_scales(t, {kKScale, kVScale}, t[kKValues].ref.dtype, written, got, v);
        rope_violations(rope, symbol(got, "d", 64), v);
        if (t[kKNew].ref.empty() != t[kVNew].ref.empty()) v->push_back({"null", "k_new / v_new: one without the other accepted"});
        if (window < 0) problem_violation("window", window, v);
        if (!(std::isfinite(softcap) && softcap >= 0)) v->push_back({"problem", "softcap = " + str(softcap) + " accepted"});
        check_scale("softmax_scale", scale, v);
        own.check_unchanged(v);
      });
}

GqaDecodeProblem random_gqa_problem(Rng& rng) {
  const int h_kv = random_int(rng, 1, 8);
  const int h_q = h_kv >= 1 && h_kv <= 8 && rng.chance(0.95) ? h_kv * static_cast<int>(rng.uniform(0, 4)) : rng.edge_int();
  return GqaDecodeProblem{.b = rng.size(0, 64), .s_q = random_int(rng, 0, 8), .h_q = h_q, .h_kv = h_kv,
                          .d = rng.chance(0.95) ? static_cast<int>(rng.pick({64, 128, 256})) : rng.edge_int(),
                          .causal = rng.chance(0.5), .window = rng.chance(0.7) ? 0 : random_int(rng, 1, 4096)};
}

// gqa_decode_workspace_size, or with `plan` gqa_decode_plan (cache_seqlens, workspace, plan).
void run_gqa_problem(Rng& rng, Recorder& rec, int64_t index, bool plan) {
  const GqaDecodeProblem p = random_gqa_problem(rng);
  FuzzCase c{.op = plan ? "gqa_decode_plan" : "gqa_decode_workspace_size", .problem = {{"b", p.b}, {"s_q", p.s_q}}};
  c.scalars = {{"problem", "{.b = " + std::to_string(p.b) + ", .s_q = " + std::to_string(p.s_q) + ", .h_q = " +
                               std::to_string(p.h_q) + ", .h_kv = " + std::to_string(p.h_kv) + ", .d = " +
                               std::to_string(p.d) + ", .causal = " + yes_no(p.causal) + ", .window = " +
                               std::to_string(p.window) + "}"}};
  if (plan) {
    const Symbols s{{"b", p.b}};
    c.args = make_args(rng, {{.name = "cache_seqlens", .dims = {sym("b")}, .dtypes = {kInt32}}}, s);
    mutate_args(rng, c.args);
    Memory::attach_device_stand_in(c.args);
  }
  void* workspace = rng.chance(0.9) ? device_stand_in(rng.chance(0.9) ? 0 : rng.pick({1, 16, 128})) : nullptr;
  const auto bytes = static_cast<std::size_t>(rng.chance(0.9) ? rng.uniform(0, 1 << 24) : rng.edge_size());
  const bool null_out = rng.chance(0.05);
  c.scalars.push_back({"output pointer", null_out ? "null" : "given"});
  if (plan) c.scalars.push_back({"workspace, bytes", (workspace ? "stand-in, " : "null, ") + std::to_string(bytes)});
  if (!rec.begin(index, c)) return;
  std::size_t size = 0;
  GqaDecodePlan out;
  const Status st = plan ? gqa_decode_plan(p, c.args[0].ref, workspace, bytes, nullptr, null_out ? nullptr : &out)
                         : gqa_decode_workspace_size(p, null_out ? nullptr : &size);
  std::vector<Violation> v;
  if (reached_device(st)) {
    gqa_problem_violations(p.b, p.s_q, p.h_q, p.h_kv, p.d, &v);
    if (p.window < 0) problem_violation("window", p.window, &v);
    if (null_out) v.push_back({"null", "output pointer: null accepted"});
    if (st.is_ok() && plan) {
      Symbols got{{"b", p.b}};
      for (const Violation& x : contract_violations(c.args, &got)) v.push_back(x);
    }
  }
  rec.check_status(st, gpu_codes(), reached_device(st), v);
}

// ---------------------------------------------------------------------------------------------
// GQA cache tools (include/mlakit/gqa_cache.h)

Symbols gqa_cache_symbols(Rng& rng) {
  return {{"blocks", rng.size(0, 3)}, {"page", rng.size(1, 4)}, {"h_kv", rng.size(1, 2)}, {"d", random_gqa_d(rng)}};
}

// quantize_gqa_cache (src [blocks, page, h_kv, d] 16-bit -> dst int8 / fp8 with scales) or
// dequantize_gqa_cache (the reverse).
void run_gqa_convert(Rng& rng, Recorder& rec, int64_t index, bool quantize, bool reference) {
  const Symbols s = gqa_cache_symbols(rng);
  const CacheFormat format = random_format(rng, false);
  const std::vector<Dim> dims = {sym("blocks"), sym("page"), sym("h_kv"), sym("d")};
  const std::string name = std::string(quantize ? "" : "de") + "quantize_gqa_cache";
  FuzzCase c{.op = (reference ? "reference::" : "") + name, .host_memory = reference};
  const TensorSpec dense{.name = quantize ? "src" : "dst", .dims = dims, .dtypes = {kBF16, kFP16}, .output = !quantize,
                         .fill = quantize ? Fill::kHalf : Fill::kPoison};
  TensorSpec values = cache_values_spec(quantize ? "dst.values" : "src.values", dims, format, "", quantize);
  if (quantize) values.fill = Fill::kPoison;
  const TensorSpec scale = cache_scale_spec(quantize ? "dst.scale" : "src.scale", format, quantize);
  // Positions: the dense tensor, the cache's values, its scale.
  constexpr std::size_t kDense = 0, kValues = 1, kScale = 2;
  c.args = make_args(rng, {dense, values, scale}, s);
  c.args[kValues].spec.dtypes = {kInt8, kFP8E4M3};
  const std::vector<Arg>& t = c.args;
  call_and_check(
      rng, rec, index, c,
      [&] {
        const GqaPagedCache cache{t[kValues].ref, t[kScale].ref};
        if (reference) {
          return quantize ? reference::quantize_gqa_cache(t[kDense].ref, cache)
                          : reference::dequantize_gqa_cache(cache, t[kDense].ref);
        }
        return quantize ? quantize_gqa_cache(t[kDense].ref, cache, nullptr) : dequantize_gqa_cache(cache, t[kDense].ref, nullptr);
      },
      [&](const Symbols& got, std::vector<Violation>* v) {
        head_dim_violation(got, v);
        page_violation(got, quantize ? "src" : "src.values", v);
        check_cache_scales(t, {kScale}, t[kValues].ref.dtype, quantize, got, v);
      });
}

void run_gqa_append(Rng& rng, Recorder& rec, int64_t index, bool reference) {
  Symbols s = gqa_cache_symbols(rng);
  s["b"] = rng.size(0, 2);
  s["s_q"] = rng.size(0, 3);
  s["width"] = rng.size(0, 3);
  const CacheFormat format = random_format(rng, true);
  const int64_t reach = std::min<int64_t>(product_or(s.at("width"), s.at("page"), INT32_MAX), INT32_MAX - 1);
  const std::vector<Dim> cache_dims = {sym("blocks"), sym("page"), sym("h_kv"), sym("d")};
  const std::vector<Dim> new_dims = {sym("b"), sym("s_q"), sym("h_kv"), sym("d")};
  FuzzCase c{.op = reference ? "reference::gqa_cache_append" : "gqa_cache_append", .host_memory = reference};
  TensorSpec v_new{.name = "v_new", .dims = new_dims, .dtypes = {kBF16, kFP16}, .same_dtype_as = "k_new"};
  TensorSpec v_values = cache_values_spec("v_cache.values", cache_dims, format, "k_new", true);
  v_values.same_dtype_as = "k_cache.values";
  // Positions: k_new, v_new, k_cache.values, k_cache.scale, v_cache.values, v_cache.scale,
  // block_table, cache_seqlens, finished.
  c.args = make_args(rng,
                     {{.name = "k_new", .dims = new_dims, .dtypes = {kBF16, kFP16}},
                      v_new,
                      cache_values_spec("k_cache.values", cache_dims, format, "k_new", true),
                      cache_scale_spec("k_cache.scale", format, true),
                      v_values,
                      cache_scale_spec("v_cache.scale", format, true),
                      {.name = "block_table", .dims = {sym("b"), sym("width")}, .dtypes = {kInt32}, .fill = Fill::kIndex,
                       .index_below = s.at("blocks")},
                      {.name = "cache_seqlens", .dims = {sym("b")}, .dtypes = {kInt32}, .fill = Fill::kIndex,
                       .index_below = reach + 1},
                      finished_spec(rng)},
                     s);
  widen_cache_dtypes(c.args[2]);
  const RotaryEmbedding rope = random_rope(rng);
  c.scalars = {{"rope", rope_text(rope)}};
  const std::vector<Arg>& t = c.args;
  call_and_check(
      rng, rec, index, c,
      [&] {
        const GqaCacheAppendArgs a{.k_new = t[0].ref, .v_new = t[1].ref, .k_cache = {t[2].ref, t[3].ref},
                                   .v_cache = {t[4].ref, t[5].ref}, .block_table = t[6].ref, .cache_seqlens = t[7].ref,
                                   .rope = rope, .finished = t[8].ref};
        return reference ? reference::gqa_cache_append(a) : gqa_cache_append(a, nullptr);
      },
      [&](const Symbols& got, std::vector<Violation>* v) {
        head_dim_violation(got, v);
        page_violation(got, "k_cache.values", v);
        if (const int64_t s_q = symbol(got, "s_q"); s_q > INT32_MAX) problem_violation("s_q", s_q, v);
        if (const int64_t h_kv = symbol(got, "h_kv"); h_kv > INT32_MAX) problem_violation("h_kv", h_kv, v);
        check_cache_dtype(t[2], t[0].ref.dtype, v);
        check_cache_scales(t, {3, 5}, t[2].ref.dtype, true, got, v);
        rope_violations(rope, symbol(got, "d", 64), v);
      });
}

}  // namespace

std::vector<OpDriver> attention_drivers() {
  return {
      {"mha_prefill_workspace_size", [](Rng& r, Recorder& rec, int64_t i) { run_mha_prefill(r, rec, i, Entry::kQuery); }},
      {"mha_prefill", [](Rng& r, Recorder& rec, int64_t i) { run_mha_prefill(r, rec, i, Entry::kGpu); }},
      {"reference::mha_prefill", [](Rng& r, Recorder& rec, int64_t i) { run_mha_prefill(r, rec, i, Entry::kReference); }},
      {"reference::mha_prefill_backward", run_mha_prefill_backward},
      {"gqa_decode_workspace_size", [](Rng& r, Recorder& rec, int64_t i) { run_gqa_problem(r, rec, i, false); }},
      {"gqa_decode_plan", [](Rng& r, Recorder& rec, int64_t i) { run_gqa_problem(r, rec, i, true); }},
      {"gqa_decode", [](Rng& r, Recorder& rec, int64_t i) { run_gqa_decode(r, rec, i, false); }},
      {"reference::gqa_decode", [](Rng& r, Recorder& rec, int64_t i) { run_gqa_decode(r, rec, i, true); }},
      {"quantize_gqa_cache", [](Rng& r, Recorder& rec, int64_t i) { run_gqa_convert(r, rec, i, true, false); }},
      {"reference::quantize_gqa_cache", [](Rng& r, Recorder& rec, int64_t i) { run_gqa_convert(r, rec, i, true, true); }},
      {"dequantize_gqa_cache", [](Rng& r, Recorder& rec, int64_t i) { run_gqa_convert(r, rec, i, false, false); }},
      {"reference::dequantize_gqa_cache", [](Rng& r, Recorder& rec, int64_t i) { run_gqa_convert(r, rec, i, false, true); }},
      {"gqa_cache_append", [](Rng& r, Recorder& rec, int64_t i) { run_gqa_append(r, rec, i, false); }},
      {"reference::gqa_cache_append", [](Rng& r, Recorder& rec, int64_t i) { run_gqa_append(r, rec, i, true); }},
  };
}

}  // namespace mlakit::fuzz
