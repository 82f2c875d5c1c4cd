// reference::merge_states (include/mlakit/merge.h) against the two-state float64 merge chained
// over the states (an independent formula), its edge cases (empty and NaN states, bases, in
// place, strided views), and the validation every entry point shares (each error names the
// argument). The GPU entry's validation without a GPU is checked at the end.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "common/math_constants.h"
#include "cpu_test_util.h"
#include "mlakit/merge.h"
#include "mlakit/reference.h"
#include "reference/host_numeric.h"
#include "support/merge_case.h"

namespace mlakit::testing {
namespace {

using support::HostMergeCase;
using support::MergeCall;
using support::MergeSpec;

struct Outputs {
  std::vector<float> out;  // float32 out: the unrounded merge
  std::vector<float> lse;
};

Outputs run_reference(const HostMergeCase& c, DType out_dtype = DType::kFP32) {
  MergeSpec spec = c.spec;
  Outputs r;
  r.out.assign(c.out_elements(), -7.f);
  r.lse.assign(c.rows, -7.f);
  std::vector<uint16_t> half(c.out_elements());
  void* out = out_dtype == DType::kFP32 ? static_cast<void*>(r.out.data()) : half.data();
  MergeCall call(c, c.o.data(), c.lse.data(), out, r.lse.data());
  call.args.out.dtype = out_dtype;
  const Status s = reference::merge_states(call.args);
  EXPECT_TRUE(s) << s.to_string();
  if (out_dtype != DType::kFP32) {
    for (int64_t i = 0; i < c.out_elements(); ++i) r.out[i] = host::load_half(half.data(), i, out_dtype);
  }
  return r;
}

// The expected merge of row r: reference::merge_states of two double states, over the states
// in order (natural log inside).
struct RowExpectation {
  std::vector<double> o;
  double lse;
};
RowExpectation chained_merge(const HostMergeCase& c, int64_t r) {
  const int64_t d = c.spec.d;
  RowExpectation acc{std::vector<double>(d, 0.0), -std::numeric_limits<double>::infinity()};
  const double to_natural = c.spec.lse_base == LseBase::kBase2 ? detail::kLn2 : 1.0;
  for (int s = 0; s < c.spec.num_states; ++s) {
    const TensorRef o = c.o_view(c.o.data(), s), lse = c.lse_view(c.lse.data(), s);
    // Row r of the views: index tuple from the row shape.
    int64_t rest = r, o_at = 0, lse_at = 0;
    for (int i = static_cast<int>(c.spec.row_shape.size()) - 1; i >= 0; --i) {
      const int64_t idx = rest % c.spec.row_shape[i];
      rest /= c.spec.row_shape[i];
      o_at += idx * o.stride[i];
      lse_at += idx * lse.stride[i];
    }
    const double l = static_cast<double>(static_cast<const float*>(lse.data)[lse_at]) * to_natural;
    std::vector<double> state(d);
    for (int64_t j = 0; j < d; ++j) {
      state[j] = c.spec.in_dtype == DType::kFP32 ? static_cast<const float*>(o.data)[o_at + j]
                                                  : host::load_half(o.data, o_at + j, c.spec.in_dtype);
    }
    if (std::isinf(l)) std::fill(state.begin(), state.end(), 0.0);  // NaN there: never read
    double merged_lse = 0;
    EXPECT_TRUE(reference::merge_states(acc.o.data(), acc.lse, state.data(), l, d, acc.o.data(), &merged_lse));
    acc.lse = merged_lse;
  }
  if (c.spec.out_lse_base == LseBase::kBase2 && std::isfinite(acc.lse)) acc.lse *= detail::kLog2e;
  return acc;
}

void expect_matches_chained_merge(const MergeSpec& spec) {
  const HostMergeCase c(spec);
  const Outputs got = run_reference(c);
  for (int64_t r = 0; r < c.rows; ++r) {
    const RowExpectation want = chained_merge(c, r);
    if (std::isinf(want.lse)) {
      ASSERT_EQ(got.lse[r], want.lse) << "row " << r << " " << describe(spec);
    } else {
      ASSERT_NEAR(got.lse[r], want.lse, 1e-6 * std::fmax(1.0, std::fabs(want.lse)))
          << "row " << r << " " << describe(spec);
    }
    for (int64_t j = 0; j < spec.d; ++j) {
      ASSERT_NEAR(got.out[r * spec.d + j], want.o[j], 1e-6 * std::fmax(1.0, std::fabs(want.o[j])))
          << "row " << r << " element " << j << " " << describe(spec);
    }
  }
}

TEST(MergeStatesReference, MatchesTheTwoStateMergeChainedOverTheStates) {
  const std::vector<MergeSpec> specs = {
      {.num_states = 1, .row_shape = {7}, .d = 16},
      {.num_states = 2, .row_shape = {5, 3}, .d = 64, .in_dtype = DType::kFP32},
      {.num_states = 3, .row_shape = {2, 3, 4}, .d = 8, .in_dtype = DType::kFP16, .empty_fraction = 0.5},
      {.num_states = 8, .row_shape = {4, 6}, .d = 32, .row_pad = 5, .transposed_lse = true},
      {.num_states = 5, .row_shape = {3, 5, 2}, .d = 12, .transposed_lse = true, .seed = 3},
      {.num_states = 4, .row_shape = {9}, .d = 24, .lse_base = LseBase::kBase2},
      {.num_states = 4, .row_shape = {9}, .d = 24, .lse_base = LseBase::kBase2, .out_lse_base = LseBase::kBase2},
      {.num_states = 4, .row_shape = {9}, .d = 24, .out_lse_base = LseBase::kBase2},
      {.num_states = 128, .row_shape = {3}, .d = 4, .empty_fraction = 0.9},
  };
  for (const MergeSpec& spec : specs) expect_matches_chained_merge(spec);
}

TEST(MergeStatesReference, EmptyStatesContributeNothingAndAllEmptyRowsAreZeroAndInfinity) {
  MergeSpec spec{.num_states = 3, .row_shape = {4}, .d = 8, .in_dtype = DType::kFP32, .empty_fraction = 0};
  HostMergeCase c(spec);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // Row 0: state 1 empty (-inf) with NaN values; row 1: every state empty (+inf, -inf, +inf).
  c.lse[1 * c.rows + 0] = -INFINITY;
  for (int s = 0; s < 3; ++s) c.lse[s * c.rows + 1] = s == 1 ? -INFINITY : INFINITY;
  for (int64_t j = 0; j < 8; ++j) {
    host::store_as<float>(c.o.data(), 1 * c.o_state_stride + 0 * 8 + j, nan);
    for (int s = 0; s < 3; ++s) host::store_as<float>(c.o.data(), s * c.o_state_stride + 1 * 8 + j, nan);
  }
  const Outputs got = run_reference(c);
  for (int64_t j = 0; j < 8; ++j) {
    EXPECT_FALSE(std::isnan(got.out[0 * 8 + j])) << j;
    EXPECT_EQ(got.out[1 * 8 + j], 0.f) << j;
  }
  EXPECT_TRUE(std::isfinite(got.lse[0]));
  EXPECT_EQ(got.lse[1], INFINITY);
  // Row 0 is the merge of states 0 and 2 alone.
  const RowExpectation want = chained_merge(c, 0);
  EXPECT_NEAR(got.lse[0], want.lse, 1e-5);
}

TEST(MergeStatesReference, ANanLseMakesItsRowNan) {
  HostMergeCase c(MergeSpec{.num_states = 2, .row_shape = {3}, .d = 4, .in_dtype = DType::kFP32, .empty_fraction = 0});
  c.lse[c.rows + 2] = std::numeric_limits<float>::quiet_NaN();
  const Outputs got = run_reference(c);
  EXPECT_TRUE(std::isnan(got.lse[2]));
  for (int64_t j = 0; j < 4; ++j) EXPECT_TRUE(std::isnan(got.out[2 * 4 + j]));
  EXPECT_TRUE(std::isfinite(got.lse[1]));
}

TEST(MergeStatesReference, ALoneStateIsReturnedExactlyInItsBase) {
  for (LseBase base : {LseBase::kNatural, LseBase::kBase2}) {
    HostMergeCase c(MergeSpec{.num_states = 1, .row_shape = {6}, .d = 8, .in_dtype = DType::kFP32,
                              .lse_base = base, .out_lse_base = base, .empty_fraction = 0});
    const Outputs got = run_reference(c);
    for (int64_t r = 0; r < c.rows; ++r) {
      EXPECT_EQ(got.lse[r], c.lse[r]);
      for (int64_t j = 0; j < 8; ++j) EXPECT_EQ(got.out[r * 8 + j], host::load_as<float>(c.o.data(), r * 8 + j));
    }
  }
}

TEST(MergeStatesReference, SixteenBitOutputsAreTheFloatResultRoundedOnce) {
  for (DType dtype : {DType::kBF16, DType::kFP16}) {
    HostMergeCase c(MergeSpec{.num_states = 3, .row_shape = {5, 2}, .d = 16, .in_dtype = DType::kFP16, .seed = 9});
    const Outputs exact = run_reference(c);
    const Outputs rounded = run_reference(c, dtype);
    for (int64_t i = 0; i < c.out_elements(); ++i) {
      ASSERT_EQ(rounded.out[i], host::round_to_half(exact.out[i], dtype)) << i;
    }
  }
}

TEST(MergeStatesReference, InPlaceGivesTheOutOfPlaceResult) {
  const MergeSpec spec{.num_states = 3, .row_shape = {4, 5}, .d = 16, .in_dtype = DType::kFP32, .seed = 5};
  HostMergeCase c(spec);
  const Outputs want = run_reference(c);
  // out = o[1] itself, out_lse = lse[1] itself.
  std::vector<uint8_t> o = c.o;
  std::vector<float> lse = c.lse;
  MergeCall call(c, o.data(), lse.data(), nullptr, nullptr);
  call.args.out = call.o_views[1];
  call.args.out.dtype = DType::kFP32;
  call.args.out_lse = call.lse_views[1];
  ASSERT_TRUE(reference::merge_states(call.args));
  for (int64_t r = 0; r < c.rows; ++r) {
    EXPECT_EQ(lse[c.rows + r], want.lse[r]) << r;
    for (int64_t j = 0; j < 16; ++j) {
      EXPECT_EQ(host::load_as<float>(o.data(), c.o_state_stride + r * 16 + j), want.out[r * 16 + j]) << r << " " << j;
    }
  }
}

TEST(MergeStatesReference, NoRowsWriteNothingAndDOfZeroWritesTheLsesAlone) {
  HostMergeCase none(MergeSpec{.row_shape = {0, 4}, .d = 8});
  std::vector<uint16_t> out(1, 0xABCD);
  std::vector<float> lse(4, -3.f);
  MergeCall no_rows(none, none.o.data(), none.lse.data(), out.data(), lse.data());
  ASSERT_TRUE(reference::merge_states(no_rows.args));
  EXPECT_EQ(out[0], 0xABCD);
  EXPECT_EQ(lse[0], -3.f);

  // d = 0: the merged LSEs (what the GPU computes too); without out_lse nothing at all, even
  // over more rows than memory could hold (zero strides: every row reads one LSE).
  HostMergeCase narrow(MergeSpec{.num_states = 3, .row_shape = {4}, .d = 0, .in_dtype = DType::kFP32,
                                 .empty_fraction = 0});
  MergeCall d_zero(narrow, narrow.o.data(), narrow.lse.data(), out.data(), lse.data());
  ASSERT_TRUE(reference::merge_states(d_zero.args));
  EXPECT_EQ(out[0], 0xABCD);
  for (int64_t r = 0; r < 4; ++r) {
    double sum = 0;  // log-sum-exp written out (the two-state form takes d >= 1)
    for (int s = 0; s < 3; ++s) sum += std::exp(static_cast<double>(narrow.lse[s * 4 + r]));
    EXPECT_NEAR(lse[r], std::log(sum), 1e-5 * std::fmax(1.0, std::fabs(std::log(sum)))) << r;
  }
  for (TensorRef& t : d_zero.o_views) t = make_tensor(t.data, DType::kFP32, {int64_t{1} << 62, 0}, {0, 1});
  for (TensorRef& t : d_zero.lse_views) t = make_tensor(t.data, DType::kFP32, {int64_t{1} << 62}, {0});
  d_zero.args.out = make_tensor(out.data(), DType::kFP32, {int64_t{1} << 62, 0});
  d_zero.args.out_lse = TensorRef{};
  EXPECT_TRUE(reference::merge_states(d_zero.args));  // at once: nothing to write
  EXPECT_TRUE(merge_states(d_zero.args, nullptr));     // the GPU entry likewise, GPU or not
}

// ---- validation ----------------------------------------------------------------------------

struct Validation {
  HostMergeCase c{MergeSpec{.num_states = 3, .row_shape = {4, 2}, .d = 8, .in_dtype = DType::kFP32}};
  std::vector<float> out = std::vector<float>(64), out_lse = std::vector<float>(8);
  MergeCall call{c, c.o.data(), c.lse.data(), out.data(), out_lse.data()};
  Validation() { call.args.out.dtype = DType::kFP32; }
  Status run() { return reference::merge_states(call.args); }
};

TEST(MergeStatesValidation, TheValidCallPasses) {
  Validation v;
  EXPECT_TRUE(v.run());
}

TEST(MergeStatesValidation, EveryBadArgumentIsNamed) {
  using Edit = void (*)(Validation&);
  struct Row {
    const char* what;
    Edit edit;
    std::vector<std::string> parts;
  };
  const std::vector<Row> table = {
      {"no states", [](Validation& v) { v.call.args.num_states = 0; }, {"num_states", "expected 1..128", "got 0"}},
      {"too many", [](Validation& v) { v.call.args.num_states = 129; }, {"num_states", "got 129"}},
      {"null o", [](Validation& v) { v.call.args.o = nullptr; }, {"o:", "null"}},
      {"null lse", [](Validation& v) { v.call.args.lse = nullptr; }, {"lse:", "null"}},
      {"bad base", [](Validation& v) { v.call.args.lse_base = static_cast<LseBase>(7); }, {"lse_base", "7"}},
      {"bad out base", [](Validation& v) { v.call.args.out_lse_base = static_cast<LseBase>(-1); }, {"out_lse_base"}},
      {"o rank 1", [](Validation& v) { v.call.o_views[0].rank = 1; }, {"o[0]", "rank 2..4"}},
      {"o rank 5",
       [](Validation& v) {
         TensorRef& t = v.call.o_views[0];
         t.rank = 5;
         t.shape[3] = 1;
         t.shape[4] = 1;
         t.stride[4] = 1;
       },
       {"o[0]", "rank 2..4"}},
      {"o dtype", [](Validation& v) { v.call.o_views[0].dtype = DType::kInt8; }, {"o[0].dtype", "int8"}},
      {"o last dim", [](Validation& v) { v.call.o_views[0].stride[2] = 2; }, {"o[0]"}},
      {"o null", [](Validation& v) { v.call.o_views[0].data = nullptr; }, {"o[0]", "null"}},
      {"lse dtype", [](Validation& v) { v.call.lse_views[0].dtype = DType::kBF16; }, {"lse[0].dtype"}},
      {"lse rank", [](Validation& v) { v.call.lse_views[0].rank = 1; }, {"lse[0]", "expected rank 2"}},
      {"lse shape", [](Validation& v) { v.call.lse_views[0].shape[1] = 3; }, {"lse[0].shape[1]", "expected 2", "got 3"}},
      {"o[2] shape", [](Validation& v) { v.call.o_views[2].shape[0] = 3; }, {"o[2].shape[0]", "expected 4", "got 3"}},
      {"o[1] stride", [](Validation& v) { v.call.o_views[1].stride[0] = 32; }, {"o[1].stride[0]", "expected 16"}},
      {"o[1] dtype", [](Validation& v) { v.call.o_views[1].dtype = DType::kBF16; }, {"o[1].dtype", "float32"}},
      {"o[1] rank", [](Validation& v) { v.call.o_views[1].rank = 2; }, {"o[1]", "expected rank 3"}},
      {"lse[2] stride", [](Validation& v) { v.call.lse_views[2].stride[0] = 7; }, {"lse[2].stride[0]"}},
      {"lse[1] null", [](Validation& v) { v.call.lse_views[1].data = nullptr; }, {"lse[1]", "null"}},
      {"no out", [](Validation& v) { v.call.args.out = TensorRef{}; }, {"out:", "got none"}},
      {"out dtype", [](Validation& v) { v.call.args.out.dtype = DType::kInt32; }, {"out.dtype"}},
      {"out shape", [](Validation& v) { v.call.args.out.shape[2] = 4; }, {"out.shape[2]", "expected 8", "got 4"}},
      {"out rank", [](Validation& v) { v.call.args.out.rank = 2; }, {"out:", "expected rank 3"}},
      {"out broadcast", [](Validation& v) { v.call.args.out.stride[1] = 0; }, {"out"}},
      {"out_lse dtype", [](Validation& v) { v.call.args.out_lse.dtype = DType::kFP16; }, {"out_lse.dtype"}},
      {"out_lse shape", [](Validation& v) { v.call.args.out_lse.shape[0] = 5; }, {"out_lse.shape[0]"}},
      {"out over o[2]",
       [](Validation& v) {
         v.call.args.out.data = static_cast<float*>(v.call.o_views[2].data) + 1;
       },
       {"out", "o[2]", "overlapping"}},
      {"out over lse[0]",
       [](Validation& v) {
         v.call.args.out = v.c.out_view(v.call.lse_views[0].data, DType::kFP32);
       },
       {"out", "lse[0]", "overlapping"}},
      {"out_lse over out", [](Validation& v) { v.call.args.out_lse.data = v.out.data(); }, {"out_lse", "out"}},
      {"out_lse over lse[1] shifted",
       [](Validation& v) { v.call.args.out_lse.data = static_cast<float*>(v.call.lse_views[1].data) + 1; },
       {"out_lse", "lse[1]", "overlapping"}},
      {"out_lse over o[0]", [](Validation& v) { v.call.args.out_lse.data = v.call.o_views[0].data; }, {"out_lse", "o[0]"}},
  };
  for (const Row& row : table) {
    Validation v;
    row.edit(v);
    EXPECT_TRUE(IsInvalid(v.run(), row.parts)) << row.what;
  }
}

TEST(MergeStatesValidation, AnOutputMayBeExactlyOneOfTheInputs) {
  Validation v;
  v.call.args.out = v.call.o_views[2];
  v.call.args.out_lse = v.call.lse_views[0];
  EXPECT_TRUE(v.run());
}

TEST(MergeStatesValidation, TheGpuEntryRejectsPointersOffTheirElementSize) {
  Validation v;
  v.call.o_views[1].data = static_cast<char*>(v.call.o_views[1].data) + 2;
  v.call.o_views[1].shape[0] = 3;  // stays inside the buffer
  for (TensorRef& t : v.call.o_views) t.shape[0] = 3;
  for (TensorRef& t : v.call.lse_views) t.shape[0] = 3;
  v.call.args.out.shape[0] = 3;
  v.call.args.out_lse.shape[0] = 3;
  ASSERT_TRUE(v.run());  // the reference reads unaligned host arrays
  EXPECT_TRUE(IsInvalid(merge_states(v.call.args, nullptr), {"merge_states: o[1]", "4-byte aligned"}));
}

TEST(MergeStatesValidation, TheGpuEntryValidatesBeforeLookingForADevice) {
  Validation v;
  v.call.args.num_states = 0;
  EXPECT_TRUE(IsInvalid(merge_states(v.call.args, nullptr), {"merge_states: num_states"}));
  // Nothing to merge: the valid empty result, with or without a GPU.
  HostMergeCase empty(MergeSpec{.row_shape = {0}, .d = 8});
  MergeCall call(empty, empty.o.data(), empty.lse.data(), v.out.data(), nullptr);
  EXPECT_TRUE(merge_states(call.args, nullptr));
}

}  // namespace
}  // namespace mlakit::testing
