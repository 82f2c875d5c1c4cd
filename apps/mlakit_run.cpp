// mlakit-run: the main job. On a GPU: the dense MLA decode on a DeepSeek-V3-shaped problem
// (b=64, h_q=128, h_kv=1, s_q=1, varlen s_k ~ 4096, page 64), checked against the CPU
// reference and timed. Without a GPU: the CPU reference on the requested problem when it is
// small enough, otherwise on a smaller one that the output names (apps/run_options.h).
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <new>
#include <stdexcept>
#include <string>

#include "apps/run_options.h"
#include "mlakit/mla_decode.h"
#include "mlakit/reference.h"
#include "support/accuracy.h"
#include "support/decode_case.h"
#if MLAKIT_WITH_CUDA
#include <cuda_runtime_api.h>

#include "support/gpu_timing.h"
#endif

namespace {

using namespace mlakit;
using app::RunOptions;

support::HostDecodeCase make_case(const RunOptions& o) {
  support::DecodeCaseSpec spec;
  spec.seqlens = o.varlen ? support::varlen_lengths(o.b, o.s_k, o.s_q, 2026) : support::fixed_lengths(o.b, o.s_k);
  spec.s_q = o.s_q;
  spec.h_q = o.h_q;
  spec.h_kv = o.h_kv;
  spec.page_size = o.page;
  spec.causal = o.causal;
  spec.dtype = o.dtype;
  spec.seed = 7;
  return support::make_decode_case(spec);
}

void print_problem(const support::HostDecodeCase& c) {
  double mean = 0;
  for (int32_t l : c.seqlens) mean += l;
  mean /= static_cast<double>(c.b);
  std::printf("problem: b=%lld s_q=%d h_q=%d h_kv=%d mean s_k=%.0f page=%d causal=%d dtype=%s\n",
              static_cast<long long>(c.b), c.spec.s_q, c.spec.h_q, c.spec.h_kv, mean, c.spec.page_size,
              c.spec.causal ? 1 : 0, dtype_name(c.spec.dtype));
}

int run_cpu(const RunOptions& requested, const std::string& why) {
  const app::CpuProblem choice = app::choose_cpu_problem(requested);
  std::printf("NO GPU: %s\nCPU reference: %s.\n", why.c_str(), choice.note.c_str());
  const RunOptions& o = choice.options;
  const support::HostDecodeCase c = make_case(o);
  print_problem(c);
  const auto t0 = std::chrono::steady_clock::now();
  const support::ReferenceResult r = support::run_reference(c);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  int finite = 0;
  for (float l : r.lse) finite += std::isfinite(l) ? 1 : 0;
  std::printf("cpu reference: %.1f ms, %.3f GFLOP, %d of %zu rows with a finite LSE (others saw no key)\n", ms,
              support::decode_flops(c) * 1e-9, finite, r.lse.size());
  std::printf("result: CPU reference only (no GPU)\n");
  return 0;
}

#if MLAKIT_WITH_CUDA
int fail(const char* what, const Status& s) {
  std::fprintf(stderr, "%s failed: %s\n", what, s.to_string().c_str());
  return 1;
}

int run_gpu(const RunOptions& o) {
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  std::printf("GPU: %s (%d SMs)\n", prop.name, prop.multiProcessorCount);
  const support::HostDecodeCase c = make_case(o);
  print_problem(c);

  support::DeviceArray q(c.q), kv(c.kv), table(c.block_table), lens(c.seqlens);
  support::DeviceArray out(c.out_elems() * 2), lse(c.lse_elems() * 4);
  const MlaDecodeArgs args = c.args(q.get(), kv.get(), table.get(), lens.get(), out.get(), lse.get());
  std::size_t ws_bytes = 0;
  if (Status s = mla_decode_workspace_size(c.problem(), &ws_bytes); !s) return fail("workspace size", s);
  support::DeviceArray workspace(ws_bytes);
  MlaDecodePlan plan;
  if (Status s = mla_decode_plan(c.problem(), args.cache_seqlens, workspace.get(), ws_bytes, nullptr, &plan); !s) {
    return fail("plan", s);
  }
  out.fill_bytes(0xff);  // NaN in both 16-bit formats and in float: unwritten outputs show
  lse.fill_bytes(0xff);
  if (Status s = mla_decode(args, plan, nullptr); !s) return fail("decode", s);
  if (cudaError_t e = cudaDeviceSynchronize(); e != cudaSuccess) {
    std::fprintf(stderr, "decode failed: %s\n", cudaGetErrorString(e));
    return 1;
  }
  const auto gpu_out = out.download<uint16_t>();
  const auto gpu_lse = lse.download<float>();

  // docs/benchmarking.md timing: L2 flushed before every round, median of 20 after 3 warm-ups.
  support::L2Flusher flusher;
  const auto flush = [&] { flusher.flush(nullptr); };
  const double decode_us = support::median(
      support::time_rounds(nullptr, 3, 20, flush, [&] { (void)mla_decode(args, plan, nullptr); }));
  const double plan_us = support::median(support::time_rounds(nullptr, 3, 20, flush, [&] {
    (void)mla_decode_plan(c.problem(), args.cache_seqlens, workspace.get(), ws_bytes, nullptr, &plan);
  }));

  std::printf("checking against the CPU reference...\n");
  const support::ReferenceResult ref = support::run_reference(c);
  const auto o_report = support::check_half_outputs(gpu_out, ref.out, c.spec.dtype, "out");
  const auto l_report = support::check_float_stats(gpu_lse, ref.lse, "lse");
  std::printf("accuracy: out max abs err %.3g, cosine diff %.3g: %s; lse: %s\n", o_report.max_abs_error,
              o_report.cosine_diff, o_report.ok ? "ok" : o_report.message.c_str(),
              l_report.ok ? "ok" : l_report.message.c_str());
  const double flops = support::decode_flops(c), bytes = support::decode_bytes(c);
  std::printf("decode: %.1f us  %.1f TFLOP/s  %.0f GB/s   (plan %.1f us, reused by every layer; kernel: %s)\n",
              decode_us, flops / decode_us * 1e-6, bytes / decode_us * 1e-3, plan_us,
              plan.kernel == MlaKernel::kSm90 ? "sm90" : "portable");
  const bool ok = o_report.ok && l_report.ok;
  std::printf("result: %s\n", ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}
#endif

// Bytes of physical memory (a bound on the host tensors a problem may need).
double host_memory_bytes() {
  return static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
}

int run(const RunOptions& o) {
#if MLAKIT_WITH_CUDA
  int devices = 0;
  cudaError_t err = cudaGetDeviceCount(&devices);
  if (!o.force_cpu && err == cudaSuccess && devices > 0) {
    if (Status s = app::check_host_memory(o, host_memory_bytes()); !s) {
      std::fprintf(stderr, "%s\n", s.message().c_str());
      return 2;
    }
    return run_gpu(o);
  }
  const std::string why = o.force_cpu ? "--cpu given"
                                      : std::string("no CUDA device found (") +
                                            (err == cudaSuccess ? "0 devices" : cudaGetErrorString(err)) + ")";
  return run_cpu(o, why);
#else
  return run_cpu(o, "mlakit was built without CUDA");
#endif
}

}  // namespace

int main(int argc, char** argv) {
  RunOptions o;
  if (Status s = app::parse_run_options(argc, argv, &o); !s) {
    std::fprintf(stderr, "%s\n\n%s", s.message().c_str(), app::run_usage().c_str());
    return 2;
  }
  if (o.help) {
    std::printf("%s", app::run_usage().c_str());
    return 0;
  }
  // The library returns Status values; what remains is the host running out of memory while
  // building the problem, or a failed step of the support code: report it, never abort.
  try {
    return run(o);
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "mlakit-run: out of host memory for %s\n", app::describe_problem(o).c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mlakit-run: %s\n", e.what());
  }
  return 1;
}
