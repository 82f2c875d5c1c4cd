// Dense MHA prefill forward and backward (include/mlakit/mha_prefill.h): for each, the
// workspace query and the GPU entry (asynchronous on the caller's stream, workspace allocated
// by the caller's framework), and the CPU reference.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <string>

#include "arrays.h"
#include "bindings.h"
#include "mlakit/mha_prefill.h"

namespace mlakit::python {
namespace {

MlaKernel kernel_from(const char* op, const std::string& name) {
  if (name == "auto") return MlaKernel::kAuto;
  if (name == "portable") return MlaKernel::kPortable;
  if (name == "sm90") return MlaKernel::kSm90;
  const std::string message = std::string(op) + ": kernel: expected 'auto', 'portable' or 'sm90', got '" + name + "'";
  throw nb::value_error(message.c_str());
}

// Everything of one forward call but the workspace and the stream, in the order of the Python signature.
MhaPrefillArgs prefill_args(const Array& q, const Array& k, const Array& v, const Array& cu_seqlens_q,
                            const Array& cu_seqlens_k, int max_seqlen_q, int max_seqlen_k, const MutArray& out,
                            const std::optional<MutArray>& lse, std::optional<float> softmax_scale, bool causal,
                            const std::string& kernel) {
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
  a.kernel = kernel_from("mha_prefill", kernel);
  return a;
}

// The backward's arguments but the workspace and the stream, in the order of the Python signature.
MhaPrefillBackwardArgs backward_args(const Array& dout, const Array& q, const Array& k, const Array& v,
                                     const Array& out, const std::optional<Array>& lse, const Array& cu_seqlens_q,
                                     const Array& cu_seqlens_k, int max_seqlen_q, int max_seqlen_k, const MutArray& dq,
                                     const MutArray& dk, const MutArray& dv, std::optional<float> softmax_scale,
                                     bool causal, bool deterministic, const std::string& kernel) {
  MhaPrefillBackwardArgs a;
  a.dout = to_ref(dout, "dout");
  a.q = to_ref(q, "q");
  a.k = to_ref(k, "k");
  a.v = to_ref(v, "v");
  a.out = to_ref(out, "out");
  a.lse = to_ref(lse, "lse");  // None: the library's error names it (the backward needs it)
  a.cu_seqlens_q = to_ref(cu_seqlens_q, "cu_seqlens_q");
  a.cu_seqlens_k = to_ref(cu_seqlens_k, "cu_seqlens_k");
  a.max_seqlen_q = max_seqlen_q;
  a.max_seqlen_k = max_seqlen_k;
  a.dq = to_ref(dq, "dq");
  a.dk = to_ref(dk, "dk");
  a.dv = to_ref(dv, "dv");
  a.softmax_scale = softmax_scale;  // None: 1 / sqrt(d_qk)
  a.causal = causal;
  a.deterministic = deterministic;
  a.kernel = kernel_from("mha_prefill_backward", kernel);
  return a;
}

// The arguments every forward binding below takes first.
#define MLAKIT_MHA_PREFILL_ARGS                                                                                   \
  nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("cu_seqlens_q"), nb::arg("cu_seqlens_k"),                    \
      nb::arg("max_seqlen_q"), nb::arg("max_seqlen_k"), nb::arg("out"), nb::arg("lse").none(),                   \
      nb::arg("softmax_scale").none() = nb::none(), nb::arg("causal") = false

// The arrays every backward binding below takes first: the inputs, then the gradients it writes.
#define MLAKIT_MHA_PREFILL_BACKWARD_ARRAYS                                                                       \
  nb::arg("dout"), nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"), nb::arg("lse").none(),              \
      nb::arg("cu_seqlens_q"), nb::arg("cu_seqlens_k"), nb::arg("max_seqlen_q"), nb::arg("max_seqlen_k"),        \
      nb::arg("dq"), nb::arg("dk"), nb::arg("dv")

}  // namespace

void bind_mha_prefill(nb::module_& m) {
  m.def(
      "mha_prefill_reference",
      [](Array q, Array k, Array v, Array cu_seqlens_q, Array cu_seqlens_k, int max_seqlen_q, int max_seqlen_k,
         MutArray out, std::optional<MutArray> lse, std::optional<float> softmax_scale, bool causal) {
        const MhaPrefillArgs a = prefill_args(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, out,
                                              lse, softmax_scale, causal, "auto");
        nb::gil_scoped_release release;
        raise_if_error(reference::mha_prefill(a));
      },
      MLAKIT_MHA_PREFILL_ARGS,
      "Dense MHA prefill forward on host arrays (float64 CPU reference); writes out and lse.");

  m.def(
      "mha_prefill_workspace_size",
      [](Array q, Array k, Array v, Array cu_seqlens_q, Array cu_seqlens_k, int max_seqlen_q, int max_seqlen_k,
         MutArray out, std::optional<MutArray> lse, std::optional<float> softmax_scale, bool causal,
         const std::string& kernel) {
        std::size_t bytes = 0;
        raise_if_error(mha_prefill_workspace_size(prefill_args(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                                               max_seqlen_k, out, lse, softmax_scale, causal, kernel),
                                                  &bytes));
        return bytes;
      },
      MLAKIT_MHA_PREFILL_ARGS, nb::arg("kernel") = "auto",
      "Bytes of device workspace mha_prefill needs for these arguments (their shapes and options, not the "
      "lengths' values) on the current device.");

  m.def(
      "mha_prefill",
      [](Array q, Array k, Array v, Array cu_seqlens_q, Array cu_seqlens_k, int max_seqlen_q, int max_seqlen_k,
         MutArray out, std::optional<MutArray> lse, std::optional<MutArray> workspace,
         std::optional<float> softmax_scale, bool causal, const std::string& kernel, uintptr_t stream) {
        const MhaPrefillArgs a = prefill_args(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, out,
                                              lse, softmax_scale, causal, kernel);
        void* ws = workspace ? workspace->data() : nullptr;
        const std::size_t ws_bytes = workspace ? workspace->nbytes() : 0;
        raise_if_error(mha_prefill(a, ws, ws_bytes, to_stream(stream)));
      },
      nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("cu_seqlens_q"), nb::arg("cu_seqlens_k"),
      nb::arg("max_seqlen_q"), nb::arg("max_seqlen_k"), nb::arg("out"), nb::arg("lse").none(),
      nb::arg("workspace").none(), nb::arg("softmax_scale").none() = nb::none(), nb::arg("causal") = false,
      nb::arg("kernel") = "auto", nb::arg("stream") = 0,
      "Dense MHA prefill forward on the device (asynchronous on `stream`, a cudaStream_t as int); writes out and "
      "lse. `workspace`: mha_prefill_workspace_size bytes of device memory (None when that is 0).");

  m.def(
      "mha_prefill_backward_reference",
      [](Array dout, Array q, Array k, Array v, Array out, std::optional<Array> lse, Array cu_seqlens_q,
         Array cu_seqlens_k, int max_seqlen_q, int max_seqlen_k, MutArray dq, MutArray dk, MutArray dv,
         std::optional<float> softmax_scale, bool causal) {
        const MhaPrefillBackwardArgs a = backward_args(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k,
                                                       max_seqlen_q, max_seqlen_k, dq, dk, dv, softmax_scale, causal,
                                                       /*deterministic=*/false, "auto");
        nb::gil_scoped_release release;
        raise_if_error(reference::mha_prefill_backward(a));
      },
      MLAKIT_MHA_PREFILL_BACKWARD_ARRAYS, nb::arg("softmax_scale").none() = nb::none(), nb::arg("causal") = false,
      "Dense MHA prefill backward on host arrays (float64 CPU reference, deterministic); writes dq, dk and dv.");

  m.def(
      "mha_prefill_backward_workspace_size",
      [](Array dout, Array q, Array k, Array v, Array out, std::optional<Array> lse, Array cu_seqlens_q,
         Array cu_seqlens_k, int max_seqlen_q, int max_seqlen_k, MutArray dq, MutArray dk, MutArray dv,
         std::optional<float> softmax_scale, bool causal, bool deterministic, const std::string& kernel) {
        std::size_t bytes = 0;
        raise_if_error(mha_prefill_backward_workspace_size(
            backward_args(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dq, dk,
                          dv, softmax_scale, causal, deterministic, kernel),
            &bytes));
        return bytes;
      },
      MLAKIT_MHA_PREFILL_BACKWARD_ARRAYS, nb::arg("softmax_scale").none() = nb::none(), nb::arg("causal") = false,
      nb::arg("deterministic") = false, nb::arg("kernel") = "auto",
      "Bytes of device workspace mha_prefill_backward needs for these arguments (their shapes and options, not "
      "the lengths' values).");

  m.def(
      "mha_prefill_backward",
      [](Array dout, Array q, Array k, Array v, Array out, std::optional<Array> lse, Array cu_seqlens_q,
         Array cu_seqlens_k, int max_seqlen_q, int max_seqlen_k, MutArray dq, MutArray dk, MutArray dv,
         std::optional<MutArray> workspace, std::optional<float> softmax_scale, bool causal, bool deterministic,
         const std::string& kernel, uintptr_t stream) {
        const MhaPrefillBackwardArgs a = backward_args(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k,
                                                       max_seqlen_q, max_seqlen_k, dq, dk, dv, softmax_scale, causal,
                                                       deterministic, kernel);
        void* ws = workspace ? workspace->data() : nullptr;
        const std::size_t ws_bytes = workspace ? workspace->nbytes() : 0;
        raise_if_error(mha_prefill_backward(a, ws, ws_bytes, to_stream(stream)));
      },
      MLAKIT_MHA_PREFILL_BACKWARD_ARRAYS, nb::arg("workspace").none(), nb::arg("softmax_scale").none() = nb::none(),
      nb::arg("causal") = false, nb::arg("deterministic") = false, nb::arg("kernel") = "auto", nb::arg("stream") = 0,
      "Dense MHA prefill backward on the device (asynchronous on `stream`, a cudaStream_t as int); writes dq, dk "
      "and dv. `workspace`: mha_prefill_backward_workspace_size bytes of device memory (None when that is 0).");
}

#undef MLAKIT_MHA_PREFILL_BACKWARD_ARRAYS
#undef MLAKIT_MHA_PREFILL_ARGS

}  // namespace mlakit::python
