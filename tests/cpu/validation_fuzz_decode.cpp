// Fuzz drivers of the dense and sparse MLA decode: workspace-size queries, plans, the decodes
// (device stand-in pointers) and their CPU references (exactly sized host buffers).
#include <algorithm>
#include <string>

#include "mlakit/mla_decode.h"
#include "mlakit/mla_sparse_decode.h"
#include "mlakit/reference.h"
#include "validation_fuzz_runner.h"

namespace mlakit::fuzz {
namespace {

using enum DType;

// a * b, or `fallback` when it overflows (edge sizes).
int64_t product_or(int64_t a, int64_t b, int64_t fallback) {
  int64_t r;
  return __builtin_mul_overflow(a, b, &r) ? fallback : r;
}

int random_int(Rng& rng, int lo, int hi) { return rng.chance(0.05) ? rng.edge_int() : static_cast<int>(rng.uniform(lo, hi)); }

MlaKernel random_kernel(Rng& rng) {
  return static_cast<MlaKernel>(rng.chance(0.9) ? static_cast<int>(rng.uniform(-1, 1)) : rng.edge_int());
}

// A plan for the GPU decodes: empty, or plausible fields (never a real workspace: the
// stand-in is host memory, which a device build must reject).
MlaDecodePlan random_plan(Rng& rng, const Symbols& s, int64_t sparse_topk) {
  MlaDecodePlan p;
  if (rng.chance(0.3)) return p;
  p.problem = MlaDecodeProblem{.b = symbol(s, "b"), .s_q = static_cast<int>(symbol(s, "s_q")),
                               .h_q = static_cast<int>(symbol(s, "h_q")), .h_kv = static_cast<int>(symbol(s, "h_kv"))};
  p.num_parts = random_int(rng, 1, 8);
  p.device = rng.chance(0.9) ? 0 : rng.edge_int();
  p.workspace = rng.chance(0.9) ? device_stand_in() : nullptr;
  p.workspace_bytes = static_cast<std::size_t>(rng.uniform(0, 1 << 20));
  p.sparse_topk = sparse_topk;
  p.sparse_topk_length = rng.chance(0.5);
  return p;
}

std::string plan_text(const MlaDecodePlan& p) {
  return p.workspace == nullptr ? "{} (empty)"
                                : "{problem b=" + std::to_string(p.problem.b) + " h_q=" + std::to_string(p.problem.h_q) +
                                      ", num_parts=" + std::to_string(p.num_parts) + ", device=" + std::to_string(p.device) + "}";
}

// The documented problem of a dense decode: b >= 0, 0 <= s_q <= 1024, h_kv >= 1, h_q a
// non-negative multiple of h_kv, d_qk 576, d_v 512 (README, "Supported configurations"; b, s_q
// or h_q of 0 is the empty problem, valid).
void dense_problem_violations(int64_t b, int64_t s_q, int64_t h_q, int64_t h_kv, int64_t d_qk, int64_t d_v,
                              std::vector<Violation>* v) {
  if (b < 0) problem_violation("b", b, v);
  if (s_q < 0 || s_q > 1024) problem_violation("s_q", s_q, v);
  if (h_kv < 1) problem_violation("h_kv", h_kv, v);
  if (h_q < 0 || (h_kv >= 1 && h_q % h_kv != 0)) problem_violation("h_q (a multiple of h_kv " + std::to_string(h_kv) + ")", h_q, v);
  if (d_qk != 576) problem_violation("d_qk", d_qk, v);
  if (d_v != 512) problem_violation("d_v", d_v, v);
}

Symbols dense_symbols(Rng& rng) {
  Symbols s;
  s["h_kv"] = rng.uniform(1, 2);
  s["h_q"] = s["h_kv"] * rng.uniform(0, 2);  // 0: the empty problem
  for (const char* name : {"h_kv", "h_q"}) {
    if (rng.chance(0.04)) s[name] = rng.edge_size();
  }
  s["b"] = rng.size(0, 2);
  s["s_q"] = rng.size(0, 2);
  s["page"] = rng.size(1, 8);
  s["blocks"] = rng.size(0, 4);
  s["width"] = rng.size(0, 3);
  return s;
}

std::vector<TensorSpec> dense_specs(const Symbols& s, bool reference) {
  // Lengths mostly within the block table's reach (width * page), some beyond it.
  const int64_t reach = std::min<int64_t>(product_or(s.at("width"), s.at("page"), INT32_MAX), INT32_MAX - 1) + 1;
  return {
      {.name = "q", .dims = {sym("b"), sym("s_q"), sym("h_q"), fixed(576)}, .dtypes = {kBF16, kFP16}},
      {.name = "kv_cache", .dims = {sym("blocks"), sym("page"), sym("h_kv"), fixed(576)}, .dtypes = {kBF16, kFP16},
       .same_dtype_as = "q"},
      {.name = "block_table", .dims = {sym("b"), sym("width")}, .dtypes = {kInt32}, .fill = Fill::kIndex,
       .index_below = s.at("blocks")},
      {.name = "cache_seqlens", .dims = {sym("b")}, .dtypes = {kInt32}, .fill = Fill::kIndex, .index_below = reach},
      {.name = "out", .dims = {sym("b"), sym("s_q"), sym("h_q"), fixed(512)}, .dtypes = {kBF16, kFP16},
       .same_dtype_as = "q", .or_float32 = reference, .output = true, .fill = Fill::kPoison},
      {.name = "lse", .dims = {sym("b"), sym("h_q"), sym("s_q")}, .dtypes = {kFP32}, .output = true, .fill = Fill::kPoison},
  };
}

void run_dense_decode(Rng& rng, Recorder& rec, int64_t index, bool reference) {
  const Symbols s = dense_symbols(rng);
  FuzzCase c{.op = reference ? "reference::mla_decode" : "mla_decode", .args = make_args(rng, dense_specs(s, reference), s),
             .host_memory = reference};
  const std::optional<float> scale = random_scale(rng);
  const bool causal = rng.chance(0.5);
  const int threads = reference_threads(rng);
  const MlaDecodePlan plan = random_plan(rng, s, 0);
  c.scalars = {{"softmax_scale", str(scale)}, {"causal", causal ? "true" : "false"}};
  c.scalars.push_back(reference ? std::pair{std::string("num_threads"), std::to_string(threads)}
                                : std::pair{std::string("plan"), plan_text(plan)});
  const std::vector<Arg>& t = c.args;  // pointed at memory by call_and_check before the call
  call_and_check(
      rng, rec, index, c,
      [&] {
        const MlaDecodeArgs a{.q = t[0].ref, .kv_cache = t[1].ref, .block_table = t[2].ref, .cache_seqlens = t[3].ref,
                              .out = t[4].ref, .lse = t[5].ref, .softmax_scale = scale, .causal = causal};
        return reference ? reference::mla_decode(a, threads) : mla_decode(a, plan, nullptr);
      },
      [&](const Symbols& got, std::vector<Violation>* v) {
        dense_problem_violations(symbol(got, "b"), symbol(got, "s_q"), symbol(got, "h_q"), symbol(got, "h_kv"), 576, 512, v);
        if (symbol(got, "page") < 1) problem_violation("kv_cache.shape[1] (page_size)", symbol(got, "page"), v);
        check_scale("softmax_scale", scale, v);
      });
}

MlaDecodeProblem random_dense_problem(Rng& rng) {
  const int h_kv = random_int(rng, 1, 2);
  const int h_q = h_kv >= 1 && h_kv <= 2 && rng.chance(0.95) ? h_kv * static_cast<int>(rng.uniform(1, 4)) : rng.edge_int();
  return MlaDecodeProblem{.b = rng.size(1, 64), .s_q = random_int(rng, 1, 4), .h_q = h_q,
                          .h_kv = h_kv, .d_qk = rng.chance(0.95) ? 576 : rng.edge_int(),
                          .d_v = rng.chance(0.95) ? 512 : rng.edge_int()};
}

std::vector<std::pair<std::string, std::string>> problem_text(const MlaDecodeProblem& p) {
  return {{"problem", "{.b = " + std::to_string(p.b) + ", .s_q = " + std::to_string(p.s_q) + ", .h_q = " +
                          std::to_string(p.h_q) + ", .h_kv = " + std::to_string(p.h_kv) + ", .d_qk = " +
                          std::to_string(p.d_qk) + ", .d_v = " + std::to_string(p.d_v) + "}"}};
}

// mla_decode_workspace_size, or with `plan` mla_decode_plan (cache_seqlens, workspace, plan).
void run_dense_problem(Rng& rng, Recorder& rec, int64_t index, bool plan) {
  const MlaDecodeProblem p = random_dense_problem(rng);
  const MlaDecodeOptions options{.kernel = random_kernel(rng)};
  FuzzCase c{.op = plan ? "mla_decode_plan" : "mla_decode_workspace_size", .scalars = problem_text(p)};
  if (plan) {
    const Symbols s{{"b", p.b}};
    c.args = make_args(rng, {{.name = "cache_seqlens", .dims = {sym("b")}, .dtypes = {kInt32}}}, s);
    mutate_args(rng, c.args);
    Memory::attach_device_stand_in(c.args);
  }
  void* workspace = rng.chance(0.9) ? device_stand_in(rng.chance(0.9) ? 0 : rng.pick({1, 16, 128})) : nullptr;
  const auto bytes = static_cast<std::size_t>(rng.chance(0.9) ? rng.uniform(0, 1 << 24) : rng.edge_size());
  const bool null_out = rng.chance(0.05);
  c.scalars.push_back({"options.kernel", std::to_string(static_cast<int>(options.kernel))});
  c.scalars.push_back({"output pointer", null_out ? "null" : "given"});
  if (plan) c.scalars.push_back({"workspace, bytes", (workspace ? "stand-in, " : "null, ") + std::to_string(bytes)});
  if (!rec.begin(index, c)) return;
  std::size_t size = 0;
  MlaDecodePlan out;
  const Status st = plan ? mla_decode_plan(p, c.args[0].ref, workspace, bytes, nullptr, null_out ? nullptr : &out, options)
                         : mla_decode_workspace_size(p, null_out ? nullptr : &size, options);
  std::vector<Violation> v;
  if (reached_device(st)) {
    dense_problem_violations(p.b, p.s_q, p.h_q, p.h_kv, p.d_qk, p.d_v, &v);
    if (null_out) v.push_back({"null", "output pointer: null accepted"});
    if (st.is_ok() && plan) {
      Symbols got{{"b", p.b}};
      for (const Violation& x : contract_violations(c.args, &got)) v.push_back(x);
    }
    if (st.is_ok() && !plan && size == 0) v.push_back({"problem", "workspace size 0 returned"});
  }
  rec.check_status(st, gpu_codes(), reached_device(st), v);
}

Symbols sparse_symbols(Rng& rng) {
  Symbols s;
  s["b"] = rng.size(0, 2);
  s["s_q"] = rng.size(0, 2);
  s["h_q"] = rng.size(0, 4);
  s["topk"] = rng.size(1, 40);
  s["blocks"] = rng.size(0, 3);
  s["page"] = rng.size(1, 16);
  s["extra_topk"] = rng.size(1, 20);  // the second cache's, when given
  s["extra_blocks"] = rng.size(0, 3);
  s["extra_page"] = rng.size(1, 16);
  return s;
}

std::vector<TensorSpec> sparse_specs(const Symbols& s, bool reference) {
  const int64_t slots = product_or(s.at("blocks"), s.at("page"), INT32_MAX);
  return {
      {.name = "q", .dims = {sym("b"), sym("s_q"), sym("h_q"), fixed(576)}, .dtypes = {kBF16}},
      {.name = "kv_cache", .dims = {sym("blocks"), sym("page"), fixed(1), fixed(656)}, .dtypes = {kUInt8, kFP8E4M3, kInt8},
       .fill = Fill::kFp8Tokens},
      {.name = "indices", .dims = {sym("b"), sym("s_q"), sym("topk")}, .dtypes = {kInt32}, .fill = Fill::kIndex,
       .index_below = slots},
      {.name = "topk_length", .dims = {sym("b")}, .dtypes = {kInt32}, .optional = true, .fill = Fill::kIndex,
       .index_below = std::min<int64_t>(s.at("topk"), INT32_MAX) + 1},
      {.name = "attn_sink", .dims = {sym("h_q")}, .dtypes = {kFP32}, .optional = true, .fill = Fill::kFloat},
      {.name = "out", .dims = {sym("b"), sym("s_q"), sym("h_q"), fixed(512)}, .dtypes = {kBF16}, .or_float32 = reference,
       .output = true, .fill = Fill::kPoison},
      {.name = "lse", .dims = {sym("b"), sym("h_q"), sym("s_q")}, .dtypes = {kFP32}, .output = true, .fill = Fill::kPoison},
      // The optional second cache (its pairing rules: run_sparse_decode's extra checks).
      {.name = "extra_kv_cache", .dims = {sym("extra_blocks"), sym("extra_page"), fixed(1), fixed(656)},
       .dtypes = {kUInt8, kFP8E4M3, kInt8}, .optional = true, .fill = Fill::kFp8Tokens},
      {.name = "extra_indices", .dims = {sym("b"), sym("s_q"), sym("extra_topk")}, .dtypes = {kInt32}, .optional = true,
       .fill = Fill::kIndex, .index_below = product_or(s.at("extra_blocks"), s.at("extra_page"), INT32_MAX)},
      {.name = "extra_topk_length", .dims = {sym("b")}, .dtypes = {kInt32}, .optional = true, .fill = Fill::kIndex,
       .index_below = std::min<int64_t>(s.at("extra_topk"), INT32_MAX) + 1},
  };
}

// The second cache's rules beyond each tensor's own: extra_kv_cache and extra_indices together,
// extra_topk_length only with them, 1 <= extra_topk <= 2^20, a positive page size.
void second_cache_violations(const std::vector<Arg>& t, const Symbols& got, std::vector<Violation>* v) {
  const bool cache = !t[7].ref.empty(), indices = !t[8].ref.empty(), lengths = !t[9].ref.empty();
  if (cache != indices) v->push_back({"extra_kv_cache / extra_indices", "one given without the other"});
  if (lengths && !(cache && indices)) v->push_back({"extra_topk_length", "given without a second cache"});
  if (cache && indices) {
    const int64_t extra_topk = symbol(got, "extra_topk");
    if (extra_topk < 1 || extra_topk > (1 << 20)) problem_violation("extra_indices.shape[2] (extra_topk)", extra_topk, v);
    if (symbol(got, "extra_page") < 1) problem_violation("extra_kv_cache.shape[1] (page_size)", symbol(got, "extra_page"), v);
  }
}

// b, s_q or h_q of 0: the empty problem, valid.
void sparse_problem_violations(int64_t b, int64_t s_q, int64_t h_q, int64_t topk, std::vector<Violation>* v) {
  if (b < 0) problem_violation("b", b, v);
  if (s_q < 0 || s_q > INT32_MAX) problem_violation("s_q", s_q, v);
  if (h_q < 0 || h_q > INT32_MAX) problem_violation("h_q", h_q, v);
  if (topk < 1 || topk > INT32_MAX) problem_violation("topk", topk, v);
}

void run_sparse_decode(Rng& rng, Recorder& rec, int64_t index, bool reference) {
  const Symbols s = sparse_symbols(rng);
  FuzzCase c{.op = reference ? "reference::mla_sparse_decode_fp8" : "mla_sparse_decode_fp8",
             .args = make_args(rng, sparse_specs(s, reference), s), .host_memory = reference};
  const std::optional<float> scale = random_scale(rng);
  const bool causal = rng.chance(0.1);
  const int threads = reference_threads(rng);
  const MlaDecodePlan plan = random_plan(rng, s, s.at("topk"));
  c.scalars = {{"softmax_scale", str(scale)}, {"causal", causal ? "true" : "false"}};
  c.scalars.push_back(reference ? std::pair{std::string("num_threads"), std::to_string(threads)}
                                : std::pair{std::string("plan"), plan_text(plan)});
  const std::vector<Arg>& t = c.args;
  call_and_check(
      rng, rec, index, c,
      [&] {
        const MlaSparseDecodeArgs a{.q = t[0].ref,
                                    .kv_cache = t[1].ref,
                                    .indices = t[2].ref,
                                    .topk_length = t[3].ref,
                                    .extra_kv_cache = t[7].ref,
                                    .extra_indices = t[8].ref,
                                    .extra_topk_length = t[9].ref,
                                    .attn_sink = t[4].ref,
                                    .out = t[5].ref,
                                    .lse = t[6].ref,
                                    .softmax_scale = scale,
                                    .causal = causal};
        return reference ? reference::mla_sparse_decode_fp8(a, threads) : mla_sparse_decode_fp8(a, plan, nullptr);
      },
      [&](const Symbols& got, std::vector<Violation>* v) {
        sparse_problem_violations(symbol(got, "b"), symbol(got, "s_q"), symbol(got, "h_q"), symbol(got, "topk"), v);
        if (symbol(got, "page") < 1) problem_violation("kv_cache.shape[1] (page_size)", symbol(got, "page"), v);
        if (causal) problem_violation("causal", 1, v);
        check_scale("softmax_scale", scale, v);
        second_cache_violations(t, got, v);
      });
}

// mla_sparse_decode_workspace_size, or with `plan` mla_sparse_decode_plan.
void run_sparse_problem(Rng& rng, Recorder& rec, int64_t index, bool plan) {
  const MlaSparseDecodeProblem p{.b = rng.size(1, 64), .s_q = random_int(rng, 1, 4), .h_q = random_int(rng, 1, 128),
                                 .topk = random_int(rng, 1, 4096), .kernel = random_kernel(rng)};
  FuzzCase c{.op = plan ? "mla_sparse_decode_plan" : "mla_sparse_decode_workspace_size", .problem = {{"b", p.b}, {"s_q", p.s_q}}};
  c.scalars = {{"problem", "{.b = " + std::to_string(p.b) + ", .s_q = " + std::to_string(p.s_q) + ", .h_q = " +
                               std::to_string(p.h_q) + ", .topk = " + std::to_string(p.topk) + ", .kernel = " +
                               std::to_string(static_cast<int>(p.kernel)) + "}"}};
  if (plan) {
    const Symbols s{{"b", p.b}};
    c.args = make_args(rng, {{.name = "topk_length", .dims = {sym("b")}, .dtypes = {kInt32}, .optional = true}}, s);
    mutate_args(rng, c.args);
    Memory::attach_device_stand_in(c.args);
  }
  void* workspace = rng.chance(0.9) ? device_stand_in() : nullptr;
  const auto bytes = static_cast<std::size_t>(rng.chance(0.9) ? rng.uniform(0, 1 << 24) : rng.edge_size());
  const bool null_out = rng.chance(0.05);
  c.scalars.push_back({"output pointer", null_out ? "null" : "given"});
  if (!rec.begin(index, c)) return;
  std::size_t size = 0;
  MlaDecodePlan out;
  const Status st = plan ? mla_sparse_decode_plan(p, c.args[0].ref, workspace, bytes, nullptr, null_out ? nullptr : &out)
                         : mla_sparse_decode_workspace_size(p, null_out ? nullptr : &size);
  std::vector<Violation> v;
  if (reached_device(st)) {
    sparse_problem_violations(p.b, p.s_q, p.h_q, p.topk, &v);
    if (null_out) v.push_back({"null", "output pointer: null accepted"});
    if (st.is_ok() && plan) {
      Symbols got{{"b", p.b}};
      for (const Violation& x : contract_violations(c.args, &got)) v.push_back(x);
    }
  }
  rec.check_status(st, gpu_codes(), reached_device(st), v);
}

}  // namespace

std::vector<OpDriver> decode_drivers() {
  return {
      {"mla_decode_workspace_size", [](Rng& r, Recorder& rec, int64_t i) { run_dense_problem(r, rec, i, false); }},
      {"mla_decode_plan", [](Rng& r, Recorder& rec, int64_t i) { run_dense_problem(r, rec, i, true); }},
      {"mla_decode", [](Rng& r, Recorder& rec, int64_t i) { run_dense_decode(r, rec, i, false); }},
      {"reference::mla_decode", [](Rng& r, Recorder& rec, int64_t i) { run_dense_decode(r, rec, i, true); }},
      {"mla_sparse_decode_workspace_size", [](Rng& r, Recorder& rec, int64_t i) { run_sparse_problem(r, rec, i, false); }},
      {"mla_sparse_decode_plan", [](Rng& r, Recorder& rec, int64_t i) { run_sparse_problem(r, rec, i, true); }},
      {"mla_sparse_decode_fp8", [](Rng& r, Recorder& rec, int64_t i) { run_sparse_decode(r, rec, i, false); }},
      {"reference::mla_sparse_decode_fp8", [](Rng& r, Recorder& rec, int64_t i) { run_sparse_decode(r, rec, i, true); }},
  };
}

}  // namespace mlakit::fuzz
