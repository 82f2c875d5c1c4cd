// GQA / MHA decode over a paged, optionally quantized KV cache (docs/contract.md, GQA decode):
// workspace query, plan, decode, CPU reference; and the cache tools (quantize, dequantize,
// append) on the device and on host arrays.
//
// Cache values cross as their DLPack dtype, except uint8: NumPy without ml_dtypes and CuPy
// have no float8, and the package hands PyTorch / ml_dtypes float8 arrays over as their
// bytes (python/mlakit/_arrays.py, extension_view), so uint8 cache values are read as float8
// e4m3 bit patterns (int8 caches are int8 arrays; no cache format is uint8).
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <string>

#include "arrays.h"
#include "bindings.h"
#include "plan_fields.h"
#include "mlakit/gqa_cache.h"
#include "mlakit/gqa_decode.h"

namespace mlakit::python {
namespace {

using OptArray = std::optional<Array>;

// uint8 cache values are float8 e4m3 bytes (see the file comment).
TensorRef cache_ref(const Array& a, const char* name) {
  TensorRef t = to_ref(a, name);
  if (t.dtype == DType::kUInt8) t.dtype = DType::kFP8E4M3;
  return t;
}
TensorRef cache_ref(const MutArray& a, const char* name) {
  TensorRef t = to_ref(a, name);
  if (t.dtype == DType::kUInt8) t.dtype = DType::kFP8E4M3;
  return t;
}

GqaPagedCache paged_cache(const Array& values, const OptArray& scale, const char* values_name,
                          const char* scale_name) {
  return GqaPagedCache{cache_ref(values, values_name), to_ref(scale, scale_name)};
}

RopeStyle rope_style_from(const std::string& name) {
  if (name == "none") return RopeStyle::kNone;
  if (name == "neox") return RopeStyle::kNeox;
  if (name == "gptj") return RopeStyle::kGptj;
  throw nb::value_error(("rope_style: expected 'none', 'neox' or 'gptj', got '" + name + "'").c_str());
}

// Runs a CPU reference without the GIL (the arrays were converted before); the Status is
// raised once the GIL is held again.
template <typename Fn>
Status released(Fn fn) {
  nb::gil_scoped_release release;
  return fn();
}

RotaryEmbedding rope_from(const std::string& style, double theta, int rotary_dim) {
  return RotaryEmbedding{.style = rope_style_from(style), .theta = theta, .rotary_dim = rotary_dim};
}

GqaDecodeProblem gqa_problem(int64_t b, int s_q, int h_q, int h_kv, int d, bool causal, int window) {
  return GqaDecodeProblem{.b = b, .s_q = s_q, .h_q = h_q, .h_kv = h_kv, .d = d, .causal = causal, .window = window};
}

// Everything of one call but the plan and the stream, in the order of the Python signature.
struct DecodeInputs {
  Array q;
  Array k_cache;
  OptArray k_scale;
  Array v_cache;
  OptArray v_scale;
  Array block_table;
  Array cache_seqlens;
  OptArray k_new;
  OptArray v_new;
  std::string rope_style;
  double rope_theta;
  int rotary_dim;
  OptArray alibi_slopes;
  OptArray finished;
  MutArray out;
  OptArray lse;  // written: the Python layer allocates it (a writable array)
  std::optional<float> softmax_scale;
  bool causal;
  int window;
  float softcap;

  GqaDecodeArgs args() const {
    GqaDecodeArgs a;
    a.q = to_ref(q, "q");
    a.k_cache = paged_cache(k_cache, k_scale, "k_cache", "k_scale");
    a.v_cache = paged_cache(v_cache, v_scale, "v_cache", "v_scale");
    a.block_table = to_ref(block_table, "block_table");
    a.cache_seqlens = to_ref(cache_seqlens, "cache_seqlens");
    a.k_new = to_ref(k_new, "k_new");
    a.v_new = to_ref(v_new, "v_new");
    a.rope = rope_from(rope_style, rope_theta, rotary_dim);
    a.alibi_slopes = to_ref(alibi_slopes, "alibi_slopes");
    a.finished = to_ref(finished, "finished");
    a.out = to_ref(out, "out");
    a.lse = to_ref(lse, "lse");
    a.softmax_scale = softmax_scale;  // None: 1 / sqrt(d)
    a.causal = causal;
    a.window = window;
    a.softcap = softcap;
    return a;
  }
};

GqaCacheAppendArgs append_args(const Array& k_new, const Array& v_new, const Array& k_cache, const OptArray& k_scale,
                               const Array& v_cache, const OptArray& v_scale, const Array& block_table,
                               const Array& cache_seqlens, const std::string& rope_style, double rope_theta,
                               int rotary_dim, const OptArray& finished) {
  GqaCacheAppendArgs a;
  a.k_new = to_ref(k_new, "k_new");
  a.v_new = to_ref(v_new, "v_new");
  a.k_cache = paged_cache(k_cache, k_scale, "k_cache", "k_scale");
  a.v_cache = paged_cache(v_cache, v_scale, "v_cache", "v_scale");
  a.block_table = to_ref(block_table, "block_table");
  a.cache_seqlens = to_ref(cache_seqlens, "cache_seqlens");
  a.rope = rope_from(rope_style, rope_theta, rotary_dim);
  a.finished = to_ref(finished, "finished");
  return a;
}

// The arguments of gqa_decode / gqa_decode_reference and of the two appends. Arrays the call
// may write but that can also be only read (the caches and scales: written by an append, a
// per-tensor scale only read) are taken as read-only views; the Python layer checks that they
// are writable where they are written.
#define MLAKIT_GQA_DECODE_ARGS                                                                                   \
  nb::arg("q"), nb::arg("k_cache"), nb::arg("k_scale").none(), nb::arg("v_cache"), nb::arg("v_scale").none(),    \
      nb::arg("block_table"), nb::arg("cache_seqlens"), nb::arg("k_new").none(), nb::arg("v_new").none(),        \
      nb::arg("rope_style"), nb::arg("rope_theta"), nb::arg("rotary_dim"), nb::arg("alibi_slopes").none(),       \
      nb::arg("finished").none(), nb::arg("out"), nb::arg("lse").none(), nb::arg("softmax_scale").none(),        \
      nb::arg("causal"), nb::arg("window"), nb::arg("softcap")

#define MLAKIT_GQA_APPEND_ARGS                                                                                  \
  nb::arg("k_new"), nb::arg("v_new"), nb::arg("k_cache"), nb::arg("k_scale").none(), nb::arg("v_cache"),        \
      nb::arg("v_scale").none(), nb::arg("block_table"), nb::arg("cache_seqlens"), nb::arg("rope_style"),       \
      nb::arg("rope_theta"), nb::arg("rotary_dim"), nb::arg("finished").none()

}  // namespace

void bind_gqa_decode(nb::module_& m) {
  nb::class_<GqaDecodePlan>(m, "GqaDecodePlan",
                            "A GQA decode split-KV schedule in a caller's workspace; reused by every layer of a step.")
      .def_prop_ro("b", [](const GqaDecodePlan& p) { return p.problem.b; })
      .def_prop_ro("s_q", [](const GqaDecodePlan& p) { return p.problem.s_q; })
      .def_prop_ro("h_q", [](const GqaDecodePlan& p) { return p.problem.h_q; })
      .def_prop_ro("h_kv", [](const GqaDecodePlan& p) { return p.problem.h_kv; })
      .def_prop_ro("d", [](const GqaDecodePlan& p) { return p.problem.d; })
      .def_prop_ro("causal", [](const GqaDecodePlan& p) { return p.problem.causal; })
      .def_prop_ro("window", [](const GqaDecodePlan& p) { return p.problem.window; })
      .def_ro("device", &GqaDecodePlan::device, "CUDA device ordinal; -1 for a host plan")
      .def_ro("num_parts", &GqaDecodePlan::num_parts, "CTAs per (kv head, row tile) sharing the batch's KV work")
      .def_ro("block_n", &GqaDecodePlan::block_n, "scheduling granularity, in keys")
      .def_ro("rows_per_tile", &GqaDecodePlan::rows_per_tile, "query rows (token x head pairs) per CTA")
      .def_ro("workspace_bytes", &GqaDecodePlan::workspace_bytes)
      .def_ro("part_ranges_offset", &GqaDecodePlan::part_ranges_offset)
      .def_ro("split_prefix_offset", &GqaDecodePlan::split_prefix_offset)
      .def_ro("partial_slots", &GqaDecodePlan::partial_slots)
      .def("fields", &plan_fields<GqaDecodePlan>,
           "The plan as a list of integers (python/src/plan_fields.h), without its workspace: with the "
           "workspace array, from_fields rebuilds it (PyTorch custom ops pass plans this way).")
      .def_static("from_fields", &plan_from_fields<GqaDecodePlan>, nb::arg("fields"), nb::arg("workspace"),
                  "The plan of fields() in `workspace` (its size and device checked against the plan's).")
      .def_prop_ro("kernel", [](const GqaDecodePlan& p) { return std::string(p.device < 0 ? "reference" : "gpu"); })
      .def("__repr__", [](const GqaDecodePlan& p) {
        const GqaDecodeProblem& q = p.problem;
        return "GqaDecodePlan(b=" + std::to_string(q.b) + ", s_q=" + std::to_string(q.s_q) +
               ", h_q=" + std::to_string(q.h_q) + ", h_kv=" + std::to_string(q.h_kv) + ", d=" + std::to_string(q.d) +
               ", causal=" + (q.causal ? "True" : "False") + ", window=" + std::to_string(q.window) +
               ", device=" + std::to_string(p.device) + ", num_parts=" + std::to_string(p.num_parts) + ")";
      });

  m.def(
      "gqa_host_plan",
      [](int64_t b, int s_q, int h_q, int h_kv, int d, bool causal, int window) {
        GqaDecodePlan plan;
        plan.problem = gqa_problem(b, s_q, h_q, h_kv, d, causal, window);
        return plan;
      },
      nb::arg("b"), nb::arg("s_q"), nb::arg("h_q"), nb::arg("h_kv"), nb::arg("d"), nb::arg("causal") = false,
      nb::arg("window") = 0,
      "The plan of host arrays: the problem alone (the CPU reference needs no schedule, so no workspace).");

  m.def(
      "gqa_decode_workspace_size",
      [](int64_t b, int s_q, int h_q, int h_kv, int d, bool causal, int window) {
        std::size_t bytes = 0;
        raise_if_error(gqa_decode_workspace_size(gqa_problem(b, s_q, h_q, h_kv, d, causal, window), &bytes));
        return bytes;
      },
      nb::arg("b"), nb::arg("s_q"), nb::arg("h_q"), nb::arg("h_kv"), nb::arg("d"), nb::arg("causal") = false,
      nb::arg("window") = 0, "Bytes of device workspace the GQA plan and decode need on the current device.");

  m.def(
      "gqa_decode_plan",
      [](int64_t b, int s_q, int h_q, int h_kv, int d, bool causal, int window, Array cache_seqlens,
         MutArray workspace, uintptr_t stream) {
        GqaDecodePlan plan;
        raise_if_error(gqa_decode_plan(gqa_problem(b, s_q, h_q, h_kv, d, causal, window),
                                       to_ref(cache_seqlens, "cache_seqlens"), workspace.data(), workspace.nbytes(),
                                       to_stream(stream), &plan));
        return plan;
      },
      nb::arg("b"), nb::arg("s_q"), nb::arg("h_q"), nb::arg("h_kv"), nb::arg("d"), nb::arg("causal"),
      nb::arg("window"), nb::arg("cache_seqlens"), nb::arg("workspace"), nb::arg("stream") = 0,
      "Computes the GQA split-KV schedule on the device into `workspace` (on `stream`, a cudaStream_t as int).");

  m.def(
      "gqa_decode_reference",
      [](Array q, Array k_cache, OptArray k_scale, Array v_cache, OptArray v_scale, Array block_table,
         Array cache_seqlens, OptArray k_new, OptArray v_new, const std::string& rope_style, double rope_theta,
         int rotary_dim, OptArray alibi_slopes, OptArray finished, MutArray out, OptArray lse,
         std::optional<float> softmax_scale, bool causal, int window, float softcap) {
        const DecodeInputs in{q,           k_cache,  k_scale,      v_cache,    v_scale,    block_table, cache_seqlens,
                              k_new,       v_new,    rope_style,   rope_theta, rotary_dim, alibi_slopes, finished,
                              out,         lse,      softmax_scale, causal,    window,     softcap};
        const GqaDecodeArgs args = in.args();
        raise_if_error(released([&] { return reference::gqa_decode(args); }));
      },
      MLAKIT_GQA_DECODE_ARGS,
      "GQA decode on host arrays (float64 CPU reference): appends k_new / v_new into the host caches, writes out "
      "and lse.");

  m.def(
      "gqa_decode",
      [](Array q, Array k_cache, OptArray k_scale, Array v_cache, OptArray v_scale, Array block_table,
         Array cache_seqlens, OptArray k_new, OptArray v_new, const std::string& rope_style, double rope_theta,
         int rotary_dim, OptArray alibi_slopes, OptArray finished, MutArray out, OptArray lse,
         std::optional<float> softmax_scale, bool causal, int window, float softcap, const GqaDecodePlan& plan,
         uintptr_t stream) {
        const DecodeInputs in{q,           k_cache,  k_scale,      v_cache,    v_scale,    block_table, cache_seqlens,
                              k_new,       v_new,    rope_style,   rope_theta, rotary_dim, alibi_slopes, finished,
                              out,         lse,      softmax_scale, causal,    window,     softcap};
        raise_if_error(gqa_decode(in.args(), plan, to_stream(stream)));
      },
      MLAKIT_GQA_DECODE_ARGS, nb::arg("plan"), nb::arg("stream") = 0,
      "GQA decode of one layer on the device (append + attention, asynchronous on `stream`).");

  // The cache tools.
  const char* quantize_doc =
      "src [num_blocks, page_size, h_kv, d] bfloat16 | float16 -> dst_values (int8, or float8 e4m3 / its uint8 "
      "bytes) with dst_scale: [num_blocks, page_size, h_kv] float32 (written) or [1] float32 (fp8, read).";
  m.def(
      "quantize_gqa_cache",
      [](Array src, MutArray dst_values, Array dst_scale, uintptr_t stream) {
        raise_if_error(quantize_gqa_cache(
            to_ref(src, "src"), GqaPagedCache{cache_ref(dst_values, "values"), to_ref(dst_scale, "scale")},
            to_stream(stream)));
      },
      nb::arg("src"), nb::arg("dst_values"), nb::arg("dst_scale"), nb::arg("stream") = 0, quantize_doc);
  m.def(
      "quantize_gqa_cache_reference",
      [](Array src, MutArray dst_values, Array dst_scale) {
        const TensorRef s = to_ref(src, "src");
        const GqaPagedCache dst{cache_ref(dst_values, "values"), to_ref(dst_scale, "scale")};
        raise_if_error(released([&] { return reference::quantize_gqa_cache(s, dst); }));
      },
      nb::arg("src"), nb::arg("dst_values"), nb::arg("dst_scale"), quantize_doc);

  const char* dequantize_doc =
      "src_values (int8, float8 e4m3 / its uint8 bytes) with src_scale -> dst [num_blocks, page_size, h_kv, d] "
      "bfloat16 | float16 (stored * scale, rounded once).";
  m.def(
      "dequantize_gqa_cache",
      [](Array src_values, Array src_scale, MutArray dst, uintptr_t stream) {
        raise_if_error(dequantize_gqa_cache(
            GqaPagedCache{cache_ref(src_values, "values"), to_ref(src_scale, "scale")}, to_ref(dst, "dst"),
            to_stream(stream)));
      },
      nb::arg("src_values"), nb::arg("src_scale"), nb::arg("dst"), nb::arg("stream") = 0, dequantize_doc);
  m.def(
      "dequantize_gqa_cache_reference",
      [](Array src_values, Array src_scale, MutArray dst) {
        const GqaPagedCache s{cache_ref(src_values, "values"), to_ref(src_scale, "scale")};
        const TensorRef d = to_ref(dst, "dst");
        raise_if_error(released([&] { return reference::dequantize_gqa_cache(s, d); }));
      },
      nb::arg("src_values"), nb::arg("src_scale"), nb::arg("dst"), dequantize_doc);

  const char* append_doc =
      "Writes k_new / v_new [b, s_q, h_kv, d] at positions [L - s_q, L) of each entry's pages (k rotated), in the "
      "caches' format (per-token scales written).";
  m.def(
      "gqa_cache_append",
      [](Array k_new, Array v_new, Array k_cache, OptArray k_scale, Array v_cache, OptArray v_scale,
         Array block_table, Array cache_seqlens, const std::string& rope_style, double rope_theta, int rotary_dim,
         OptArray finished, uintptr_t stream) {
        raise_if_error(gqa_cache_append(append_args(k_new, v_new, k_cache, k_scale, v_cache, v_scale, block_table,
                                                    cache_seqlens, rope_style, rope_theta, rotary_dim, finished),
                                        to_stream(stream)));
      },
      MLAKIT_GQA_APPEND_ARGS, nb::arg("stream") = 0, append_doc);
  m.def(
      "gqa_cache_append_reference",
      [](Array k_new, Array v_new, Array k_cache, OptArray k_scale, Array v_cache, OptArray v_scale,
         Array block_table, Array cache_seqlens, const std::string& rope_style, double rope_theta, int rotary_dim,
         OptArray finished) {
        const GqaCacheAppendArgs args = append_args(k_new, v_new, k_cache, k_scale, v_cache, v_scale, block_table,
                                                    cache_seqlens, rope_style, rope_theta, rotary_dim, finished);
        raise_if_error(released([&] { return reference::gqa_cache_append(args); }));
      },
      MLAKIT_GQA_APPEND_ARGS, append_doc);
}

#undef MLAKIT_GQA_DECODE_ARGS
#undef MLAKIT_GQA_APPEND_ARGS

}  // namespace mlakit::python
