// Merging partial attention states (include/mlakit/merge.h): the GPU merge (asynchronous on the
// caller's stream) and the CPU reference, the states passed as lists of arrays.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <string>
#include <vector>

#include "arrays.h"
#include "bindings.h"
#include "mlakit/merge.h"

namespace mlakit::python {
namespace {

// One TensorRef per array of a list argument, named like the library's messages: "o[2]".
std::vector<TensorRef> state_refs(const std::vector<Array>& states, const char* argument) {
  std::vector<TensorRef> refs;
  refs.reserve(states.size());
  for (std::size_t i = 0; i < states.size(); ++i) {
    refs.push_back(to_ref(states[i], (std::string(argument) + "[" + std::to_string(i) + "]").c_str()));
  }
  return refs;
}

// The arguments of one call: MergeStatesArgs points into the TensorRef lists held here, so
// the object is neither copied nor moved.
class MergeCall {
 public:
  MergeCall(const std::vector<Array>& o, const std::vector<Array>& lse, const MutArray& out,
            const std::optional<MutArray>& out_lse, const std::string& lse_base, const std::string& out_lse_base)
      : o_(state_refs(o, "o")), lse_(state_refs(lse, "lse")) {
    // The C++ API has one count for both lists; more than kMaxMergeStates is the library's error.
    if (lse_.size() != o_.size()) {
      throw nb::value_error(("merge_states: lse: expected " + std::to_string(o_.size()) +
                             " arrays (one per state of o), got " + std::to_string(lse_.size()))
                                .c_str());
    }
    args_.o = o_.data();
    args_.lse = lse_.data();
    args_.num_states = static_cast<int>(o_.size());
    args_.lse_base = lse_base_from("merge_states", "lse_base", lse_base);
    args_.out = to_ref(out, "out");
    if (out_lse) args_.out_lse = to_ref(*out_lse, "out_lse");
    args_.out_lse_base = lse_base_from("merge_states", "out_lse_base", out_lse_base);
  }
  MergeCall(const MergeCall&) = delete;
  MergeCall& operator=(const MergeCall&) = delete;

  const MergeStatesArgs& args() const { return args_; }

 private:
  std::vector<TensorRef> o_;
  std::vector<TensorRef> lse_;
  MergeStatesArgs args_;
};

}  // namespace

void bind_merge(nb::module_& m) {
  m.attr("MAX_MERGE_STATES") = kMaxMergeStates;  // states one call merges
  m.def(
      "merge_states_reference",
      [](const std::vector<Array>& o, const std::vector<Array>& lse, MutArray out, std::optional<MutArray> out_lse,
         const std::string& lse_base, const std::string& out_lse_base) {
        const MergeCall call(o, lse, out, out_lse, lse_base, out_lse_base);
        nb::gil_scoped_release release;
        raise_if_error(reference::merge_states(call.args()));
      },
      nb::arg("o"), nb::arg("lse"), nb::arg("out"), nb::arg("out_lse").none(), nb::arg("lse_base") = "e",
      nb::arg("out_lse_base") = "e",
      "Merges the partial states (o[i], lse[i]) on host arrays (float64 CPU reference); writes out and out_lse. "
      "Bases: 'e' or '2'.");

  m.def(
      "merge_states",
      [](const std::vector<Array>& o, const std::vector<Array>& lse, MutArray out, std::optional<MutArray> out_lse,
         const std::string& lse_base, const std::string& out_lse_base, uintptr_t stream) {
        const MergeCall call(o, lse, out, out_lse, lse_base, out_lse_base);
        raise_if_error(merge_states(call.args(), to_stream(stream)));
      },
      nb::arg("o"), nb::arg("lse"), nb::arg("out"), nb::arg("out_lse").none(), nb::arg("lse_base") = "e",
      nb::arg("out_lse_base") = "e", nb::arg("stream") = 0,
      "Merges the partial states (o[i], lse[i]) on the device (asynchronous on `stream`, a cudaStream_t as int); "
      "writes out and out_lse. Bases: 'e' or '2'.");
}

}  // namespace mlakit::python
