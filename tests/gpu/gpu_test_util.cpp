#include "gpu_test_util.h"

#include <cstring>
#include <stdexcept>

namespace mlakit::testing {
namespace {

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(err));
}

constexpr uint16_t kNanBf16 = 0x7fc0;  // also a NaN as fp16 (exponent all ones, mantissa != 0)
constexpr uint32_t kNanF32 = 0x7fc00000u;

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
  out.fill16(kNanBf16);
  lse.fill32(kNanF32);
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

}  // namespace mlakit::testing
