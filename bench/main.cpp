// mlakit-bench: times the MLA decode (dense, sparse FP8) and the sparse prefill on the docs/benchmarking.md
// cases and the device-to-device
// copy ceiling in the same run; prints a table and appends JSON lines to <out>/<gpu>.jsonl.
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "bench/cases.h"
#include "bench/check.h"
#include "bench/device_data.h"
#include "bench/measure.h"
#include "bench/results_json.h"
#include "bench/sparse_measure.h"
#include "bench/sparse_prefill_measure.h"

namespace mlakit::bench {
namespace {

constexpr int kDefaultRuns = 20;
constexpr int kMinRuns = 20;  // docs/benchmarking.md: median of >= 20 runs
constexpr int kWarmupRounds = 5;
constexpr int kDefaultCooldownMs = 2000;

struct Options {
  bool quick = false;
  std::string filter;
  int runs = kDefaultRuns;
  std::string out_dir = "bench/results";
  DType dtype = DType::kBF16;
  MlaKernel kernel = MlaKernel::kAuto;
  int cooldown_ms = kDefaultCooldownMs;
};

void print_usage(std::FILE* to) {
  std::fprintf(
      to,
      "usage: mlakit-bench [--quick] [--filter SUBSTRING] [--runs N] [--out DIR]\n"
      "                    [--dtype bf16|fp16] [--kernel auto|portable|sm90] [--cooldown-ms MS]\n"
      "  --quick            a few cases (dense b128 h_q128 s_k4096 and b32 h_q16 s_k8192, sparse decode\n"
      "                     b128 and b64, sparse prefill s_kv8192); allows --runs < %d\n"
      "  --filter SUBSTRING only the cases whose name contains SUBSTRING (several: a,b,c)\n"
      "  --runs N           timed runs per case, median reported (default %d, minimum %d)\n"
      "  --out DIR          results directory (default bench/results); appends to DIR/<gpu>.jsonl\n"
      "  --dtype bf16|fp16  q and cache element type (default bf16)\n"
      "  --kernel K         auto (default: sm90 on Hopper), portable or sm90\n"
      "  --cooldown-ms MS   the GPU idles MS milliseconds before each case (default %d), so that a case\n"
      "                     does not inherit the clock the power manager lowered during the one before\n"
      "Environment: MLAKIT_COMMIT names the commit in the JSON (default \"unknown\").\n",
      kMinRuns, kDefaultRuns, kMinRuns, kDefaultCooldownMs);
}

[[noreturn]] void usage_error(const std::string& message) {
  std::fprintf(stderr, "mlakit-bench: %s\n", message.c_str());
  print_usage(stderr);
  std::exit(2);
}

// The integer value of option `name`, or a usage error when it is not one in [lo, hi].
int int_value(const std::string& name, const std::string& v, long lo, long hi) {
  char* end = nullptr;
  const long n = std::strtol(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || n < lo || n > hi) {
    usage_error(name + ": expected an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got '" +
                v + "'");
  }
  return static_cast<int>(n);
}

Options parse_options(int argc, char** argv) {
  Options o;
  bool runs_given = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage_error(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--help" || arg == "-h") {
      print_usage(stdout);
      std::exit(0);
    } else if (arg == "--quick") {
      o.quick = true;
    } else if (arg == "--filter") {
      o.filter = value();
    } else if (arg == "--runs") {
      o.runs = int_value(arg, value(), 1, 100000);
      runs_given = true;
    } else if (arg == "--cooldown-ms") {
      o.cooldown_ms = int_value(arg, value(), 0, 600000);
    } else if (arg == "--out") {
      o.out_dir = value();
    } else if (arg == "--kernel") {
      const std::string v = value();
      if (v == "auto") {
        o.kernel = MlaKernel::kAuto;
      } else if (v == "portable") {
        o.kernel = MlaKernel::kPortable;
      } else if (v == "sm90") {
        o.kernel = MlaKernel::kSm90;
      } else {
        usage_error("--kernel: expected auto, portable or sm90, got '" + v + "'");
      }
    } else if (arg == "--dtype") {
      const std::string v = value();
      if (v == "bf16")
        o.dtype = DType::kBF16;
      else if (v == "fp16")
        o.dtype = DType::kFP16;
      else
        usage_error("--dtype: expected bf16 or fp16, got '" + v + "'");
    } else {
      usage_error("unknown argument '" + arg + "'");
    }
  }
  if (runs_given && o.runs < kMinRuns && !o.quick) {
    usage_error("--runs: expected >= " + std::to_string(kMinRuns) +
                " (docs/benchmarking.md) unless --quick, got " + std::to_string(o.runs));
  }
  return o;
}

// What every JSON line of a run repeats: where and at which commit it was measured.
struct RunInfo {
  std::string gpu;
  int sm_clock_mhz = 0;
  int cooldown_ms = 0;
  int driver = 0;
  std::string commit;
  std::string dtype;
  int runs = 0;
};

JsonLine run_fields(const RunInfo& info, JsonLine line) {
  return line.text("gpu", info.gpu)
      .integer("sm_clock_mhz", info.sm_clock_mhz)
      .integer("cooldown_ms", info.cooldown_ms)
      .integer("driver", info.driver)
      .text("commit", info.commit)
      .integer("runs", info.runs)
      .text("date", utc_now_iso8601());
}

void append_or_fail(const std::string& path, const JsonLine& line) {
  if (!append_line(path, line.str())) fail("cannot append to " + path);
}

// "-" for figures a case does not have.
std::string format(double value, const char* fmt, bool present) {
  if (!present) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, fmt, value);
  return buf;
}

// A decode case's figures relative to the baselines; empty where a case has none.
struct Ratios {
  std::optional<double> copy_fraction;  // GB/s over the copy bandwidth (memory-bound cases)
  std::optional<double> speedup;        // FlashMLA H100 time over this time
};

Ratios ratios(const BenchCase& bc, const DecodeResult& r, const CopyResult& copy) {
  Ratios x;
  if (bc.memory_bound()) x.copy_fraction = r.gbps / copy.gbps;
  if (bc.flashmla_h100_us) x.speedup = *bc.flashmla_h100_us / r.time_us;
  return x;
}

// The JSON fields of one decode case, beyond those every line repeats (run_fields).
JsonLine decode_json(const BenchCase& bc, const DecodeResult& r, const CopyResult& copy,
                     const Ratios& x, const std::string& dtype) {
  JsonLine line;
  line.text("op", "mla_decode_dense")
      .text("case", bc.name)
      .text("dtype", dtype)
      .integer("b", bc.b)
      .integer("s_q", bc.s_q)
      .integer("h_q", bc.h_q)
      .integer("h_kv", bc.h_kv)
      .integer("s_k", bc.s_k)
      .number("mean_s_k", r.mean_s_k)
      .integer("page", bc.page)
      .boolean("causal", bc.causal)
      .boolean("varlen", bc.varlen)
      .number("time_us", r.time_us)
      .number("plan_us", r.plan_us)
      .number("combine_us", r.combine_us)
      .number("combine_hot_us", r.combine_hot_us)
      .number("sm_mhz_measured", r.sm_mhz)
      .number("flops", r.flops)
      .number("bytes", r.bytes)
      .number("tflops", r.tflops)
      .number("gbps", r.gbps)
      .text("kernel", r.kernel)
      .number("copy_gbps", copy.gbps)
      .number("copy_fraction", x.copy_fraction)
      .number("baseline_us", bc.flashmla_h100_us)
      .text("baseline", "FlashMLA H100 (fixed figures, docs/benchmarking.md)")
      .number("speedup", x.speedup);
  return line;
}

int run(const Options& opt) {
  const std::vector<BenchCase> cases = filter_cases(bench_cases(opt.quick), opt.filter);
  const std::vector<SparseBenchCase> sparse_cases = sparse_bench_cases(opt.quick, opt.filter);
  const std::vector<PrefillBenchCase> prefill_cases = prefill_bench_cases(opt.quick, opt.filter);
  if (cases.empty() && sparse_cases.empty() && prefill_cases.empty()) {
    usage_error("--filter '" + opt.filter + "' matches no case");
  }

  int device_count = 0;
  const cudaError_t probe = cudaGetDeviceCount(&device_count);
  if (probe != cudaSuccess || device_count == 0) {
    std::fprintf(
        stderr,
        "mlakit-bench: no usable CUDA GPU (cudaGetDeviceCount: %s); the benchmark needs an "
        "NVIDIA GPU of compute capability 8.0 or newer and its driver\n",
        probe != cudaSuccess ? cudaGetErrorString(probe) : "0 devices");
    return 1;
  }
  const int device = 0;
  BENCH_CUDA(cudaSetDevice(device));
  cudaDeviceProp props{};
  BENCH_CUDA(cudaGetDeviceProperties(&props, device));
  RunInfo info;
  info.gpu = props.name;
  int clock_khz = 0;
  BENCH_CUDA(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, device));
  info.sm_clock_mhz = clock_khz / 1000;
  BENCH_CUDA(cudaDriverGetVersion(&info.driver));
  const char* commit = std::getenv("MLAKIT_COMMIT");
  info.commit = commit != nullptr && commit[0] != '\0' ? commit : "unknown";
  info.dtype = dtype_name(opt.dtype);
  info.runs = opt.runs;
  info.cooldown_ms = opt.cooldown_ms;

  std::error_code ec;
  std::filesystem::create_directories(opt.out_dir, ec);
  if (ec) fail("cannot create --out directory " + opt.out_dir + ": " + ec.message());
  const std::string results =
      (std::filesystem::path(opt.out_dir) / (sanitize_file_name(info.gpu) + ".jsonl")).string();

  std::printf("mlakit-bench: %s (%d SMs, sm_%d%d, SM clock %d MHz), driver %d, commit %s\n",
              info.gpu.c_str(), props.multiProcessorCount, props.major, props.minor,
              info.sm_clock_mhz, info.driver, info.commit.c_str());
  std::printf(
      "dtype %s, %d warm-up + %d timed runs per case (median), %zu MB L2 flush before each\n",
      info.dtype.c_str(), kWarmupRounds, opt.runs, support::L2Flusher::kBytes >> 20);
  std::printf("results -> %s\n", results.c_str());

  cudaStream_t stream = nullptr;
  BENCH_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  support::L2Flusher flusher;
  SmClockProbe clock;
  const RunSettings settings{.stream = stream,
                             .flusher = &flusher,
                             .warmup = kWarmupRounds,
                             .runs = opt.runs,
                             .dtype = opt.dtype,
                             .kernel = opt.kernel,
                             .clock = &clock};
  const auto cool_down = [&] {
    BENCH_CUDA(cudaDeviceSynchronize());
    std::this_thread::sleep_for(std::chrono::milliseconds(opt.cooldown_ms));
  };

  const CopyResult copy = measure_copy_bandwidth(settings);
  std::printf("copy bandwidth (device-to-device %zu MB, read + written): %.0f GB/s (%.1f us)\n\n",
              kCopyBytes >> 20, copy.gbps, copy.time_us);
  append_or_fail(results, run_fields(info, JsonLine()
                                               .text("op", "copy_bandwidth")
                                               .number("bytes", copy.bytes)
                                               .number("time_us", copy.time_us)
                                               .number("gbps", copy.gbps)));

  std::printf("%-38s %8s %10s %8s %8s %8s %8s %8s %7s %17s %8s %6s\n", "case", "mean_s_k", "time_us", "plan_us",
              "comb_us", "comb_hot", "TFLOP/s", "GB/s", "%copy", "fixed FlashMLA us", "vs fixed", "MHz");
  for (const BenchCase& bc : cases) {
    cool_down();
    const DecodeResult r = run_decode_case(bc, settings);
    const Ratios x = ratios(bc, r, copy);
    std::printf(
        "%-38s %8.0f %10.1f %8.1f %8.1f %8.1f %8.1f %8.0f %7s %17s %8s %6.0f\n", bc.name.c_str(), r.mean_s_k,
        r.time_us, r.plan_us, r.combine_us, r.combine_hot_us, r.tflops, r.gbps,
        format(100.0 * x.copy_fraction.value_or(0), "%.1f%%", x.copy_fraction.has_value()).c_str(),
        format(bc.flashmla_h100_us.value_or(0), "%.0f", x.speedup.has_value()).c_str(),
        format(x.speedup.value_or(0), "%.3fx", x.speedup.has_value()).c_str(), r.sm_mhz);
    std::fflush(stdout);
    append_or_fail(results, run_fields(info, decode_json(bc, r, copy, x, info.dtype)));
  }
  if (!sparse_cases.empty()) {
    std::printf("\n%-44s %10s %8s %8s %8s %17s %8s %6s\n", "sparse FP8 case", "time_us", "plan_us", "TFLOP/s", "GB/s",
                "fixed FlashMLA us", "vs fixed", "MHz");
  }
  for (const SparseBenchCase& sc : sparse_cases) {
    cool_down();
    const SparseResult r = run_sparse_case(sc, settings);
    const bool has_baseline = sc.flashmla_h100_us.has_value();
    const double speedup = has_baseline ? *sc.flashmla_h100_us / r.time_us : 0.0;
    std::printf("%-44s %10.1f %8.1f %8.1f %8.0f %17s %8s %6.0f\n", sc.name.c_str(), r.time_us, r.plan_us, r.tflops,
                r.gbps, format(sc.flashmla_h100_us.value_or(0), "%.0f", has_baseline).c_str(),
                format(speedup, "%.3fx", has_baseline).c_str(), r.sm_mhz);
    std::fflush(stdout);
    JsonLine line;
    line.text("op", "mla_decode_sparse_fp8")
        .text("case", sc.name)
        .text("dtype", "bf16")
        .integer("b", sc.b)
        .integer("s_q", sc.s_q)
        .integer("h_q", sc.h_q)
        .integer("h_kv", 1)
        .integer("topk", sc.topk)
        .integer("s_k", sc.s_k)
        .integer("page", sc.page)
        .boolean("causal", false)
        .boolean("varlen", false)
        .number("time_us", r.time_us)
        .number("plan_us", r.plan_us)
        .number("sm_mhz_measured", r.sm_mhz)
        .number("flops", r.flops)
        .number("bytes", r.bytes)
        .number("tflops", r.tflops)
        .number("gbps", r.gbps)
        .text("kernel", r.kernel)
        .number("copy_gbps", copy.gbps)
        .number("baseline_us", sc.flashmla_h100_us)
        .text("baseline", "FlashMLA H100 (fixed figures, docs/benchmarking.md)")
        .number("speedup", has_baseline ? std::optional<double>(speedup) : std::nullopt);
    append_or_fail(results, run_fields(info, line));
  }
  if (!prefill_cases.empty()) {
    std::printf("\n%-52s %10s %8s %8s %17s %8s %6s\n", "sparse prefill case", "time_us", "TFLOP/s", "GB/s",
                "fixed FlashMLA us", "vs fixed", "MHz");
  }
  for (const PrefillBenchCase& pc : prefill_cases) {
    cool_down();
    const PrefillResult r = run_prefill_case(pc, settings);
    const bool has_baseline = pc.flashmla_h100_us.has_value();
    const double speedup = has_baseline ? *pc.flashmla_h100_us / r.time_us : 0.0;
    std::printf("%-52s %10.1f %8.1f %8.0f %17s %8s %6.0f\n", pc.name.c_str(), r.time_us, r.tflops, r.gbps,
                format(pc.flashmla_h100_us.value_or(0), "%.0f", has_baseline).c_str(),
                format(speedup, "%.3fx", has_baseline).c_str(), r.sm_mhz);
    std::fflush(stdout);
    append_or_fail(results, run_fields(info, prefill_json(pc, r, copy.gbps)));
  }
  std::printf(
      "\ntime_us: mla_decode (attention + combine), paid by every layer; plan_us: "
      "mla_decode_plan, made once per step and reused by every layer, so timed apart;\n"
      "comb_us: the combine kernel alone (part of time_us), L2 flushed; comb_hot: the same with its partials\n"
      "left in L2, as inside a step right after the attention wrote them.\n");
  std::printf(
      "fixed FlashMLA us: FlashMLA's H100 figures of docs/benchmarking.md, measured another day on other random draws;\n"
      "vs fixed = that time / this time: context, NOT a comparison. Side-by-side ratios (same tensors, same\n"
      "process, alternating) come from bench/compare.py (docs/benchmarking.md).\n"
      "%%copy: GB/s of a memory-bound case as a fraction of this run's copy bandwidth.\n"
      "MHz: median SM clock probed between the timed rounds (the power manager lowers it after sustained work).\n");

  BENCH_CUDA(cudaStreamDestroy(stream));
  return 0;
}

}  // namespace
}  // namespace mlakit::bench

int main(int argc, char** argv) {
  try {
    return mlakit::bench::run(mlakit::bench::parse_options(argc, argv));
  } catch (const std::exception& e) {  // CUDA failures inside the shared support code
    mlakit::bench::fail(e.what());
  }
}
