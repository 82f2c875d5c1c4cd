#include "gpu_test_util.h"

#include <cstring>
#include <stdexcept>

namespace mlakit::testing {
namespace {

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(err));
}

// `*workspace` of the size `size_query` gives for `args` (untouched when the query fails).
template <typename Args>
Status allocate_workspace_for(const Args& args, Status (*size_query)(const Args&, std::size_t*),
                              DeviceBuffer* workspace) {
  std::size_t bytes = 0;
  const Status s = size_query(args, &bytes);
  if (s) *workspace = DeviceBuffer(bytes);
  return s;
}

}  // namespace

bool gpu_available(std::string* why) {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    cudaGetLastError();
    *why = err != cudaSuccess ? std::string("no CUDA device (") + cudaGetErrorString(err) + ")"
                              : "no CUDA device";
    return false;
  }
  return true;
}

DeviceDecodeCase::DeviceDecodeCase(const support::HostDecodeCase& c)
    : q(c.q),
      kv(c.kv),
      block_table(c.block_table),
      seqlens(c.seqlens),
      out(c.out_elems() * 2),
      lse(c.lse_elems() * 4) {
  args = c.args(q.get(), kv.get(), block_table.get(), seqlens.get(), out.get(), lse.get());
  poison_outputs();
}

void DeviceDecodeCase::poison_outputs() {
  out.fill16(kNan16);
  lse.fill32(kNan32);
}

DeviceBuffer make_workspace(const MlaDecodeProblem& problem, const MlaDecodeOptions& options) {
  std::size_t bytes = 0;
  Status s = mla_decode_workspace_size(problem, &bytes, options);
  if (!s) throw std::runtime_error(s.to_string());
  return DeviceBuffer(bytes);
}

bool is_hopper() {
  int device = 0, major = 0, minor = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  return major == 9 && minor == 0;
}

GpuDecodeResult run_gpu_decode(const support::HostDecodeCase& c, DeviceBuffer* workspace,
                               MlaDecodePlan* plan_out, const MlaDecodeOptions& options) {
  GpuDecodeResult r;
  DeviceDecodeCase d(c);
  DeviceBuffer own;
  if (workspace == nullptr) {
    own = make_workspace(c.problem(), options);
    workspace = &own;
  }
  MlaDecodePlan plan;
  r.status = mla_decode_plan(c.problem(), d.args.cache_seqlens, workspace->get(), workspace->bytes(),
                             nullptr, &plan, options);
  if (!r.status) return r;
  r.status = mla_decode(d.args, plan, nullptr);
  if (!r.status) return r;
  check(cudaDeviceSynchronize(), "decode");
  r.out = d.out.download<uint16_t>();
  r.lse = d.lse.download<float>();
  if (plan_out) *plan_out = plan;
  return r;
}

bool message_names_argument(const std::string& message, const std::string& name) {
  const std::string after = ":.[), ";
  for (size_t at = message.find(name); at != std::string::npos; at = message.find(name, at + 1)) {
    const bool starts = at == 0 || message[at - 1] == ' ' || message[at - 1] == '(';
    const size_t end = at + name.size();
    const bool ends = end == message.size() || after.find(message[end]) != std::string::npos;
    if (starts && ends) return true;
  }
  return false;
}

const char* kernel_name(MlaKernel kernel) {
  return kernel == MlaKernel::kAuto ? "auto" : kernel == MlaKernel::kPortable ? "portable" : "sm90";
}

CapturedGraph::CapturedGraph(cudaStream_t stream, const std::function<Status()>& call, cudaStreamCaptureMode mode) {
  error_ = cudaStreamBeginCapture(stream, mode);
  if (error_ != cudaSuccess) return;
  call_status_ = call();
  error_ = cudaStreamEndCapture(stream, &graph_);
  if (error_ != cudaSuccess || !call_status_) return;
  error_ = cudaGraphInstantiate(&exec_, graph_, 0);
}

CapturedGraph::~CapturedGraph() {
  if (exec_ != nullptr) cudaGraphExecDestroy(exec_);
  if (graph_ != nullptr) cudaGraphDestroy(graph_);
}

DeviceMhaPrefillCase::DeviceMhaPrefillCase(const support::HostMhaPrefillCase& c, MlaKernel kernel)
    : q(to_device(c.q)),
      k(to_device(c.k)),
      v(to_device(c.v)),
      cu_q(to_device(c.cu_q)),
      cu_k(to_device(c.cu_k)),
      out(c.out_stored * 2),
      lse(c.lse_stored * 4) {
  args = c.args(q.get(), k.get(), v.get(), cu_q.get(), cu_k.get(), out.get(), lse.get());
  args.kernel = kernel;
}

Status DeviceMhaPrefillCase::allocate_workspace() {
  return allocate_workspace_for(args, &mha_prefill_workspace_size, &workspace);
}

Status DeviceMhaPrefillCase::launch(cudaStream_t stream) const {
  return mha_prefill(args, workspace.get(), workspace.bytes(), stream);
}

DeviceMhaBackwardCase::DeviceMhaBackwardCase(const support::HostMhaBackwardCase& c, bool deterministic,
                                             MlaKernel kernel)
    : q(to_device(c.fwd.q)),
      k(to_device(c.fwd.k)),
      v(to_device(c.fwd.v)),
      cu_q(to_device(c.fwd.cu_q)),
      cu_k(to_device(c.fwd.cu_k)),
      dout(to_device(c.dout)),
      out(to_device(c.out)),
      lse(to_device(c.lse)),
      dq(c.dq_stored * 2),
      dk(c.dk_stored * 2),
      dv(c.dv_stored * 2) {
  args = c.args({.q = q.get(),
                 .k = k.get(),
                 .v = v.get(),
                 .cu_q = cu_q.get(),
                 .cu_k = cu_k.get(),
                 .dout = dout.get(),
                 .out = out.get(),
                 .lse = lse.get(),
                 .dq = dq.get(),
                 .dk = dk.get(),
                 .dv = dv.get()});
  args.deterministic = deterministic;
  args.kernel = kernel;
}

Status DeviceMhaBackwardCase::allocate_workspace() {
  return allocate_workspace_for(args, &mha_prefill_backward_workspace_size, &workspace);
}

void DeviceMhaBackwardCase::upload_inputs(const support::HostMhaBackwardCase& c) {
  q.upload(c.fwd.q.data(), c.fwd.q.size() * 2);
  if (!c.fwd.k.empty()) k.upload(c.fwd.k.data(), c.fwd.k.size() * 2);
  if (!c.fwd.v.empty()) v.upload(c.fwd.v.data(), c.fwd.v.size() * 2);
  cu_q.upload(c.fwd.cu_q.data(), c.fwd.cu_q.size() * 4);
  cu_k.upload(c.fwd.cu_k.data(), c.fwd.cu_k.size() * 4);
  dout.upload(c.dout.data(), c.dout.size() * 2);
  out.upload(c.out.data(), c.out.size() * 2);
  lse.upload(c.lse.data(), c.lse.size() * 4);
}

Status DeviceMhaBackwardCase::launch(cudaStream_t stream) const {
  return mha_prefill_backward(args, workspace.get(), workspace.bytes(), stream);
}

}  // namespace mlakit::testing
