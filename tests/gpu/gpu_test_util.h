// Helpers of the GPU test suite: skipping without a GPU, device buffers, poison and call-to-call
// comparisons, named sweep cases and their cached references, running one decode case end to
// end (poisoned outputs, plan, decode) on the device, and the dense MHA prefill cases (forward
// and backward) on the device.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <ostream>
#include <string>
#include <type_traits>
#include <vector>

#include "mlakit/mha_prefill.h"
#include "mlakit/mla_decode.h"
#include "support/decode_case.h"
#include "support/device_array.h"
#include "support/mha_backward_case.h"
#include "support/mha_prefill_case.h"

namespace mlakit::testing {

// True when a CUDA device is usable; otherwise `why` says what is missing.
bool gpu_available(std::string* why);

#define MLAKIT_SKIP_WITHOUT_GPU()                                        \
  do {                                                                   \
    std::string mlakit_why_;                                             \
    if (!::mlakit::testing::gpu_available(&mlakit_why_)) {               \
      GTEST_SKIP() << "GPU test skipped: " << mlakit_why_;               \
    }                                                                    \
  } while (0)

#define MLAKIT_ASSERT_CUDA(expr)                                                      \
  do {                                                                                \
    cudaError_t mlakit_err_ = (expr);                                                 \
    ASSERT_EQ(mlakit_err_, cudaSuccess) << #expr << ": " << cudaGetErrorString(mlakit_err_); \
  } while (0)

using DeviceBuffer = support::DeviceArray;

// Output poison: NaN as bf16 and as fp16 (exponent all ones, mantissa != 0), and as float32.
inline constexpr uint16_t kNan16 = 0x7fc0;
inline constexpr uint32_t kNan32 = 0x7fc00000u;

// A device copy of `host` (an empty vector, e.g. k and v of a packed qkv case: a 1-byte
// allocation and no copy).
template <typename T>
DeviceBuffer to_device(const std::vector<T>& host) {
  return host.empty() ? DeviceBuffer(0) : DeviceBuffer(host);
}

// True when every T element of `buffer` has the bits `bits` (a poison no call may overwrite).
template <typename T>
bool holds_only(const DeviceBuffer& buffer, T bits) {
  for (T x : buffer.download<T>()) {
    if (x != bits) return false;
  }
  return true;
}

// "" when `got` equals `first` (call 0's download of the same buffer), else "<name> differs
// from call 0 in N elements, first at buffer element I" (for bytes: "in N bytes, first at byte I").
template <typename T>
std::string difference_from_call0(const std::vector<T>& got, const std::vector<T>& first, const std::string& name) {
  int64_t n = 0, at = -1;
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] == first[i]) continue;
    if (at < 0) at = static_cast<int64_t>(i);
    ++n;
  }
  if (n == 0) return "";
  const char* unit = sizeof(T) == 1 ? " bytes, first at byte " : " elements, first at buffer element ";
  return name + " differs from call 0 in " + std::to_string(n) + unit + std::to_string(at);
}

// True when `message` names `name` as an argument: at its start or after ' ' or '(', and at its
// end or before one of ":.[), " ("q:", "q.stride[1]", "(q)", "q rows", ...). Stricter than
// gqa_test_util.h's names_argument, which takes any neighbour that is not an identifier's.
bool message_names_argument(const std::string& message, const std::string& name);

// "auto", "portable" or "sm90".
const char* kernel_name(MlaKernel kernel);

// One case of a parameterised sweep: `name` ends the test's name and is what gtest prints.
template <typename Spec>
struct NamedCase {
  std::string name;
  Spec spec;
};

template <typename Spec>
void PrintTo(const NamedCase<Spec>& c, std::ostream* os) {
  *os << c.name;
}

// The float64 multiply-adds of a sweep's references (`macs(spec)` per case), printed for the log
// as "[<label>] sweep reference: ...".
template <typename Spec, typename Macs>
double sweep_reference_macs(const char* label, const std::vector<NamedCase<Spec>>& cases, const Macs& macs) {
  double total = 0;
  for (const NamedCase<Spec>& c : cases) total += macs(c.spec);
  std::printf("[%s] sweep reference: %.3g float64 multiply-adds over %zu cases\n", label, total, cases.size());
  return total;
}

// A sweep case's host inputs and float64 reference.
template <typename Case, typename Reference>
struct PreparedCase {
  Case c;
  Reference ref;
};

// The PreparedCase named `name`: `make()` and `run_reference(c)` on the first call with that
// name, the same object on every later one (a sweep runs each case several times: kernels,
// modes; the reference is the slow part). One cache per call site (the lambdas' types).
template <typename Make, typename RunReference>
const auto& prepared_once(const std::string& name, const Make& make, const RunReference& run_reference) {
  using Case = std::invoke_result_t<const Make&>;
  using Prepared = PreparedCase<Case, std::invoke_result_t<const RunReference&, const Case&>>;
  static std::map<std::string, std::unique_ptr<Prepared>> cache;
  std::unique_ptr<Prepared>& slot = cache[name];
  if (!slot) {
    auto p = std::make_unique<Prepared>();
    p->c = make();
    p->ref = run_reference(p->c);
    slot = std::move(p);
  }
  return static_cast<const Prepared&>(*slot);
}

// The device copy of a HostDecodeCase plus poisoned outputs.
struct DeviceDecodeCase {
  DeviceBuffer q, kv, block_table, seqlens, out, lse;
  MlaDecodeArgs args;
  explicit DeviceDecodeCase(const support::HostDecodeCase& c);
  void poison_outputs();
};

// A workspace sized for `problem` on the current device (fails the test if the query fails).
DeviceBuffer make_workspace(const MlaDecodeProblem& problem, const MlaDecodeOptions& options = {});

// Uploads, plans and decodes `c`, returning the outputs; `plan_out` receives the plan.
struct GpuDecodeResult {
  Status status;
  std::vector<uint16_t> out;
  std::vector<float> lse;
};
GpuDecodeResult run_gpu_decode(const support::HostDecodeCase& c, DeviceBuffer* workspace = nullptr,
                               MlaDecodePlan* plan_out = nullptr, const MlaDecodeOptions& options = {});

// True when the current device is a Hopper (compute capability 9.0) GPU.
bool is_hopper();

// What one call enqueues on `stream`, captured into a CUDA graph and instantiated; the graph
// and its instance are destroyed with the object. Nothing is instantiated when capturing fails
// or the call returns an error.
class CapturedGraph {
 public:
  CapturedGraph(cudaStream_t stream, const std::function<Status()>& call,
                cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal);
  ~CapturedGraph();
  CapturedGraph(const CapturedGraph&) = delete;
  CapturedGraph& operator=(const CapturedGraph&) = delete;

  cudaError_t error() const { return error_; }                 // of capturing or instantiating
  const Status& call_status() const { return call_status_; }  // what the call returned
  cudaGraphExec_t exec() const { return exec_; }

 private:
  cudaError_t error_ = cudaSuccess;
  Status call_status_;
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

// A HostMhaPrefillCase on the device: its inputs, out and lse buffers of the case's stored sizes
// (not poisoned: each test poisons its own way) and args over them. The workspace stays empty
// until allocate_workspace().
struct DeviceMhaPrefillCase {
  DeviceBuffer q, k, v, cu_q, cu_k, out, lse, workspace;
  MhaPrefillArgs args;

  DeviceMhaPrefillCase(const support::HostMhaPrefillCase& c, MlaKernel kernel);
  // A workspace of the size mha_prefill_workspace_size gives for `args`.
  Status allocate_workspace();
  Status launch(cudaStream_t stream = nullptr) const;
};

// A HostMhaBackwardCase on the device: its inputs, dq, dk and dv buffers of the case's stored
// sizes (not poisoned) and args over them (`deterministic` and `kernel` as given). The workspace
// stays empty until allocate_workspace().
struct DeviceMhaBackwardCase {
  DeviceBuffer q, k, v, cu_q, cu_k, dout, out, lse, dq, dk, dv, workspace;
  MhaPrefillBackwardArgs args;

  DeviceMhaBackwardCase(const support::HostMhaBackwardCase& c, bool deterministic, MlaKernel kernel);
  // A workspace of the size mha_prefill_backward_workspace_size gives for `args`.
  Status allocate_workspace();
  // The inputs of another cut of the same buffers (support::recut_mha_backward_case).
  void upload_inputs(const support::HostMhaBackwardCase& c);
  Status launch(cudaStream_t stream = nullptr) const;
};

}  // namespace mlakit::testing
