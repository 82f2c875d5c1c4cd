// Token-sparse MLA prefill (docs/contract.md): the GPU kernel (no workspace, no plan) and the
// CPU reference.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <string>

#include "arrays.h"
#include "bindings.h"
#include "mlakit/mla_sparse_prefill.h"

namespace mlakit::python {
namespace {

MlaSparsePrefillArgs prefill_args(const Array& q, const Array& kv, const Array& indices,
                                  const std::optional<Array>& topk_length, const std::optional<Array>& attn_sink,
                                  const MutArray& out, const MutArray& max_logits, const MutArray& lse,
                                  std::optional<float> sm_scale, int d_v, const std::string& lse_base) {
  MlaSparsePrefillArgs a;
  a.q = to_ref(q, "q");
  a.kv = to_ref(kv, "kv");
  a.indices = to_ref(indices, "indices");
  a.topk_length = to_ref(topk_length, "topk_length");
  a.attn_sink = to_ref(attn_sink, "attn_sink");
  a.out = to_ref(out, "out");
  a.max_logits = to_ref(max_logits, "max_logits");
  a.lse = to_ref(lse, "lse");
  a.sm_scale = sm_scale;  // None: 1 / sqrt(d_qk)
  a.d_v = d_v;
  a.lse_base = lse_base_from("mla_sparse_prefill", "lse_base", lse_base);
  return a;
}

}  // namespace

void bind_sparse_prefill(nb::module_& m) {
  m.def(
      "mla_sparse_prefill_reference",
      [](Array q, Array kv, Array indices, std::optional<Array> topk_length, std::optional<Array> attn_sink,
         MutArray out, MutArray max_logits, MutArray lse, std::optional<float> sm_scale, int d_v,
         const std::string& lse_base) {
        const MlaSparsePrefillArgs a =
            prefill_args(q, kv, indices, topk_length, attn_sink, out, max_logits, lse, sm_scale, d_v, lse_base);
        nb::gil_scoped_release release;
        raise_if_error(reference::mla_sparse_prefill(a));
      },
      nb::arg("q"), nb::arg("kv"), nb::arg("indices"), nb::arg("topk_length").none(), nb::arg("attn_sink").none(),
      nb::arg("out"), nb::arg("max_logits"), nb::arg("lse"), nb::arg("sm_scale").none() = nb::none(),
      nb::arg("d_v") = 512, nb::arg("lse_base") = "2",
      "Sparse MLA prefill on host arrays (float64 CPU reference); writes out, max_logits and lse.");

  m.def(
      "mla_sparse_prefill",
      [](Array q, Array kv, Array indices, std::optional<Array> topk_length, std::optional<Array> attn_sink,
         MutArray out, MutArray max_logits, MutArray lse, std::optional<float> sm_scale, int d_v,
         const std::string& lse_base, uintptr_t stream) {
        raise_if_error(mla_sparse_prefill(
            prefill_args(q, kv, indices, topk_length, attn_sink, out, max_logits, lse, sm_scale, d_v, lse_base),
            to_stream(stream)));
      },
      nb::arg("q"), nb::arg("kv"), nb::arg("indices"), nb::arg("topk_length").none(), nb::arg("attn_sink").none(),
      nb::arg("out"), nb::arg("max_logits"), nb::arg("lse"), nb::arg("sm_scale").none() = nb::none(),
      nb::arg("d_v") = 512, nb::arg("lse_base") = "2", nb::arg("stream") = 0,
      "Sparse MLA prefill on the device (asynchronous on `stream`); writes out, max_logits and lse.");
}

}  // namespace mlakit::python
