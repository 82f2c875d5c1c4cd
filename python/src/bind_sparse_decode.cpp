// Token-sparse MLA decode over the FP8 cache (docs/contract.md): workspace query, plan,
// decode, CPU reference.
#include <nanobind/stl/optional.h>

#include "arrays.h"
#include "bindings.h"
#include "mlakit/mla_sparse_decode.h"

namespace mlakit::python {
namespace {

MlaSparseDecodeArgs sparse_decode_args(const Array& q, const Array& kv_cache, const Array& indices,
                                       const std::optional<Array>& topk_length, const std::optional<Array>& attn_sink,
                                       const MutArray& out, const MutArray& lse, std::optional<float> softmax_scale) {
  MlaSparseDecodeArgs a;
  a.q = to_ref(q, "q");
  a.kv_cache = to_ref(kv_cache, "kv_cache");
  a.indices = to_ref(indices, "indices");
  a.topk_length = to_ref(topk_length, "topk_length");
  a.attn_sink = to_ref(attn_sink, "attn_sink");
  a.out = to_ref(out, "out");
  a.lse = to_ref(lse, "lse");
  a.softmax_scale = softmax_scale;  // None: 1 / sqrt(576)
  return a;
}

MlaSparseDecodeProblem sparse_problem(int64_t b, int s_q, int h_q, int topk) {
  return MlaSparseDecodeProblem{.b = b, .s_q = s_q, .h_q = h_q, .topk = topk};
}

}  // namespace

void bind_sparse_decode(nb::module_& m) {
  m.def(
      "mla_sparse_decode_reference",
      [](Array q, Array kv_cache, Array indices, std::optional<Array> topk_length, std::optional<Array> attn_sink,
         MutArray out, MutArray lse, std::optional<float> softmax_scale) {
        raise_if_error(reference::mla_sparse_decode_fp8(
            sparse_decode_args(q, kv_cache, indices, topk_length, attn_sink, out, lse, softmax_scale)));
      },
      nb::arg("q"), nb::arg("kv_cache"), nb::arg("indices"), nb::arg("topk_length").none(),
      nb::arg("attn_sink").none(), nb::arg("out"), nb::arg("lse"), nb::arg("softmax_scale").none() = nb::none(),
      nb::call_guard<nb::gil_scoped_release>(),
      "Sparse FP8 MLA decode on host arrays (float64 CPU reference); writes out and lse.");

  m.def(
      "mla_sparse_decode_workspace_size",
      [](int64_t b, int s_q, int h_q, int topk) {
        std::size_t bytes = 0;
        raise_if_error(mla_sparse_decode_workspace_size(sparse_problem(b, s_q, h_q, topk), &bytes));
        return bytes;
      },
      nb::arg("b"), nb::arg("s_q"), nb::arg("h_q"), nb::arg("topk"),
      "Bytes of device workspace the sparse plan and decode need on the current device.");

  m.def(
      "mla_sparse_decode_plan",
      [](int64_t b, int s_q, int h_q, int topk, std::optional<Array> topk_length, MutArray workspace,
         uintptr_t stream) {
        MlaDecodePlan plan;
        raise_if_error(mla_sparse_decode_plan(sparse_problem(b, s_q, h_q, topk), to_ref(topk_length, "topk_length"),
                                              workspace.data(), workspace.nbytes(), to_stream(stream), &plan));
        return plan;
      },
      nb::arg("b"), nb::arg("s_q"), nb::arg("h_q"), nb::arg("topk"), nb::arg("topk_length").none(),
      nb::arg("workspace"), nb::arg("stream") = 0,
      "Computes the sparse decode's schedule (over topk or topk_length keys) on the device into `workspace`.");

  m.def(
      "mla_sparse_decode_fp8",
      [](Array q, Array kv_cache, Array indices, std::optional<Array> topk_length, std::optional<Array> attn_sink,
         MutArray out, MutArray lse, const MlaDecodePlan& plan, std::optional<float> softmax_scale,
         uintptr_t stream) {
        raise_if_error(mla_sparse_decode_fp8(
            sparse_decode_args(q, kv_cache, indices, topk_length, attn_sink, out, lse, softmax_scale), plan,
            to_stream(stream)));
      },
      nb::arg("q"), nb::arg("kv_cache"), nb::arg("indices"), nb::arg("topk_length").none(),
      nb::arg("attn_sink").none(), nb::arg("out"), nb::arg("lse"), nb::arg("plan"),
      nb::arg("softmax_scale").none() = nb::none(), nb::arg("stream") = 0,
      "Sparse FP8 MLA decode of one layer on the device (asynchronous on `stream`).");
}

}  // namespace mlakit::python
