// Checks that make every write of a call land in memory no other element, output or input of
// the call occupies: the kernels write outputs from many threads at once, so two writes to
// one address race, and a write over an input changes what other threads read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>

#include "mlakit/status.h"
#include "mlakit/tensor.h"

namespace mlakit::detail {

// Every element of the output `t` has an address of its own: no zero stride on a dimension
// of size > 1 (a broadcast view) and no two index tuples at one element. Tensors without
// elements pass (nothing is written).
//
// The test is sufficient, not necessary: ordered by stride, each dimension's stride must
// exceed the largest offset the dimensions of smaller strides reach. Every view NumPy,
// PyTorch or CuPy make by slicing, transposing or reshaping a tensor passes; only
// hand-made interleavings (as_strided) that happen to be one-to-one are refused.
Status check_output_layout(const char* op, const char* name, const TensorRef& t);

// The bytes an argument occupies, [first, last]; empty when it has no elements or is absent.
struct MemoryRange {
  const char* name = "";
  std::uintptr_t first = 0;
  std::uintptr_t last = 0;
  bool empty = true;
};
// The tensor's elements, from its lowest to its highest address (validated tensors only:
// well-formed, extent within 2^59 elements).
MemoryRange tensor_range(const char* name, const TensorRef& t);
MemoryRange buffer_range(const char* name, const void* data, std::size_t bytes);

// No output range shares a byte with another output range or an input range. Inputs may
// share memory with each other (they are only read).
//
// Conservative: it compares the [first, last] intervals, not the elements, so two outputs
// interleaved in one buffer (e.g. out[:, 0] and out[:, 1] as two outputs) are refused even
// where their elements are disjoint; allocate such outputs separately. An exact test over
// strided layouts is an integer program; the interval test is exact for the separately
// allocated and the sliced-by-leading-dimension tensors callers pass.
Status check_disjoint(const char* op, std::initializer_list<MemoryRange> outputs,
                      std::initializer_list<MemoryRange> inputs);
// The same over ranges gathered at run time (an operation with a list of inputs).
Status check_disjoint(const char* op, std::span<const MemoryRange> outputs, std::span<const MemoryRange> inputs);

struct NamedTensor {
  const char* name;
  const TensorRef& tensor;
};
// check_output_layout for every output, then check_disjoint over the tensors' ranges.
Status check_outputs(const char* op, std::initializer_list<NamedTensor> outputs,
                     std::initializer_list<NamedTensor> inputs);

}  // namespace mlakit::detail
