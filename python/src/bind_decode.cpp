// Dense MLA decode (docs/contract.md): workspace query, plan, decode, CPU reference.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <string>

#include "arrays.h"
#include "bindings.h"
#include "plan_fields.h"
#include "mlakit/mla_decode.h"
#include "mlakit/reference.h"

namespace mlakit::python {
namespace {

MlaKernel kernel_from(const std::string& name) {
  if (name == "auto") return MlaKernel::kAuto;
  if (name == "portable") return MlaKernel::kPortable;
  if (name == "sm90") return MlaKernel::kSm90;
  throw nb::value_error(("kernel: expected 'auto', 'portable' or 'sm90', got '" + name + "'").c_str());
}

MlaDecodeArgs decode_args(const Array& q, const Array& kv_cache, const Array& block_table, const Array& cache_seqlens,
                          const MutArray& out, const MutArray& lse, std::optional<float> softmax_scale, bool causal) {
  MlaDecodeArgs a;
  a.q = to_ref(q, "q");
  a.kv_cache = to_ref(kv_cache, "kv_cache");
  a.block_table = to_ref(block_table, "block_table");
  a.cache_seqlens = to_ref(cache_seqlens, "cache_seqlens");
  a.out = to_ref(out, "out");
  a.lse = to_ref(lse, "lse");
  a.softmax_scale = softmax_scale;  // None: 1 / sqrt(d_qk)
  a.causal = causal;
  return a;
}

// The same schedule for another split of the query rows into tokens and heads.
//
// FlashMLA's get_mla_metadata receives only num_q_tokens_per_head_k = s_q * h_q / h_kv, not
// s_q and h_q, while mla_decode checks the plan's (s_q, h_q) against q. Everything a dense
// plan holds (num_parts, the workspace layout, the schedule, the partial-result regions)
// depends on b, h_kv and the rows per kv head only, because the kernels pack the s_q * h_q /
// h_kv rows of a kv head into one M dimension (docs/design.md, "Row packing"). So a plan
// made for rows r serves every (s_q, h_q) with s_q * h_q / h_kv = r once its problem says
// so; anything else is rejected here.
MlaDecodePlan with_query_shape(const MlaDecodePlan& plan, int s_q, int h_q) {
  const MlaDecodeProblem& p = plan.problem;
  const int64_t plan_rows = static_cast<int64_t>(p.s_q) * (p.h_q / p.h_kv);
  if (s_q < 0 || h_q < 0 || h_q % p.h_kv != 0 || static_cast<int64_t>(s_q) * (h_q / p.h_kv) != plan_rows) {
    throw nb::value_error(("plan: expected s_q * h_q / h_kv = " + std::to_string(plan_rows) +
                           " (the plan's query rows per kv head, h_kv = " + std::to_string(p.h_kv) + "), got s_q = " +
                           std::to_string(s_q) + ", h_q = " + std::to_string(h_q) + ": make a plan for this problem")
                              .c_str());
  }
  MlaDecodePlan out = plan;
  out.problem.s_q = s_q;
  out.problem.h_q = h_q;
  return out;
}

}  // namespace

void bind_decode(nb::module_& m) {
  nb::class_<MlaDecodePlan>(m, "MlaDecodePlan",
                            "A split-KV schedule in a caller's workspace; reused by every layer of a step.")
      .def_prop_ro("b", [](const MlaDecodePlan& p) { return p.problem.b; })
      .def_prop_ro("s_q", [](const MlaDecodePlan& p) { return p.problem.s_q; })
      .def_prop_ro("h_q", [](const MlaDecodePlan& p) { return p.problem.h_q; })
      .def_prop_ro("h_kv", [](const MlaDecodePlan& p) { return p.problem.h_kv; })
      .def_ro("num_parts", &MlaDecodePlan::num_parts)
      .def_ro("workspace_bytes", &MlaDecodePlan::workspace_bytes)
      .def_ro("part_ranges_offset", &MlaDecodePlan::part_ranges_offset, "int32 [num_parts, 8] per-CTA work ranges")
      .def_ro("split_prefix_offset", &MlaDecodePlan::split_prefix_offset, "int32 [b + 1] prefix sums of splits")
      .def_ro("no_splits", &MlaDecodePlan::no_splits,
              "True when every sequence lies whole in one part (no combine): sparse plans without topk_length")
      .def_ro("device", &MlaDecodePlan::device, "CUDA device ordinal; -1 for a host plan")
      .def_ro("sparse_topk", &MlaDecodePlan::sparse_topk, "sparse decode plans: the topk they were made for; 0: dense")
      .def_prop_ro("kernel",
                   [](const MlaDecodePlan& p) {
                     if (p.device < 0) return std::string("reference");
                     return p.kernel == MlaKernel::kSm90 ? std::string("sm90") : std::string("portable");
                   })
      .def("fields", &plan_fields<MlaDecodePlan>,
           "The plan as a list of integers (python/src/plan_fields.h), without its workspace: with the "
           "workspace array, from_fields rebuilds it (PyTorch custom ops pass plans this way).")
      .def_static("from_fields", &plan_from_fields<MlaDecodePlan>, nb::arg("fields"), nb::arg("workspace"),
                  "The plan of fields() in `workspace` (its size and device checked against the plan's).")
      .def("with_query_shape", &with_query_shape, nb::arg("s_q"), nb::arg("h_q"),
           "The same plan for q of s_q tokens and h_q heads, with s_q * h_q / h_kv equal to the plan's.");

  m.def(
      "host_plan",
      [](int64_t b, int s_q, int h_q, int h_kv, int64_t sparse_topk) {
        MlaDecodePlan plan;
        plan.problem = MlaDecodeProblem{.b = b, .s_q = s_q, .h_q = h_q, .h_kv = h_kv};
        plan.sparse_topk = sparse_topk;
        return plan;
      },
      nb::arg("b"), nb::arg("s_q"), nb::arg("h_q"), nb::arg("h_kv"), nb::arg("sparse_topk") = 0,
      "The plan of host arrays: the problem alone (the CPU reference needs no schedule, so no workspace).");

  m.def(
      "mla_decode_reference",
      [](Array q, Array kv_cache, Array block_table, Array cache_seqlens, MutArray out, MutArray lse,
         std::optional<float> softmax_scale, bool causal) {
        raise_if_error(reference::mla_decode(
            decode_args(q, kv_cache, block_table, cache_seqlens, out, lse, softmax_scale, causal)));
      },
      nb::arg("q"), nb::arg("kv_cache"), nb::arg("block_table"), nb::arg("cache_seqlens"), nb::arg("out"),
      nb::arg("lse"), nb::arg("softmax_scale").none() = nb::none(), nb::arg("causal") = false,
      nb::call_guard<nb::gil_scoped_release>(),
      "Dense MLA decode on host arrays (float64 CPU reference); writes out and lse.");

  m.def(
      "mla_decode_workspace_size",
      [](int64_t b, int s_q, int h_q, int h_kv, const std::string& kernel) {
        std::size_t bytes = 0;
        raise_if_error(mla_decode_workspace_size(MlaDecodeProblem{.b = b, .s_q = s_q, .h_q = h_q, .h_kv = h_kv},
                                                 &bytes, MlaDecodeOptions{.kernel = kernel_from(kernel)}));
        return bytes;
      },
      nb::arg("b"), nb::arg("s_q"), nb::arg("h_q"), nb::arg("h_kv"), nb::arg("kernel") = "auto",
      "Bytes of device workspace the plan and decode need on the current device.");

  m.def(
      "mla_decode_plan",
      [](int64_t b, int s_q, int h_q, int h_kv, Array cache_seqlens, MutArray workspace, uintptr_t stream,
         const std::string& kernel) {
        MlaDecodePlan plan;
        raise_if_error(mla_decode_plan(MlaDecodeProblem{.b = b, .s_q = s_q, .h_q = h_q, .h_kv = h_kv},
                                       to_ref(cache_seqlens, "cache_seqlens"), workspace.data(), workspace.nbytes(),
                                       to_stream(stream), &plan, MlaDecodeOptions{.kernel = kernel_from(kernel)}));
        return plan;
      },
      nb::arg("b"), nb::arg("s_q"), nb::arg("h_q"), nb::arg("h_kv"), nb::arg("cache_seqlens"), nb::arg("workspace"),
      nb::arg("stream") = 0, nb::arg("kernel") = "auto",
      "Computes the split-KV schedule on the device into `workspace` (on `stream`, a cudaStream_t as int).");

  m.def(
      "mla_decode",
      [](Array q, Array kv_cache, Array block_table, Array cache_seqlens, MutArray out, MutArray lse,
         const MlaDecodePlan& plan, std::optional<float> softmax_scale, bool causal, uintptr_t stream) {
        raise_if_error(mla_decode(decode_args(q, kv_cache, block_table, cache_seqlens, out, lse, softmax_scale, causal),
                                  plan, to_stream(stream)));
      },
      nb::arg("q"), nb::arg("kv_cache"), nb::arg("block_table"), nb::arg("cache_seqlens"), nb::arg("out"),
      nb::arg("lse"), nb::arg("plan"), nb::arg("softmax_scale").none() = nb::none(), nb::arg("causal") = false,
      nb::arg("stream") = 0, "Dense MLA decode of one layer on the device (asynchronous on `stream`).");
}

}  // namespace mlakit::python
