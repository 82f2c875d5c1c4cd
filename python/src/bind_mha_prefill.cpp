// Dense MHA prefill forward (include/mlakit/mha_prefill.h): the CPU reference. (The GPU
// kernels are issue 26's next step.)
#include <nanobind/stl/optional.h>

#include "arrays.h"
#include "bindings.h"
#include "mlakit/mha_prefill.h"

namespace mlakit::python {

void bind_mha_prefill(nb::module_& m) {
  m.def(
      "mha_prefill_reference",
      [](Array q, Array k, Array v, Array cu_seqlens_q, Array cu_seqlens_k, int max_seqlen_q, int max_seqlen_k,
         MutArray out, std::optional<MutArray> lse, std::optional<float> softmax_scale, bool causal) {
        MhaPrefillArgs a;
        a.q = to_ref(q, "q");
        a.k = to_ref(k, "k");
        a.v = to_ref(v, "v");
        a.cu_seqlens_q = to_ref(cu_seqlens_q, "cu_seqlens_q");
        a.cu_seqlens_k = to_ref(cu_seqlens_k, "cu_seqlens_k");
        a.max_seqlen_q = max_seqlen_q;
        a.max_seqlen_k = max_seqlen_k;
        a.out = to_ref(out, "out");
        if (lse) a.lse = to_ref(*lse, "lse");
        a.softmax_scale = softmax_scale;  // None: 1 / sqrt(d_qk)
        a.causal = causal;
        nb::gil_scoped_release release;
        raise_if_error(reference::mha_prefill(a));
      },
      nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("cu_seqlens_q"), nb::arg("cu_seqlens_k"),
      nb::arg("max_seqlen_q"), nb::arg("max_seqlen_k"), nb::arg("out"), nb::arg("lse").none(),
      nb::arg("softmax_scale").none() = nb::none(), nb::arg("causal") = false,
      "Dense MHA prefill forward on host arrays (float64 CPU reference); writes out and lse.");
}

}  // namespace mlakit::python
