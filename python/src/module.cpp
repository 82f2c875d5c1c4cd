// The Python extension mlakit._mlakit: the C++ API over DLPack arrays (NumPy, PyTorch, CuPy,
// JAX through nanobind's ndarray). Arrays in host memory run the CPU reference, device arrays
// the GPU kernels on the caller's stream. Failed Statuses raise: ValueError for invalid or
// unsupported arguments, RuntimeError otherwise, with the library's message.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <cmath>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>

#include "mlakit/mla_decode.h"
#include "mlakit/reference.h"

namespace nb = nanobind;

namespace mlakit::python {
namespace {

using Array = nb::ndarray<nb::ro>;
using MutArray = nb::ndarray<>;

void raise_if_error(const Status& s) {
  if (s.is_ok()) return;
  if (s.code() == StatusCode::kInvalidArgument || s.code() == StatusCode::kUnsupported) {
    throw nb::value_error(s.message().c_str());
  }
  throw std::runtime_error(s.to_string());
}

DType to_dtype(const nb::dlpack::dtype& t, const char* name) {
  using Code = nb::dlpack::dtype_code;
  const auto code = static_cast<Code>(t.code);
  if (t.lanes == 1) {
    if (code == Code::Bfloat && t.bits == 16) return DType::kBF16;
    if (code == Code::Float && t.bits == 16) return DType::kFP16;
    if (code == Code::Float && t.bits == 32) return DType::kFP32;
    if (code == Code::Int && t.bits == 32) return DType::kInt32;
    if (code == Code::Int && t.bits == 8) return DType::kInt8;
    if (code == Code::UInt && t.bits == 8) return DType::kUInt8;
  }
  throw nb::type_error((std::string(name) + ": unsupported dtype (code " + std::to_string(t.code) + ", " +
                        std::to_string(t.bits) + " bits)")
                           .c_str());
}

template <typename A>
TensorRef to_ref(const A& a, const char* name) {
  if (a.ndim() > static_cast<size_t>(kMaxRank)) {
    throw nb::value_error((std::string(name) + ": expected rank <= 6, got " + std::to_string(a.ndim())).c_str());
  }
  TensorRef t;
  t.data = const_cast<void*>(static_cast<const void*>(a.data()));
  t.dtype = to_dtype(a.dtype(), name);
  t.rank = static_cast<int>(a.ndim());
  for (int i = 0; i < t.rank; ++i) {
    t.shape[i] = static_cast<int64_t>(a.shape(i));
    t.stride[i] = static_cast<int64_t>(a.stride(i));
  }
  return t;
}

float scale_or_default(std::optional<float> scale) { return scale ? *scale : kDefaultSoftmaxScale; }

MlaDecodeKernel kernel_from(const std::string& name) {
  if (name == "auto") return MlaDecodeKernel::kAuto;
  if (name == "portable") return MlaDecodeKernel::kPortable;
  if (name == "sm90") return MlaDecodeKernel::kSm90;
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
  a.softmax_scale = scale_or_default(softmax_scale);
  a.causal = causal;
  return a;
}

}  // namespace
}  // namespace mlakit::python

NB_MODULE(_mlakit, m) {
  using namespace mlakit;
  using namespace mlakit::python;
  m.doc() = "mlakit: MLA attention kernels (C++/CUDA) over DLPack arrays";

  nb::class_<MlaDecodePlan>(m, "MlaDecodePlan", "A split-KV schedule in a workspace; reused by every layer of a step.")
      .def_ro("num_parts", &MlaDecodePlan::num_parts)
      .def_ro("workspace_bytes", &MlaDecodePlan::workspace_bytes)
      .def_prop_ro("kernel", [](const MlaDecodePlan& p) {
        return p.kernel == MlaDecodeKernel::kSm90 ? std::string("sm90") : std::string("portable");
      });

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
                                       to_ref(cache_seqlens, "cache_seqlens"), workspace.data(),
                                       workspace.nbytes(), reinterpret_cast<cudaStream_t>(stream), &plan,
                                       MlaDecodeOptions{.kernel = kernel_from(kernel)}));
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
                                  plan, reinterpret_cast<cudaStream_t>(stream)));
      },
      nb::arg("q"), nb::arg("kv_cache"), nb::arg("block_table"), nb::arg("cache_seqlens"), nb::arg("out"),
      nb::arg("lse"), nb::arg("plan"), nb::arg("softmax_scale").none() = nb::none(), nb::arg("causal") = false,
      nb::arg("stream") = 0, "Dense MLA decode of one layer on the device (asynchronous on `stream`).");
}
