// One function per operation family adds its bindings to the extension module.
#pragma once

#include <nanobind/nanobind.h>

namespace mlakit::python {

void bind_decode(nanobind::module_& m);
void bind_sparse_decode(nanobind::module_& m);
void bind_sparse_prefill(nanobind::module_& m);
void bind_fp8_cache(nanobind::module_& m);
void bind_gqa_decode(nanobind::module_& m);
void bind_mha_prefill(nanobind::module_& m);
void bind_merge(nanobind::module_& m);

}  // namespace mlakit::python
