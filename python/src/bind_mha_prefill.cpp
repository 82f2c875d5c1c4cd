// Dense MHA prefill forward and backward (include/mlakit/mha_prefill.h): for each, the
// workspace query and the GPU entry (asynchronous on the caller's stream, workspace allocated
// by the caller's framework), and the CPU reference. Both operations bind the same three
// entries (bind_entries); what differs, their arguments and C++ functions, is in Forward and
// Backward.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <string>
#include <tuple>

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

// The forward: its inputs (everything before the workspace, in the order of the Python
// signature), its device options (after softmax_scale and causal), its C++ entries.
struct Forward {
  using Args = MhaPrefillArgs;
  static constexpr const char* kName = "mha_prefill";
  static constexpr const char* kReferenceDoc =
      "Dense MHA prefill forward on host arrays (float64 CPU reference); writes out and lse.";
  static constexpr const char* kWorkspaceDoc =
      "Bytes of device workspace mha_prefill needs for these arguments (their shapes and options, not the "
      "lengths' values) on the current device.";
  static constexpr const char* kDeviceDoc =
      "Dense MHA prefill forward on the device (asynchronous on `stream`, a cudaStream_t as int); writes out and "
      "lse. `workspace`: mha_prefill_workspace_size bytes of device memory (None when that is 0).";

  static void set_inputs(Args& a, Array q, Array k, Array v, Array cu_seqlens_q, Array cu_seqlens_k,
                         int max_seqlen_q, int max_seqlen_k, MutArray out, std::optional<MutArray> lse) {
    a.q = to_ref(q, "q");
    a.k = to_ref(k, "k");
    a.v = to_ref(v, "v");
    a.cu_seqlens_q = to_ref(cu_seqlens_q, "cu_seqlens_q");
    a.cu_seqlens_k = to_ref(cu_seqlens_k, "cu_seqlens_k");
    a.max_seqlen_q = max_seqlen_q;
    a.max_seqlen_k = max_seqlen_k;
    a.out = to_ref(out, "out");
    if (lse) a.lse = to_ref(*lse, "lse");
  }
  static auto input_names() {
    return std::make_tuple(nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("cu_seqlens_q"), nb::arg("cu_seqlens_k"),
                           nb::arg("max_seqlen_q"), nb::arg("max_seqlen_k"), nb::arg("out"), nb::arg("lse").none());
  }
  static void set_options(Args& a, const std::string& kernel) { a.kernel = kernel_from(kName, kernel); }
  static auto option_names() { return std::make_tuple(nb::arg("kernel") = "auto"); }

  static Status on_host(const Args& a) { return reference::mha_prefill(a); }
  static Status workspace_size(const Args& a, std::size_t* bytes) { return mha_prefill_workspace_size(a, bytes); }
  static Status on_device(const Args& a, void* ws, std::size_t ws_bytes, cudaStream_t stream) {
    return mha_prefill(a, ws, ws_bytes, stream);
  }
};

// The backward, as Forward.
struct Backward {
  using Args = MhaPrefillBackwardArgs;
  static constexpr const char* kName = "mha_prefill_backward";
  static constexpr const char* kReferenceDoc =
      "Dense MHA prefill backward on host arrays (float64 CPU reference, deterministic); writes dq, dk and dv.";
  static constexpr const char* kWorkspaceDoc =
      "Bytes of device workspace mha_prefill_backward needs for these arguments (their shapes and options, not "
      "the lengths' values).";
  static constexpr const char* kDeviceDoc =
      "Dense MHA prefill backward on the device (asynchronous on `stream`, a cudaStream_t as int); writes dq, dk "
      "and dv. `workspace`: mha_prefill_backward_workspace_size bytes of device memory (None when that is 0).";

  // The inputs, then the gradients it writes.
  static void set_inputs(Args& a, Array dout, Array q, Array k, Array v, Array out, std::optional<Array> lse,
                         Array cu_seqlens_q, Array cu_seqlens_k, int max_seqlen_q, int max_seqlen_k, MutArray dq,
                         MutArray dk, MutArray dv) {
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
  }
  static auto input_names() {
    return std::make_tuple(nb::arg("dout"), nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"),
                           nb::arg("lse").none(), nb::arg("cu_seqlens_q"), nb::arg("cu_seqlens_k"),
                           nb::arg("max_seqlen_q"), nb::arg("max_seqlen_k"), nb::arg("dq"), nb::arg("dk"),
                           nb::arg("dv"));
  }
  static void set_options(Args& a, bool deterministic, const std::string& kernel) {
    a.deterministic = deterministic;
    a.kernel = kernel_from(kName, kernel);
  }
  static auto option_names() {
    return std::make_tuple(nb::arg("deterministic") = false, nb::arg("kernel") = "auto");
  }

  static Status on_host(const Args& a) { return reference::mha_prefill_backward(a); }
  static Status workspace_size(const Args& a, std::size_t* bytes) {
    return mha_prefill_backward_workspace_size(a, bytes);
  }
  static Status on_device(const Args& a, void* ws, std::size_t ws_bytes, cudaStream_t stream) {
    return mha_prefill_backward(a, ws, ws_bytes, stream);
  }
};

// m.def of `fn` with the nb::arg annotations of the tuple `names`.
template <typename Fn, typename Names>
void def(nb::module_& m, const std::string& name, Fn fn, const Names& names, const char* doc) {
  std::apply([&](const auto&... arg) { m.def(name.c_str(), fn, arg..., doc); }, names);
}

// Op's three entries, as the Python layer calls them (python/mlakit/_mha_prefill.py, _call):
//   <name>_reference(inputs..., softmax_scale=None, causal=False)  the float64 CPU reference
//       on host arrays, without the GIL; the device options keep their defaults;
//   <name>_workspace_size(inputs..., softmax_scale, causal, options...)  bytes of device workspace;
//   <name>(inputs..., workspace, softmax_scale, causal, options..., stream=0)  the GPU kernels.
// Inputs and Options: the parameters of Op::set_inputs and Op::set_options, deduced from the
// two function pointers (which are not called here).
template <typename Op, typename... Inputs, typename... Options>
void bind_entries(nb::module_& m, void (*)(typename Op::Args&, Inputs...),
                  void (*)(typename Op::Args&, Options...)) {
  using Args = typename Op::Args;
  // The arguments of Op's C++ entries from the inputs and the softmax options, converted in the
  // order of the Python signature (the first conversion error is the one raised); the device
  // options are set after these, or keep their defaults.
  static const auto args_of = [](Inputs... inputs, std::optional<float> softmax_scale, bool causal) {
    Args a;
    Op::set_inputs(a, inputs...);
    a.softmax_scale = softmax_scale;  // None: 1 / sqrt(d_qk)
    a.causal = causal;
    return a;
  };
  const auto softmax = std::make_tuple(nb::arg("softmax_scale").none() = nb::none(), nb::arg("causal") = false);
  const std::string name = Op::kName;
  def(
      m, name + "_reference",
      [](Inputs... inputs, std::optional<float> softmax_scale, bool causal) {
        const Args a = args_of(inputs..., softmax_scale, causal);
        nb::gil_scoped_release release;
        raise_if_error(Op::on_host(a));
      },
      std::tuple_cat(Op::input_names(), softmax), Op::kReferenceDoc);
  def(
      m, name + "_workspace_size",
      [](Inputs... inputs, std::optional<float> softmax_scale, bool causal, Options... options) {
        Args a = args_of(inputs..., softmax_scale, causal);
        Op::set_options(a, options...);
        std::size_t bytes = 0;
        raise_if_error(Op::workspace_size(a, &bytes));
        return bytes;
      },
      std::tuple_cat(Op::input_names(), softmax, Op::option_names()), Op::kWorkspaceDoc);
  def(
      m, name,
      [](Inputs... inputs, std::optional<MutArray> workspace, std::optional<float> softmax_scale, bool causal,
         Options... options, uintptr_t stream) {
        Args a = args_of(inputs..., softmax_scale, causal);
        Op::set_options(a, options...);
        void* ws = workspace ? workspace->data() : nullptr;
        const std::size_t ws_bytes = workspace ? workspace->nbytes() : 0;
        raise_if_error(Op::on_device(a, ws, ws_bytes, to_stream(stream)));
      },
      std::tuple_cat(Op::input_names(), std::make_tuple(nb::arg("workspace").none()), softmax, Op::option_names(),
                     std::make_tuple(nb::arg("stream") = 0)),
      Op::kDeviceDoc);
}

}  // namespace

void bind_mha_prefill(nb::module_& m) {
  bind_entries<Forward>(m, &Forward::set_inputs, &Forward::set_options);
  bind_entries<Backward>(m, &Backward::set_inputs, &Backward::set_options);
}

}  // namespace mlakit::python
