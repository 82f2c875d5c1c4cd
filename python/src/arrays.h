// Shared pieces of the bindings: DLPack arrays -> TensorRef, Status -> Python exception,
// stream handles. Every binding file uses these, so the conversions live once.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <optional>
#include <string>

#include "mlakit/lse_base.h"
#include "mlakit/mla_decode.h"
#include "mlakit/status.h"
#include "mlakit/tensor.h"

namespace mlakit::python {

namespace nb = nanobind;

// Inputs are read-only views; outputs and workspaces must be writable.
using Array = nb::ndarray<nb::ro>;
using MutArray = nb::ndarray<>;

// Raises for a failed Status: ValueError for invalid or unsupported arguments (the caller
// can fix them), RuntimeError for everything else (device, CUDA, workspace). The message is
// the library's, which names the argument, the expected and the actual value.
void raise_if_error(const Status& s);

// The view of `a` the C++ API takes. NumPy has no bfloat16, so uint16 arrays are read as
// bfloat16 bit patterns (the Python layer passes ml_dtypes.bfloat16 arrays that way).
TensorRef to_ref(const Array& a, const char* name);
TensorRef to_ref(const MutArray& a, const char* name);
// An absent optional argument is the empty TensorRef the C++ API expects.
TensorRef to_ref(const std::optional<Array>& a, const char* name);

// A log-sum-exp base by its Python name, 'e' or '2' (every binding with a base argument);
// anything else a ValueError "<op>: <argument>: expected 'e' or '2', got '<name>'".
LseBase lse_base_from(const char* op, const char* argument, const std::string& name);

// Python passes streams as integers (torch: Stream.cuda_stream, CuPy: Stream.ptr).
inline cudaStream_t to_stream(uintptr_t handle) { return reinterpret_cast<cudaStream_t>(handle); }

}  // namespace mlakit::python
