#include "host/output_check.h"

#include <cstdio>
#include <span>
#include <string>
#include <vector>

#include "host/check.h"

namespace mlakit::detail {
namespace {

std::string hex(std::uintptr_t address) {
  char text[2 + 2 * sizeof(address) + 1];
  std::snprintf(text, sizeof(text), "0x%llx", static_cast<unsigned long long>(address));
  return text;
}

std::string describe(const MemoryRange& r) { return std::string(r.name) + " [" + hex(r.first) + ", " + hex(r.last) + "]"; }

bool overlap(const MemoryRange& a, const MemoryRange& b) {
  return !a.empty && !b.empty && a.first <= b.last && b.first <= a.last;
}

Status overlap_error(const char* op, const MemoryRange& output, const MemoryRange& other, const char* why) {
  return invalid(op, std::string(output.name) + ": expected memory disjoint from " + other.name + " (" + why +
                         "), got overlapping bytes " + describe(output) + " and " + describe(other));
}

Status disjoint(const char* op, std::span<const MemoryRange> outputs, std::span<const MemoryRange> inputs) {
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    for (std::size_t j = 0; j < i; ++j) {
      if (overlap(outputs[i], outputs[j])) {
        return overlap_error(op, outputs[i], outputs[j], "another output: the writes would race");
      }
    }
    for (const MemoryRange& input : inputs) {
      if (overlap(outputs[i], input)) {
        return overlap_error(op, outputs[i], input, "an input: the writes would change what is read");
      }
    }
  }
  return Status::ok();
}

}  // namespace

Status check_output_layout(const char* op, const char* name, const TensorRef& t) {
  if (has_no_elements(t)) return Status::ok();
  struct Dim {
    int axis;
    int64_t size;
    int64_t stride;
  };
  Dim dims[kMaxRank];
  int n = 0;
  for (int i = 0; i < t.rank; ++i) {
    if (t.shape[i] <= 1) continue;  // never stepped: its stride is never used
    if (t.stride[i] == 0) {
      return invalid(op, std::string(name) + ".stride[" + std::to_string(i) + "]: expected a nonzero stride (an output " +
                             "dimension of size " + std::to_string(t.shape[i]) +
                             "; a broadcast view would write all of its elements to one address), got 0");
    }
    // Insertion by increasing stride (at most kMaxRank entries).
    int at = n++;
    for (; at > 0 && dims[at - 1].stride > t.stride[i]; --at) dims[at] = dims[at - 1];
    dims[at] = Dim{i, t.shape[i], t.stride[i]};
  }
  // reach: the largest offset the dimensions of smaller strides address (within 2^59: the
  // extent check ran first). A stride beyond it starts a block no smaller one reaches.
  int64_t reach = 0;
  for (int k = 0; k < n; ++k) {
    if (dims[k].stride <= reach) {
      return invalid(op, std::string(name) + ".stride[" + std::to_string(dims[k].axis) + "]: expected > " +
                             std::to_string(reach) + " (beyond the elements of the dimensions with smaller strides, " +
                             "so that no two elements of " + name + " share an address; shape " + shape_string(t) +
                             "), got " + std::to_string(dims[k].stride));
    }
    reach += (dims[k].size - 1) * dims[k].stride;
  }
  return Status::ok();
}

MemoryRange tensor_range(const char* name, const TensorRef& t) {
  if (t.empty() || has_no_elements(t)) return MemoryRange{.name = name};
  int64_t last = 0;  // offset of the highest element, in elements
  for (int i = 0; i < t.rank; ++i) last += (t.shape[i] - 1) * t.stride[i];
  const auto size = static_cast<std::uintptr_t>(dtype_size(t.dtype));
  const auto first = reinterpret_cast<std::uintptr_t>(t.data);
  return MemoryRange{.name = name, .first = first, .last = first + static_cast<std::uintptr_t>(last) * size + size - 1,
                     .empty = false};
}

MemoryRange buffer_range(const char* name, const void* data, std::size_t bytes) {
  if (data == nullptr || bytes == 0) return MemoryRange{.name = name};
  const auto first = reinterpret_cast<std::uintptr_t>(data);
  return MemoryRange{.name = name, .first = first, .last = first + bytes - 1, .empty = false};
}

Status check_disjoint(const char* op, std::span<const MemoryRange> outputs, std::span<const MemoryRange> inputs) {
  return disjoint(op, outputs, inputs);
}

Status check_disjoint(const char* op, std::initializer_list<MemoryRange> outputs,
                      std::initializer_list<MemoryRange> inputs) {
  return disjoint(op, std::span(outputs.begin(), outputs.size()), std::span(inputs.begin(), inputs.size()));
}

Status check_outputs(const char* op, std::initializer_list<NamedTensor> outputs,
                     std::initializer_list<NamedTensor> inputs) {
  std::vector<MemoryRange> output_ranges, input_ranges;
  for (const NamedTensor& o : outputs) {
    MLAKIT_RETURN_IF_ERROR(check_output_layout(op, o.name, o.tensor));
    output_ranges.push_back(tensor_range(o.name, o.tensor));
  }
  for (const NamedTensor& i : inputs) input_ranges.push_back(tensor_range(i.name, i.tensor));
  return disjoint(op, output_ranges, input_ranges);
}

}  // namespace mlakit::detail
