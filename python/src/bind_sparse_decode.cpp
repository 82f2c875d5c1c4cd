// Token-sparse MLA decode over an FP8 cache (docs/contract.md): workspace query, plan, decode,
// CPU reference. DeepSeek V3.2 tokens (q d_qk 576, 656-byte cache) or DeepSeek V4 tokens (q
// d_qk 512, 584-byte cache), optionally with a second cache (extra_kv_cache, extra_indices,
// extra_topk_length) attended under the same softmax.
#include <nanobind/stl/optional.h>

#include "arrays.h"
#include "bindings.h"
#include "mlakit/mla_sparse_decode.h"

namespace mlakit::python {
namespace {

// The optional arrays of a call, after the required ones.
struct SparseOptions {
  std::optional<Array> topk_length, attn_sink, extra_kv_cache, extra_indices, extra_topk_length;
};

MlaSparseDecodeArgs sparse_decode_args(const Array& q, const Array& kv_cache, const Array& indices,
                                       const SparseOptions& o, const MutArray& out, const MutArray& lse,
                                       std::optional<float> softmax_scale) {
  MlaSparseDecodeArgs a;
  a.q = to_ref(q, "q");
  a.kv_cache = to_ref(kv_cache, "kv_cache");
  a.indices = to_ref(indices, "indices");
  a.topk_length = to_ref(o.topk_length, "topk_length");
  a.extra_kv_cache = to_ref(o.extra_kv_cache, "extra_kv_cache");
  a.extra_indices = to_ref(o.extra_indices, "extra_indices");
  a.extra_topk_length = to_ref(o.extra_topk_length, "extra_topk_length");
  a.attn_sink = to_ref(o.attn_sink, "attn_sink");
  a.out = to_ref(out, "out");
  a.lse = to_ref(lse, "lse");
  a.softmax_scale = softmax_scale;  // None: 1 / sqrt(d_qk)
  return a;
}

MlaSparseDecodeProblem sparse_problem(int64_t b, int s_q, int h_q, int topk, int extra_topk) {
  return MlaSparseDecodeProblem{.b = b, .s_q = s_q, .h_q = h_q, .topk = topk, .extra_topk = extra_topk};
}

}  // namespace

void bind_sparse_decode(nb::module_& m) {
  m.def(
      "mla_sparse_decode_reference",
      [](Array q, Array kv_cache, Array indices, std::optional<Array> topk_length, std::optional<Array> attn_sink,
         MutArray out, MutArray lse, std::optional<float> softmax_scale, std::optional<Array> extra_kv_cache,
         std::optional<Array> extra_indices, std::optional<Array> extra_topk_length) {
        const SparseOptions o{topk_length, attn_sink, extra_kv_cache, extra_indices, extra_topk_length};
        raise_if_error(reference::mla_sparse_decode_fp8(sparse_decode_args(q, kv_cache, indices, o, out, lse,
                                                                           softmax_scale)));
      },
      nb::arg("q"), nb::arg("kv_cache"), nb::arg("indices"), nb::arg("topk_length").none(),
      nb::arg("attn_sink").none(), nb::arg("out"), nb::arg("lse"), nb::arg("softmax_scale").none() = nb::none(),
      nb::arg("extra_kv_cache").none() = nb::none(), nb::arg("extra_indices").none() = nb::none(),
      nb::arg("extra_topk_length").none() = nb::none(), nb::call_guard<nb::gil_scoped_release>(),
      "Sparse FP8 MLA decode on host arrays (float64 CPU reference), over kv_cache and the optional second "
      "cache under one softmax; writes out and lse.");

  m.def(
      "mla_sparse_decode_workspace_size",
      [](int64_t b, int s_q, int h_q, int topk, int extra_topk) {
        std::size_t bytes = 0;
        raise_if_error(mla_sparse_decode_workspace_size(sparse_problem(b, s_q, h_q, topk, extra_topk), &bytes));
        return bytes;
      },
      nb::arg("b"), nb::arg("s_q"), nb::arg("h_q"), nb::arg("topk"), nb::arg("extra_topk") = 0,
      "Bytes of device workspace the sparse plan and decode need on the current device.");

  m.def(
      "mla_sparse_decode_plan",
      [](int64_t b, int s_q, int h_q, int topk, std::optional<Array> topk_length, MutArray workspace,
         uintptr_t stream, int extra_topk, std::optional<Array> extra_topk_length) {
        MlaDecodePlan plan;
        raise_if_error(mla_sparse_decode_plan(sparse_problem(b, s_q, h_q, topk, extra_topk),
                                              to_ref(topk_length, "topk_length"),
                                              to_ref(extra_topk_length, "extra_topk_length"), workspace.data(),
                                              workspace.nbytes(), to_stream(stream), &plan));
        return plan;
      },
      nb::arg("b"), nb::arg("s_q"), nb::arg("h_q"), nb::arg("topk"), nb::arg("topk_length").none(),
      nb::arg("workspace"), nb::arg("stream") = 0, nb::arg("extra_topk") = 0,
      nb::arg("extra_topk_length").none() = nb::none(),
      "Computes the sparse decode's schedule (over topk or topk_length keys, plus extra_topk or "
      "extra_topk_length keys of a second cache) on the device into `workspace`.");

  m.def(
      "mla_sparse_decode_host_plan",
      [](int64_t b, int s_q, int h_q, int topk, bool has_topk_length, int extra_topk, bool has_extra_topk_length) {
        // The device plan's problem (one scheduled sequence per batch entry and query token)
        // and index lists, without a schedule: the CPU reference needs none.
        MlaDecodePlan plan;
        plan.problem = MlaDecodeProblem{.b = b * s_q, .s_q = 1, .h_q = h_q, .h_kv = 1};
        plan.sparse_topk = topk;
        plan.sparse_topk_length = has_topk_length;
        plan.sparse_extra_topk = extra_topk;
        plan.sparse_extra_topk_length = has_extra_topk_length;
        return plan;
      },
      nb::arg("b"), nb::arg("s_q"), nb::arg("h_q"), nb::arg("topk"), nb::arg("has_topk_length") = false,
      nb::arg("extra_topk") = 0, nb::arg("has_extra_topk_length") = false,
      "The sparse plan of host arrays: the problem and index lists alone (no workspace).");

  m.def(
      "mla_sparse_decode_plan_lists",
      [](const MlaDecodePlan& plan) {
        nb::dict d;
        d["topk"] = plan.sparse_topk;
        d["topk_length"] = plan.sparse_topk_length;
        d["extra_topk"] = plan.sparse_extra_topk;
        d["extra_topk_length"] = plan.sparse_extra_topk_length;
        return d;
      },
      nb::arg("plan"),
      "The index lists a sparse plan was made for: {'topk', 'topk_length' (given or not), 'extra_topk', "
      "'extra_topk_length' (given or not)}; topk 0: a dense plan.");

  m.def(
      "mla_sparse_decode_fp8",
      [](Array q, Array kv_cache, Array indices, std::optional<Array> topk_length, std::optional<Array> attn_sink,
         MutArray out, MutArray lse, const MlaDecodePlan& plan, std::optional<float> softmax_scale,
         uintptr_t stream, std::optional<Array> extra_kv_cache, std::optional<Array> extra_indices,
         std::optional<Array> extra_topk_length) {
        const SparseOptions o{topk_length, attn_sink, extra_kv_cache, extra_indices, extra_topk_length};
        raise_if_error(mla_sparse_decode_fp8(sparse_decode_args(q, kv_cache, indices, o, out, lse, softmax_scale),
                                             plan, to_stream(stream)));
      },
      nb::arg("q"), nb::arg("kv_cache"), nb::arg("indices"), nb::arg("topk_length").none(),
      nb::arg("attn_sink").none(), nb::arg("out"), nb::arg("lse"), nb::arg("plan"),
      nb::arg("softmax_scale").none() = nb::none(), nb::arg("stream") = 0,
      nb::arg("extra_kv_cache").none() = nb::none(), nb::arg("extra_indices").none() = nb::none(),
      nb::arg("extra_topk_length").none() = nb::none(),
      "Sparse FP8 MLA decode of one layer on the device (asynchronous on `stream`), over kv_cache and the "
      "optional second cache under one softmax.");
}

}  // namespace mlakit::python
