// Stress test of the sparse FP8 MLA decode (issue 23): many small problems, each called
// knobs().calls times on the same tensors with one plan. Every byte of every cache token no
// counted index lists is 0xFF (NaN wherever it is read); outputs and the plan's partial results
// are poisoned before every call; call 0 is checked against the float64 reference (docs/contract.md) and
// every later call bit for bit against call 0.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "gpu_test_util.h"
#include "host/decode_layout.h"
#include "host/device.h"
#include "mlakit/mla_sparse_decode.h"
#include "stress_test_util.h"
#include "support/accuracy.h"
#include "support/sparse_decode_case.h"

namespace mlakit::testing {
namespace {

using stress::CaseRng;

constexpr uint64_t kSalt = 0x5ba75e;
// Float64 multiply-adds of a random case's reference (b * s_q * h_q * keys * 1088), about
// 0.1 s on one core: it bounds topk of the larger random problems.
constexpr double kReferenceBudget = 1e8;
constexpr int64_t kMaxRandomTokens = 16384;  // cache tokens of a random case

// The plan a coverage case is built to get; kWholeParts: whole sequences per part (no_splits,
// no combine).
enum class Expect { kAny, kSplit, kUnsplit, kWholeParts };

struct SparseCase {
  support::SparseCaseSpec spec;
  Expect expect = Expect::kAny;
  // The race reproducer's layout (list_distinct_tokens_per_sequence) instead of
  // make_sparse_case's random slots.
  bool distinct_per_sequence = false;

  std::string name(int index) const {
    std::ostringstream s;
    s << "case " << index << " (b" << spec.b << "_sq" << spec.s_q << "_hq" << spec.h_q << "_topk" << spec.topk
      << "_page" << spec.page_size << "_blocks" << spec.num_blocks << (spec.with_topk_length ? "_len" : "")
      << (spec.v4 ? "_v4" : "");
    if (spec.extra_topk > 0) {
      s << "_extra" << spec.extra_topk << "_page" << spec.extra_page_size << (spec.with_extra_topk_length ? "_len" : "");
    }
    s
      << (spec.with_sink ? "_sink" : "") << (distinct_per_sequence ? "_distinct" : "") << "_seed" << spec.seed
      << ")";
    return s.str();
  }
};

SparseCase make_case(int64_t b, int s_q, int h_q, int topk, int64_t page, int64_t num_blocks, bool with_length,
                     bool with_sink, Expect expect, uint64_t seed) {
  return SparseCase{{.b = b, .s_q = s_q, .h_q = h_q, .topk = topk, .num_blocks = num_blocks, .page_size = page,
                     .with_topk_length = with_length, .with_sink = with_sink, .seed = seed},
                    expect};
}

// A DeepSeek V4 case: topk over a cache of `page` tokens per block (2 * topk tokens), and
// extra_topk (0: none) over a second cache of `extra_page`, lengths on both.
SparseCase v4_case(int64_t b, int s_q, int h_q, int topk, int64_t page, int extra_topk, int64_t extra_page,
                   Expect expect, uint64_t seed) {
  SparseCase c = make_case(b, s_q, h_q, topk, page, (2 * topk + page - 1) / page, true, true, expect, seed);
  c.spec.v4 = true;
  c.spec.extra_topk = extra_topk;
  c.spec.extra_page_size = extra_page;
  c.spec.extra_num_blocks = (2 * std::max(extra_topk, 64) + extra_page - 1) / extra_page;
  c.spec.with_extra_topk_length = extra_topk > 0;
  return c;
}

// Sequences of topk 128 (two key blocks) that the plan lays out two whole ones per part, no
// split, no combine (detail::whole_sequence_parts with sequences = 2 * parts): the benchmark's
// schedule (b 64 / 128, topk 2048) at small scale. The count depends on the kernel and the SMs.
int64_t whole_parts_sequences(MlaKernel kernel, int h_q) {
  detail::DeviceInfo dev;
  if (!detail::current_device_info(&dev)) return 2;
  const MlaDecodeProblem per_token{.b = 1, .s_q = 1, .h_q = h_q, .h_kv = 1};
  return 2 * detail::decode_num_parts(per_token, detail::decode_kernel_traits(kernel), dev.sm_count);
}

// First in every run, so that a few cases reach every kernel instance: the race reproducer of
// fb4eece, FlashMLA's shape at small scale, h_q 16 / 32 / 64 / 96 (Q by cp.async on the sm90
// kernel) / 128, pages 64 and others (1, 16, 53, 256), topk 64 to 4096 (65: a one-key last
// block), topk_length, the sink, split plans, unsplit ones and whole-sequence ones.
std::vector<SparseCase> coverage_cases(MlaKernel kernel) {
  // Race reproducer: b 2, h_q 128, 4096 tokens per sequence in shuffled pages of 64, 2048
  // distinct valid indices per row, NaN in every unlisted token.
  SparseCase race = make_case(2, 1, 128, 2048, 64, 128, false, false, Expect::kSplit, 1);
  race.distinct_per_sequence = true;
  const int64_t whole = whole_parts_sequences(kernel, 64);
  return {
      race,
      make_case(2, 2, 128, 2048, 64, 96, true, true, Expect::kAny, 2),  // FlashMLA's shape, small b
      make_case(3, 2, 64, 576, 64, 40, false, true, Expect::kSplit, 3),
      make_case(2, 3, 32, 100, 53, 10, true, false, Expect::kAny, 4),
      make_case(8, 4, 16, 64, 1, 400, false, false, Expect::kWholeParts, 5),
      make_case(4, 1, 128, 64, 256, 2, true, true, Expect::kUnsplit, 6),
      make_case(2, 2, 96, 300, 64, 12, false, true, Expect::kSplit, 7),
      make_case(whole / 2, 2, 64, 128, 64, 20, false, false, Expect::kWholeParts, 8),
      make_case(1, 2, 16, 4096, 32, 200, true, false, Expect::kAny, 9),  // token 0 lists nothing valid
      make_case(5, 2, 32, 65, 16, 12, false, true, Expect::kSplit, 10),
      v4_case(2, 2, 64, 128, 256, 512, 64, Expect::kAny, 11),  // FlashMLA's V4 shape, small b
      v4_case(3, 1, 128, 2048, 64, 0, 64, Expect::kSplit, 12),
      v4_case(4, 4, 16, 64, 2, 1024, 2, Expect::kAny, 13),
  };
}

SparseCase random_case(int index) {
  CaseRng r(kSalt, index);
  SparseCase c;
  support::SparseCaseSpec& s = c.spec;
  s.b = r.uniform(1, 8);
  s.s_q = r.uniform(1, 4);
  s.h_q = r.pick({16, 32, 64, 96, 128});
  const double per_key = static_cast<double>(s.b) * s.s_q * s.h_q * 1088;
  const int cap = static_cast<int>(std::clamp(kReferenceBudget / per_key, 64.0, 4096.0));
  s.topk = r.chance(0.4) ? 64 * r.uniform(1, cap / 64) : r.uniform(64, cap);
  s.page_size = r.chance(0.5) ? 64 : r.pick({1, 16, 32, 53, 128, 256, r.uniform(1, 256)});
  // From topk to 4 * topk tokens: small caches are listed almost whole, larger ones leave many
  // unlisted (NaN) tokens among the listed ones.
  const int64_t tokens = std::clamp<int64_t>(static_cast<int64_t>(s.topk) * r.uniform(1, 4), 64, kMaxRandomTokens);
  s.num_blocks = (tokens + s.page_size - 1) / s.page_size;
  s.with_topk_length = r.chance(0.4);
  s.with_sink = r.chance(0.4);
  s.v4 = r.chance(0.4);
  if (r.chance(0.4)) {  // a second cache: its own page size and (part of the key budget) topk
    s.extra_topk = r.uniform(1, std::max(1, s.topk / 2));
    s.extra_page_size = r.pick({1, 2, 61, 64, 69, 576});
    s.extra_num_blocks = (std::clamp<int64_t>(2 * s.extra_topk, 64, kMaxRandomTokens) + s.extra_page_size - 1) /
                         s.extra_page_size;
    s.with_extra_topk_length = r.chance(0.5);
  }
  s.seed = r.seed();
  return c;
}

// The race reproducer's indices: sequence i owns num_blocks / b pages of the cache through a
// shuffled block table, and each of its rows lists topk distinct tokens of them.
void list_distinct_tokens_per_sequence(support::HostSparseCase* c) {
  const support::SparseCaseSpec& s = c->spec;
  const int64_t blocks_per_seq = s.num_blocks / s.b;
  if (s.topk > blocks_per_seq * s.page_size) throw std::invalid_argument("topk exceeds a sequence's tokens");
  std::mt19937_64 rng(s.seed);
  std::vector<int32_t> table(s.num_blocks), positions(blocks_per_seq * s.page_size);
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), rng);
  for (int64_t i = 0; i < s.b; ++i) {
    for (int t = 0; t < s.s_q; ++t) {
      std::iota(positions.begin(), positions.end(), 0);
      std::shuffle(positions.begin(), positions.end(), rng);
      int32_t* row = c->main.indices.data() + (i * s.s_q + t) * s.topk;
      for (int k = 0; k < s.topk; ++k) {
        const int32_t pos = positions[k];
        row[k] = static_cast<int32_t>(table[i * blocks_per_seq + pos / s.page_size] * s.page_size + pos % s.page_size);
      }
    }
  }
}

void run_case(const SparseCase& sc, const std::string& name, MlaKernel kernel, stress::Tally* tally) {
  support::HostSparseCase hc = support::make_sparse_case(sc.spec);
  if (sc.distinct_per_sequence) list_distinct_tokens_per_sequence(&hc);
  if (hc.spec.with_topk_length && hc.spec.b >= 3) {
    hc.main.lengths[1] = 1;  // one key
    hc.main.lengths[2] = 0;  // an empty sequence: written by the combine
  }
  support::poison_unlisted_tokens(hc);
  const support::SparseReferenceResult ref = support::run_sparse_reference(hc);
  ASSERT_FALSE(stress::has_nan(ref.out) || stress::has_nan(ref.lse)) << name << ": the reference has NaN";

  // Optional inputs get a buffer of at least one element (not read when the spec has none).
  auto upload = [](const auto& host) {
    DeviceBuffer d(std::max<size_t>(host.size() * sizeof(host[0]), 16));
    if (!host.empty()) d.upload(host.data(), host.size() * sizeof(host[0]));
    return d;
  };
  DeviceBuffer q(hc.q), cache(hc.main.bytes), indices(hc.main.indices), out(hc.out_elems() * 2), lse(hc.lse_elems() * 4);
  DeviceBuffer topk_length = upload(hc.main.lengths), sink = upload(hc.sink);
  DeviceBuffer extra_cache = upload(hc.extra.bytes), extra_indices = upload(hc.extra.indices),
               extra_lengths = upload(hc.extra.lengths);
  MlaSparseDecodeArgs args = hc.args(q.get(), cache.get(), indices.get(), topk_length.get(), sink.get(), out.get(),
                                     DType::kBF16, lse.get());
  hc.with_extra(&args, extra_cache.get(), extra_indices.get(), extra_lengths.get());
  MlaSparseDecodeProblem problem = hc.problem();
  problem.kernel = kernel;
  std::size_t bytes = 0;
  Status s = mla_sparse_decode_workspace_size(problem, &bytes);
  ASSERT_TRUE(s) << name << ": " << s.to_string();
  DeviceBuffer workspace(bytes);
  MlaDecodePlan plan;
  s = mla_sparse_decode_plan(problem, args.topk_length, args.extra_topk_length, workspace.get(), bytes, nullptr, &plan);
  ASSERT_TRUE(s) << name << ": " << s.to_string();
  ASSERT_EQ(plan.kernel, kernel) << name;
  const bool split = stress::plan_splits(plan);
  if (sc.expect == Expect::kWholeParts) {
    EXPECT_TRUE(plan.no_splits && !split) << name << ": the coverage case lost its whole-sequence plan";
  } else if (sc.expect != Expect::kAny) {
    EXPECT_EQ(split, sc.expect == Expect::kSplit) << name << ": the coverage case lost its " << (split ? "un" : "")
                                                  << "split plan";
  }

  const auto check = [&](const stress::OutputBytes& got) {
    const std::vector<uint16_t> o = stress::from_bytes<uint16_t>(got[0]);
    std::string bad = stress::verdict(support::check_half_outputs(o, ref.out, DType::kBF16, "out"));
    if (bad.empty()) bad = stress::check_exact_zeros(o, ref.out, "out");
    if (bad.empty()) bad = stress::verdict(support::check_float_stats(stress::from_bytes<float>(got[1]), ref.lse, "lse"));
    return bad;
  };
  const stress::RepeatResult r = stress::run_repeated(
      {{"out", &out}, {"lse", &lse}}, &plan, [&] { return mla_sparse_decode_fp8(args, plan, nullptr); }, check);
  tally->add(r, split);
  EXPECT_TRUE(r.failure.empty()) << name << ", kernel " << stress::kernel_name(kernel) << ": " << r.failure;
}

class SparseDecode : public ::testing::TestWithParam<MlaKernel> {};

TEST_P(SparseDecode, RepeatedCallsAreExactAndCorrect) {
  const MlaKernel kernel = GetParam();
  if (const std::string why = stress::why_kernel_cannot_run(kernel); !why.empty()) GTEST_SKIP() << why;
  const std::vector<SparseCase> coverage = coverage_cases(kernel);
  stress::Tally tally("sparse decode", kernel);
  for (int i = 0; i < stress::knobs().cases; ++i) {
    const SparseCase sc = i < static_cast<int>(coverage.size()) ? coverage[i] : random_case(i);
    run_case(sc, sc.name(i), kernel, &tally);
    if (HasFatalFailure() || tally.failed_cases() >= stress::kMaxFailedCases) break;
  }
  tally.print();
}

INSTANTIATE_TEST_SUITE_P(Stress, SparseDecode, ::testing::Values(MlaKernel::kPortable, MlaKernel::kSm90),
                         stress::kernel_param_name);

}  // namespace
}  // namespace mlakit::testing
