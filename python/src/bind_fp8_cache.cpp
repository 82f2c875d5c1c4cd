// FP8-with-scale MLA cache tools (docs/contract.md): quantize, dequantize and paged append, on
// the device (asynchronous on a stream) and on host arrays (CPU version, bit-identical).
#include "arrays.h"
#include "bindings.h"
#include "mlakit/fp8_cache.h"

namespace mlakit::python {
namespace {

// Each tool takes (input, input, ..., output) TensorRefs; the device versions add a stream.
template <typename DeviceFn, typename HostFn>
void bind_pair(nb::module_& m, const char* name, const char* host_name, DeviceFn device_fn, HostFn host_fn,
               const char* doc) {
  m.def(name, device_fn, nb::arg("src"), nb::arg("dst"), nb::arg("stream") = 0, doc);
  m.def(host_name, host_fn, nb::arg("src"), nb::arg("dst"), nb::call_guard<nb::gil_scoped_release>(), doc);
}

}  // namespace

void bind_fp8_cache(nb::module_& m) {
  bind_pair(
      m, "quantize_mla_cache_fp8", "quantize_mla_cache_fp8_reference",
      [](Array src, MutArray dst, uintptr_t stream) {
        raise_if_error(quantize_mla_cache_fp8(to_ref(src, "src"), to_ref(dst, "dst"), to_stream(stream)));
      },
      [](Array src, MutArray dst) {
        raise_if_error(reference::quantize_mla_cache_fp8(to_ref(src, "src"), to_ref(dst, "dst")));
      },
      "src [..., 576] bfloat16 -> dst [..., 656] uint8 (FP8-with-scale rows).");
  bind_pair(
      m, "dequantize_mla_cache_fp8", "dequantize_mla_cache_fp8_reference",
      [](Array src, MutArray dst, uintptr_t stream) {
        raise_if_error(dequantize_mla_cache_fp8(to_ref(src, "src"), to_ref(dst, "dst"), to_stream(stream)));
      },
      [](Array src, MutArray dst) {
        raise_if_error(reference::dequantize_mla_cache_fp8(to_ref(src, "src"), to_ref(dst, "dst")));
      },
      "src [..., 656] uint8 (FP8-with-scale rows) -> dst [..., 576] bfloat16.");

  const char* append_doc = "Writes tokens [n, 576] bfloat16 into the FP8 paged cache at slots [n] int32.";
  m.def(
      "append_mla_cache_fp8",
      [](Array tokens, Array slots, MutArray cache, uintptr_t stream) {
        raise_if_error(append_mla_cache_fp8(to_ref(tokens, "tokens"), to_ref(slots, "slots"), to_ref(cache, "cache"),
                                            to_stream(stream)));
      },
      nb::arg("tokens"), nb::arg("slots"), nb::arg("cache"), nb::arg("stream") = 0, append_doc);
  m.def(
      "append_mla_cache_fp8_reference",
      [](Array tokens, Array slots, MutArray cache) {
        raise_if_error(reference::append_mla_cache_fp8(to_ref(tokens, "tokens"), to_ref(slots, "slots"),
                                                       to_ref(cache, "cache")));
      },
      nb::arg("tokens"), nb::arg("slots"), nb::arg("cache"), nb::call_guard<nb::gil_scoped_release>(), append_doc);
}

}  // namespace mlakit::python
