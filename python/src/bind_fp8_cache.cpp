// FP8 MLA cache tools (docs/contract.md): quantize, dequantize and paged append of the V3.2
// (656-byte) and the V4 (584-byte) caches, on the device (asynchronous on a stream) and on host
// arrays (CPU version, bit-identical).
#include "arrays.h"
#include "bindings.h"
#include "mlakit/fp8_cache.h"

namespace mlakit::python {
namespace {

using DeviceConvert = Status (*)(const TensorRef&, const TensorRef&, cudaStream_t);
using HostConvert = Status (*)(const TensorRef&, const TensorRef&);
using DeviceAppend = Status (*)(const TensorRef&, const TensorRef&, const TensorRef&, cudaStream_t);
using HostAppend = Status (*)(const TensorRef&, const TensorRef&, const TensorRef&);

// `name`(src, dst, stream) on the device and `host_name`(src, dst) on host arrays.
void bind_convert(nb::module_& m, const char* name, const char* host_name, DeviceConvert device_fn,
                  HostConvert host_fn, const char* doc) {
  m.def(
      name,
      [device_fn](Array src, MutArray dst, uintptr_t stream) {
        raise_if_error(device_fn(to_ref(src, "src"), to_ref(dst, "dst"), to_stream(stream)));
      },
      nb::arg("src"), nb::arg("dst"), nb::arg("stream") = 0, doc);
  m.def(
      host_name,
      [host_fn](Array src, MutArray dst) { raise_if_error(host_fn(to_ref(src, "src"), to_ref(dst, "dst"))); },
      nb::arg("src"), nb::arg("dst"), nb::call_guard<nb::gil_scoped_release>(), doc);
}

// `name`(tokens, slots, cache, stream) on the device and `host_name`(tokens, slots, cache).
void bind_append(nb::module_& m, const char* name, const char* host_name, DeviceAppend device_fn, HostAppend host_fn,
                 const char* doc) {
  m.def(
      name,
      [device_fn](Array tokens, Array slots, MutArray cache, uintptr_t stream) {
        raise_if_error(
            device_fn(to_ref(tokens, "tokens"), to_ref(slots, "slots"), to_ref(cache, "cache"), to_stream(stream)));
      },
      nb::arg("tokens"), nb::arg("slots"), nb::arg("cache"), nb::arg("stream") = 0, doc);
  m.def(
      host_name,
      [host_fn](Array tokens, Array slots, MutArray cache) {
        raise_if_error(host_fn(to_ref(tokens, "tokens"), to_ref(slots, "slots"), to_ref(cache, "cache")));
      },
      nb::arg("tokens"), nb::arg("slots"), nb::arg("cache"), nb::call_guard<nb::gil_scoped_release>(), doc);
}

}  // namespace

void bind_fp8_cache(nb::module_& m) {
  bind_convert(m, "quantize_mla_cache_fp8", "quantize_mla_cache_fp8_reference", &quantize_mla_cache_fp8,
               &reference::quantize_mla_cache_fp8,
               "src [..., 576] bfloat16 -> dst [..., 656] uint8 (FP8-with-scale rows).");
  bind_convert(m, "dequantize_mla_cache_fp8", "dequantize_mla_cache_fp8_reference", &dequantize_mla_cache_fp8,
               &reference::dequantize_mla_cache_fp8,
               "src [..., 656] uint8 (FP8-with-scale rows) -> dst [..., 576] bfloat16.");
  bind_append(m, "append_mla_cache_fp8", "append_mla_cache_fp8_reference", &append_mla_cache_fp8,
              &reference::append_mla_cache_fp8,
              "Writes tokens [n, 576] bfloat16 into the FP8 paged cache at slots [n] int32.");

  bind_convert(m, "quantize_mla_cache_fp8_v4", "quantize_mla_cache_fp8_v4_reference", &quantize_mla_cache_fp8_v4,
               &reference::quantize_mla_cache_fp8_v4,
               "src [num_blocks, page_size, 1, 512] bfloat16 -> dst, a V4 cache [num_blocks, page_size, 1, 584] "
               "uint8 (584 bytes per token).");
  bind_convert(m, "dequantize_mla_cache_fp8_v4", "dequantize_mla_cache_fp8_v4_reference",
               &dequantize_mla_cache_fp8_v4, &reference::dequantize_mla_cache_fp8_v4,
               "src, a V4 cache [num_blocks, page_size, 1, 584] uint8 -> dst [num_blocks, page_size, 1, 512] "
               "bfloat16.");
  bind_append(m, "append_mla_cache_fp8_v4", "append_mla_cache_fp8_v4_reference", &append_mla_cache_fp8_v4,
              &reference::append_mla_cache_fp8_v4,
              "Writes tokens [n, 512] bfloat16 into the V4 FP8 paged cache at slots [n] int32.");
}

}  // namespace mlakit::python
