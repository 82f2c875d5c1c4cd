// The GPU GQA decode against the float64 CPU reference (reference::gqa_decode on host copies of
// the inputs, the caches as they were before the append) over a sweep of head dims, h_q / h_kv
// ratios, s_q, page sizes, lengths (0 to 100k), q dtypes, cache formats, the append, RoPE,
// masks, ALiBi, softcap, finished entries, lse and strided views; and the edge cases: empty
// problems and rows, finished entries, out-of-range block ids. NaN fills every cache slot the
// step does not read and the outputs before each call; each case is called several times on
// the same inputs and must repeat its bytes (tests/gpu/gqa_test_util.h has the checks).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "gpu_test_util.h"
#include "gqa_test_util.h"

namespace mlakit::testing {
namespace {

constexpr int kCalls = 3;  // calls per case on the same inputs
// Float64 multiply-adds a sweep case's reference may cost (b * s_q * h_q * d * 4 per cached
// token): it caps the lengths of the wide small cases; the long cases are listed on their own.
constexpr double kReferenceBudget = 2e8;

struct SweepCase {
  GqaShape shape;
  GqaOptions opt;
  bool long_case = false;  // few (entry, kv head) pairs with L >= 8k: the plan must split
};

void PrintTo(const SweepCase& c, std::ostream* os) { *os << gqa_case_name(c.shape, c.opt); }

RotaryEmbedding rope_variant(int k, int d) {
  switch (k % 5) {
    case 1: return {RopeStyle::kNeox, 10000.0, 0};
    case 2: return {RopeStyle::kNeox, 10000.0, d / 2};
    case 3: return {RopeStyle::kGptj, 10000.0, 0};
    case 4: return {RopeStyle::kGptj, 500.0, 32};
    default: return {};
  }
}

// Every (d, cache format, h_q / h_kv ratio) with the other choices drawn from one fixed-seed
// generator (RoPE cycles through its five variants), then hand-picked cases: long sequences
// (split plans), the widest group, empty rows under causal + window.
std::vector<SweepCase> sweep_cases() {
  const GqaFormat formats[] = {GqaFormat::kHalf, GqaFormat::kInt8, GqaFormat::kFp8Token, GqaFormat::kFp8Tensor};
  std::vector<SweepCase> cases;
  std::mt19937 r(2024);
  auto pick = [&r](std::initializer_list<int> v) { return v.begin()[r() % v.size()]; };
  int index = 0;
  for (int d : {64, 128, 256}) {
    for (GqaFormat format : formats) {
      for (int ratio : {1, 4, 8, 16}) {
        SweepCase c;
        GqaShape& s = c.shape;
        GqaOptions& o = c.opt;
        s.d = d;
        s.format = format;
        s.h_kv = pick({1, 1, 2, 3, 4, 5, 8});
        s.h_q = ratio * s.h_kv;
        s.s_q = pick({1, 2, 3, 4, 5, 6, 7, 8});
        s.page = pick({1, 16, 64, 100});
        s.q_dtype = r() % 2 ? DType::kFP16 : DType::kBF16;
        s.append = r() % 2;
        s.seed = 7 + index;
        const int b = pick({1, 2, 3, 5});
        const double per_token = 4.0 * b * s.s_q * s.h_q * d;
        const int max_len = std::min(pick({17, 64, 150, 300, 700, 2000}), static_cast<int>(kReferenceBudget / per_token));
        s.lengths = gqa_lengths(b, s.s_q, s.append, s.page, std::max(max_len, s.page + 2), 31 + index);
        o.rope = rope_variant(index, d);
        o.causal = s.s_q > 1 && r() % 2;
        o.window = r() % 4 == 0 ? pick({1, 7, 64}) : 0;
        o.alibi = r() % 4 == 0;
        o.finished = r() % 5 == 0;
        o.lse = r() % 4 != 0;
        o.strided = r() % 3 == 0;
        if (r() % 5 == 0) {
          o.softcap = 1.f;
          o.softmax_scale = 1.f;  // logits of std ~1: the cap bends them
        } else if (r() % 5 == 0) {
          o.softmax_scale = 2.f;  // a peaked softmax
        }
        cases.push_back(c);
        ++index;
      }
    }
  }
  using F = GqaFormat;
  constexpr DType kBF16 = DType::kBF16, kFP16 = DType::kFP16;
  // Long sequences, one or two (entry, kv head) pairs: split-KV.
  cases.push_back({{{100000}, 1, 8, 1, 128, 64, F::kHalf, kBF16, false, 1}, {}, true});
  cases.push_back({{{16384, 9000}, 4, 8, 2, 64, 16, F::kInt8, kFP16, true, 2},
                   {.rope = {RopeStyle::kNeox, 10000.0, 0}, .causal = true},
                   true});
  cases.push_back({{{12000}, 2, 16, 1, 256, 100, F::kFp8Tensor, kBF16, false, 3},
                   {.rope = {RopeStyle::kGptj, 10000.0, 64}, .window = 4096, .alibi = true},
                   true});
  cases.push_back({{{8192}, 1, 16, 4, 128, 1, F::kFp8Token, kFP16, true, 4},
                   {.softcap = 1.f, .strided = true, .softmax_scale = 1.f},
                   true});
  // The widest group: 8 kv heads of 16 query heads each, 8 tokens.
  cases.push_back({{gqa_lengths(3, 8, true, 64, 200, 5), 8, 128, 8, 128, 64, F::kFp8Token, kBF16, true, 5},
                   {.rope = {RopeStyle::kNeox, 10000.0, 0}, .causal = true, .lse = true}});
  // Lengths below s_q without the append: rows before position 0 are empty.
  cases.push_back({{{0, 1, 2, 7}, 8, 8, 2, 64, 16, F::kHalf, kFP16, false, 6},
                   {.causal = true, .window = 3, .finished = true}});
  return cases;
}

class GqaDecodeSweep : public ::testing::TestWithParam<SweepCase> {};

TEST_P(GqaDecodeSweep, MatchesReference) {
  MLAKIT_SKIP_WITHOUT_GPU();
  const SweepCase& sc = GetParam();
  GqaGpuCase c(sc.shape, sc.opt);
  const Status ref = c.run_reference();
  ASSERT_TRUE(ref) << ref.to_string();
  ASSERT_EQ(c.reference_sanity(), "");
  const GqaCalls calls = call_gqa(c, kCalls);
  EXPECT_EQ(check_calls(c, calls), "");
  if (sc.long_case) {
    EXPECT_TRUE(calls.split) << "a long sequence with few (entry, kv head) pairs was not split";
  }
}

INSTANTIATE_TEST_SUITE_P(Sweep, GqaDecodeSweep, ::testing::ValuesIn(sweep_cases()),
                         [](const ::testing::TestParamInfo<SweepCase>& info) {
                           return gqa_case_name(info.param.shape, info.param.opt) + "_" + std::to_string(info.index);
                         });

// Runs one case (reference first unless `reference` is false) and checks kCalls calls.
void expect_case_passes(GqaGpuCase& c, bool reference = true) {
  if (reference) {
    const Status ref = c.run_reference();
    ASSERT_TRUE(ref) << ref.to_string();
  }
  EXPECT_EQ(check_calls(c, call_gqa(c, kCalls)), "");
}

// b = 0 and s_q = 0: valid, nothing appended or written (the caches keep every byte).
TEST(GqaDecodeEdge, EmptyProblemsAreNoOps) {
  MLAKIT_SKIP_WITHOUT_GPU();
  const GqaOptions all{.rope = {RopeStyle::kNeox, 10000.0, 0}, .causal = true, .window = 4, .alibi = true,
                       .finished = true, .strided = true};
  for (const GqaShape& shape : {GqaShape{.lengths = {}, .s_q = 2, .h_q = 8, .h_kv = 2, .append = true},
                                GqaShape{.lengths = {5, 9, 0}, .s_q = 0, .h_q = 8, .h_kv = 2, .append = true},
                                GqaShape{.lengths = {5, 9}, .s_q = 0, .format = GqaFormat::kInt8},
                                GqaShape{.lengths = {}, .s_q = 1, .format = GqaFormat::kFp8Tensor}}) {
    for (const GqaOptions& opt : {GqaOptions{}, all}) {
      SCOPED_TRACE(gqa_case_name(shape, opt));
      GqaGpuCase c(shape, opt);
      expect_case_passes(c, /*reference=*/false);  // the expected caches: the inputs
    }
  }
}

// h_q = 0 is not an empty problem: no output row, but k_new / v_new are appended.
TEST(GqaDecodeEdge, NoQueryHeadsStillAppends) {
  MLAKIT_SKIP_WITHOUT_GPU();
  GqaGpuCase c({.lengths = {5, 40}, .s_q = 2, .h_q = 0, .h_kv = 2, .format = GqaFormat::kInt8, .append = true},
               {.rope = {RopeStyle::kGptj, 10000.0, 0}});
  expect_case_passes(c);
}

// Rows with no visible key (L = 0; causal with L - s_q + t < 0): out exactly 0, lse +inf.
TEST(GqaDecodeEdge, EmptyRowsAreZeroWithInfiniteLse) {
  MLAKIT_SKIP_WITHOUT_GPU();
  for (bool causal : {false, true}) {
    GqaGpuCase c({.lengths = {0, 1, 3, 9}, .s_q = 4, .h_q = 8, .h_kv = 2, .format = GqaFormat::kFp8Token},
                 {.causal = causal, .strided = causal});
    ASSERT_TRUE(c.run_reference());
    const int64_t empty = std::count(c.host.lse.begin(), c.host.lse.end(), INFINITY);
    EXPECT_EQ(empty, (causal ? 4 + 3 + 1 : 4) * 8) << "the case lost its empty rows";
    expect_case_passes(c, /*reference=*/false);
  }
}

// Finished entries: out, lse and their cache slots keep every byte (the poison, the inputs).
TEST(GqaDecodeEdge, FinishedEntriesAreUntouched) {
  MLAKIT_SKIP_WITHOUT_GPU();
  for (const std::vector<int32_t>& lengths : {std::vector<int32_t>{40, 77, 5, 19, 300}, std::vector<int32_t>{33}}) {
    GqaGpuCase c({.lengths = lengths, .s_q = 3, .h_q = 16, .h_kv = 4, .page = 16, .format = GqaFormat::kInt8,
                  .q_dtype = DType::kFP16, .append = true},
                 {.rope = {RopeStyle::kNeox, 10000.0, 0}, .causal = true, .finished = true, .strided = true});
    expect_case_passes(c);
  }
}

// Block ids outside [0, num_blocks) are never dereferenced: the rows that would read them are
// NaN (only theirs), and an append that lands there is dropped (the caches keep every byte).
TEST(GqaDecodeEdge, OutOfRangeBlocksGiveNanRowsOnlyForTheirEntry) {
  MLAKIT_SKIP_WITHOUT_GPU();
  GqaGpuCase c({.lengths = {50, 70, 30}, .s_q = 2, .h_q = 8, .h_kv = 2, .d = 64, .page = 16,
                .format = GqaFormat::kInt8, .append = true},
               {});
  const int mb = c.host.s.max_blocks;
  c.host.table[1 * mb + 0] = static_cast<int32_t>(c.host.num_blocks + 5);  // entry 1 reads it
  c.host.table[2 * mb + 1] = -3;  // entry 2 appends at positions 28, 29 there and reads it
  c.table.upload(c.host.table.data(), c.host.table.size() * 4);
  ASSERT_TRUE(c.run_reference());
  const int64_t row = 2 * 8 * 64;  // one entry's out elements
  ASSERT_FALSE(std::isnan(c.host.out[0]));
  ASSERT_TRUE(std::isnan(c.host.out[row]) && std::isnan(c.host.out[2 * row]));
  expect_case_passes(c, /*reference=*/false);  // NaN exactly where the reference has it
}

}  // namespace
}  // namespace mlakit::testing
