// The CPU reference of the dense MLA decode (reference::mla_decode) against a naive float64
// formula written here from docs/contract.md: shapes, GQA head mapping, paging, causal masks,
// empty rows, strided views, both dtypes, and the documented NaN rows of a bad block table.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "mlakit/reference.h"
#include "reference/host_numeric.h"
#include "support/decode_case.h"

namespace mlakit {
namespace {

constexpr int kDqk = 576;
constexpr int kDv = 512;
constexpr uint16_t kPoison16 = 0x7fff;  // NaN in bf16 and in fp16
constexpr double kInf = std::numeric_limits<double>::infinity();

double half_value(uint16_t h, DType dt) {
  return dt == DType::kBF16 ? host::bf16_to_float(h) : host::fp16_to_float(h);
}

// docs/contract.md, Dense decode, from its text: row (i, t, head) attends to cache positions j < L, and with causal
// and s_q > 1 only to j <= L - s_q + t; z = scale * q.k over d_qk; out = softmax(z) @ k[:d_v].
struct Naive {
  std::vector<double> out;  // [b, s_q, h_q, d_v]
  std::vector<double> lse;  // [b, h_q, s_q]
};

Naive naive_decode(const support::HostDecodeCase& c) {
  const auto& s = c.spec;
  const double scale = s.softmax_scale ? double(*s.softmax_scale) : 1.0 / std::sqrt(double(kDqk));
  Naive r{std::vector<double>(c.out_elems()), std::vector<double>(c.lse_elems())};
  for (int64_t i = 0; i < c.b; ++i) {
    const int64_t L = std::max(c.seqlens[i], 0);
    for (int t = 0; t < s.s_q; ++t) {
      for (int h = 0; h < s.h_q; ++h) {
        const int kv_head = h / (s.h_q / s.h_kv);
        const uint16_t* q = &c.q[((i * s.s_q + t) * s.h_q + h) * kDqk];
        std::vector<double> z;
        std::vector<const uint16_t*> keys;
        for (int64_t j = 0; j < L; ++j) {
          if (s.causal && s.s_q > 1 && j > L - s.s_q + t) continue;
          const int64_t block = c.block_table[i * c.max_blocks_per_seq + j / s.page_size];
          const uint16_t* k = &c.kv[((block * s.page_size + j % s.page_size) * s.h_kv + kv_head) * kDqk];
          double dot = 0;
          for (int d = 0; d < kDqk; ++d) dot += half_value(q[d], s.dtype) * half_value(k[d], s.dtype);
          z.push_back(scale * dot);
          keys.push_back(k);
        }
        double* o = &r.out[((i * s.s_q + t) * s.h_q + h) * kDv];
        double& lse = r.lse[(i * s.h_q + h) * s.s_q + t];
        if (z.empty()) {
          std::fill(o, o + kDv, 0.0);
          lse = kInf;
          continue;
        }
        const double m = *std::max_element(z.begin(), z.end());
        double sum = 0;
        for (size_t j = 0; j < z.size(); ++j) {
          const double w = std::exp(z[j] - m);
          sum += w;
          for (int d = 0; d < kDv; ++d) o[d] += w * half_value(keys[j][d], s.dtype);
        }
        for (int d = 0; d < kDv; ++d) o[d] /= sum;
        lse = m + std::log(sum);
      }
    }
  }
  return r;
}

// Host buffers of one case laid out as (optionally padded) views of larger allocations, with
// every byte outside the views poisoned so that reads and writes outside them show.
struct ViewBuffers {
  std::vector<uint16_t> q, kv, out;
  std::vector<int32_t> table, seqlens;
  std::vector<float> lse;
  MlaDecodeArgs args;
};

ViewBuffers make_views(const support::HostDecodeCase& c, bool padded) {
  const auto& s = c.spec;
  const int64_t b = c.b, pad = padded ? 1 : 0;
  ViewBuffers v;
  // q [b, s_q, h_q, d_qk]
  const int64_t q2 = kDqk + 24 * pad, q1 = s.h_q * q2 + 8 * pad, q0 = s.s_q * q1 + 40 * pad;
  v.q.assign(b * q0, kPoison16);
  for (int64_t i = 0; i < b; ++i)
    for (int t = 0; t < s.s_q; ++t)
      for (int h = 0; h < s.h_q; ++h)
        std::copy_n(&c.q[((i * s.s_q + t) * s.h_q + h) * kDqk], kDqk, &v.q[i * q0 + t * q1 + h * q2]);
  // kv_cache [num_blocks, page, h_kv, d_qk]
  const int64_t k2 = kDqk + 32 * pad, k1 = s.h_kv * k2 + 16 * pad, k0 = s.page_size * k1 + 8 * pad;
  v.kv.assign(c.num_blocks * k0, kPoison16);
  for (int64_t blk = 0; blk < c.num_blocks; ++blk)
    for (int p = 0; p < s.page_size; ++p)
      for (int hk = 0; hk < s.h_kv; ++hk)
        std::copy_n(&c.kv[((blk * s.page_size + p) * s.h_kv + hk) * kDqk], kDqk, &v.kv[blk * k0 + p * k1 + hk * k2]);
  // block_table [b, max_blocks_per_seq], padding holds garbage block ids
  const int64_t t0 = c.max_blocks_per_seq + 3 * pad;
  v.table.assign(b * t0, -7);
  for (int64_t i = 0; i < b; ++i)
    std::copy_n(&c.block_table[i * c.max_blocks_per_seq], c.max_blocks_per_seq, &v.table[i * t0]);
  v.seqlens = c.seqlens;
  // out [b, s_q, h_q, d_v] and lse [b, h_q, s_q], poisoned
  const int64_t o2 = kDv + 16 * pad, o1 = s.h_q * o2 + 2 * pad, o0 = s.s_q * o1 + 6 * pad;
  v.out.assign(b * o0, kPoison16);
  const int64_t l1 = s.s_q + 2 * pad, l0 = s.h_q * l1 + 1 * pad;
  v.lse.assign(b * l0, std::numeric_limits<float>::quiet_NaN());

  MlaDecodeArgs& a = v.args;
  a.q = make_tensor(v.q.data(), s.dtype, {b, s.s_q, s.h_q, kDqk}, {q0, q1, q2, 1});
  a.kv_cache = make_tensor(v.kv.data(), s.dtype, {c.num_blocks, s.page_size, s.h_kv, kDqk}, {k0, k1, k2, 1});
  a.block_table = make_tensor(v.table.data(), DType::kInt32, {b, c.max_blocks_per_seq}, {t0, 1});
  a.cache_seqlens = make_tensor(v.seqlens.data(), DType::kInt32, {b});
  a.out = make_tensor(v.out.data(), s.dtype, {b, s.s_q, s.h_q, kDv}, {o0, o1, o2, 1});
  a.lse = make_tensor(v.lse.data(), DType::kFP32, {b, s.h_q, s.s_q}, {l0, l1, 1});
  a.softmax_scale = s.softmax_scale;
  a.causal = s.causal;
  return v;
}

// Offsets of the elements inside the out / lse views.
std::vector<bool> out_mask(const ViewBuffers& v) {
  const TensorRef& o = v.args.out;
  std::vector<bool> in(v.out.size(), false);
  for (int64_t i = 0; i < o.shape[0]; ++i)
    for (int64_t t = 0; t < o.shape[1]; ++t)
      for (int64_t h = 0; h < o.shape[2]; ++h)
        for (int64_t d = 0; d < o.shape[3]; ++d) in[i * o.stride[0] + t * o.stride[1] + h * o.stride[2] + d] = true;
  return in;
}

struct RowFilter {  // rows whose out and lse are expected to be NaN
  int64_t seq = -1;
  std::vector<bool> nan_t;  // per query token of that sequence
};

// Every element of the views against the naive result: exact zeros and +inf for empty rows,
// accuracy tolerances (docs/contract.md) and rounding-level closeness elsewhere; nothing written outside the views.
void expect_matches_naive(const support::HostDecodeCase& c, const ViewBuffers& v, const Naive& want,
                          const RowFilter& nan_rows = {}) {
  const auto& s = c.spec;
  const TensorRef &o = v.args.out, &l = v.args.lse;
  // bf16 keeps 8 significant bits, fp16 11: correctly rounded results are within half an
  // ulp, i.e. 2^-9 / 2^-12 relative; allow a full ulp's worth for float-then-half rounding.
  const double rel = s.dtype == DType::kBF16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
  double dot = 0, norm = 0;
  int64_t failures = 0;
  for (int64_t i = 0; i < c.b; ++i) {
    for (int t = 0; t < s.s_q; ++t) {
      const bool expect_nan = i == nan_rows.seq && nan_rows.nan_t[t];
      for (int h = 0; h < s.h_q; ++h) {
        const float got_lse = v.lse[i * l.stride[0] + h * l.stride[1] + t];
        const double want_lse = want.lse[(i * s.h_q + h) * s.s_q + t];
        const std::string where = "seq " + std::to_string(i) + " t " + std::to_string(t) + " head " +
                                  std::to_string(h) + " (L = " + std::to_string(c.seqlens[i]) + ")";
        if (expect_nan) {
          EXPECT_TRUE(std::isnan(got_lse)) << where;
        } else if (std::isinf(want_lse)) {
          EXPECT_EQ(got_lse, INFINITY) << "empty row must report lse +inf: " << where;
        } else {
          EXPECT_TRUE(std::isfinite(got_lse)) << where;
          const double err = std::fabs(got_lse - want_lse);
          EXPECT_LE(err, std::max(1e-6, 8.0 / 65536 * std::fabs(want_lse))) << "lse, accuracy rule (docs/contract.md): " << where;
          EXPECT_LE(err, 1e-6 * std::max(1.0, std::fabs(want_lse))) << "lse: " << where;
        }
        for (int d = 0; d < kDv; ++d) {
          const double got = half_value(v.out[i * o.stride[0] + t * o.stride[1] + h * o.stride[2] + d], s.dtype);
          const double w = want.out[((i * s.s_q + t) * s.h_q + h) * kDv + d];
          bool ok;
          if (expect_nan) {
            ok = std::isnan(got);
          } else if (std::isinf(want_lse)) {
            ok = got == 0.0;  // exactly zero
          } else {
            const double err = std::fabs(got - w);
            ok = std::isfinite(got) && (err <= 1e-3 || err <= 2.0 / 128 * std::fabs(w)) &&
                 err <= rel * std::fabs(w) + 1e-6;
            dot += got * w;
            norm += got * got + w * w;
          }
          if (!ok && failures++ < 5) {
            ADD_FAILURE() << "out[" << d << "] of " << where << ": got " << got << ", expected "
                          << (expect_nan ? "NaN" : std::to_string(w));
          }
        }
      }
    }
  }
  EXPECT_EQ(failures, 0) << "out elements off";
  if (norm > 0) EXPECT_LE(1.0 - 2.0 * dot / norm, 5e-6) << "cosine difference";
  // Nothing outside the views was written.
  const std::vector<bool> in = out_mask(v);
  for (size_t k = 0; k < v.out.size(); ++k) {
    if (!in[k]) ASSERT_EQ(v.out[k], kPoison16) << "out padding written at offset " << k;
  }
  int64_t lse_nan = 0;
  for (float x : v.lse) lse_nan += std::isnan(x);
  int64_t want_nan = static_cast<int64_t>(v.lse.size()) - c.lse_elems();
  if (nan_rows.seq >= 0) {
    for (bool n : nan_rows.nan_t) want_nan += n ? s.h_q : 0;
  }
  EXPECT_EQ(lse_nan, want_nan) << "lse padding written, or lse elements left unwritten";
}

// Lengths for a case: zeros, lengths below s_q (causal rows with no key), page boundaries.
std::vector<int32_t> case_lengths(int64_t b, int s_q, int page, std::mt19937_64& rng) {
  std::vector<int32_t> lens(b);
  const int32_t longest = std::min(2 * page + 9, 170);
  for (int64_t i = 0; i < b; ++i) {
    switch (std::uniform_int_distribution<int>(0, b == 1 ? 3 : 5)(rng)) {
      case 0: lens[i] = 0; break;
      case 1: lens[i] = std::uniform_int_distribution<int32_t>(1, s_q)(rng); break;
      case 2: lens[i] = std::min(page, longest); break;
      default: lens[i] = std::uniform_int_distribution<int32_t>(1, longest)(rng); break;
    }
  }
  if (b == 3) lens[1] = 0;  // every multi-sequence batch holds an empty sequence
  return lens;
}

struct SweepParam {
  int page_size;
  bool causal;
};

class ReferenceSweep : public ::testing::TestWithParam<SweepParam> {};

// One case of the sweep: the shape varies in the loop, dtype, scale and views rotate.
struct SweepCase {
  int s_q, group, h_kv;
  int64_t b;
};

std::vector<SweepCase> sweep_cases() {
  std::vector<SweepCase> cases;
  for (int s_q : {1, 2, 4})
    for (int group : {1, 3, 16})
      for (int h_kv : {1, 2})
        for (int64_t b : {1, 3}) cases.push_back({s_q, group, h_kv, b});
  return cases;
}

TEST_P(ReferenceSweep, MatchesNaiveFormula) {
  const SweepParam param = GetParam();
  std::mt19937_64 rng(1000 + param.page_size * 2 + param.causal);
  const std::vector<SweepCase> cases = sweep_cases();
  for (size_t index = 0; index < cases.size(); ++index) {
    const SweepCase& k = cases[index];
    const support::DecodeCaseSpec spec{
        .seqlens = case_lengths(k.b, k.s_q, param.page_size, rng),
        .s_q = k.s_q,
        .h_q = k.group * k.h_kv,
        .h_kv = k.h_kv,
        .page_size = param.page_size,
        .causal = param.causal,
        .dtype = (index / 2) % 2 ? DType::kFP16 : DType::kBF16,
        .softmax_scale = std::vector<std::optional<float>>{std::nullopt, 0.3f, -0.07f}[index % 3],
        .spare_blocks = 2,
        .seed = rng(),
    };
    const bool padded = (index / 4) % 2 == 1;
    SCOPED_TRACE("s_q " + std::to_string(k.s_q) + " h_q " + std::to_string(spec.h_q) + " h_kv " +
                 std::to_string(k.h_kv) + " b " + std::to_string(k.b) + " dtype " + dtype_name(spec.dtype) +
                 " scale " + (spec.softmax_scale ? std::to_string(*spec.softmax_scale) : "default") + (padded ? " padded views" : ""));
    const support::HostDecodeCase c = support::make_decode_case(spec);
    ViewBuffers v = make_views(c, padded);
    const Status st = reference::mla_decode(v.args);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    expect_matches_naive(c, v, naive_decode(c));
    if (HasFailure()) return;
  }
}

INSTANTIATE_TEST_SUITE_P(
    PagesAndMasks, ReferenceSweep,
    ::testing::Values(SweepParam{1, false}, SweepParam{1, true}, SweepParam{16, false}, SweepParam{16, true},
                      SweepParam{64, false}, SweepParam{64, true}, SweepParam{100, false}, SweepParam{100, true}),
    [](const auto& info) {
      return "page" + std::to_string(info.param.page_size) + (info.param.causal ? "_causal" : "_full");
    });

TEST(Reference, EmptySequencesGiveExactZerosAndInfiniteLse) {
  for (DType dt : {DType::kBF16, DType::kFP16}) {
    const auto c = support::make_decode_case(
        {.seqlens = {0, 0, -3}, .s_q = 2, .h_q = 16, .page_size = 64, .causal = true, .dtype = dt, .seed = 5});
    ViewBuffers v = make_views(c, false);
    ASSERT_TRUE(reference::mla_decode(v.args).is_ok());
    for (uint16_t x : v.out) ASSERT_EQ(half_value(x, dt), 0.0);
    for (float x : v.lse) ASSERT_EQ(x, INFINITY);
  }
}

TEST(Reference, ManyHeadsPerKvHead) {
  // h_q / h_kv = 128 (DeepSeek-V3 without tensor parallelism), lengths across page boundaries.
  const auto c = support::make_decode_case({.seqlens = {65, 130, 63}, .s_q = 2, .h_q = 128, .page_size = 64,
                                            .causal = true, .seed = 14});
  ViewBuffers v = make_views(c, true);
  ASSERT_TRUE(reference::mla_decode(v.args).is_ok());
  expect_matches_naive(c, v, naive_decode(c));
}

TEST(Reference, CausalRowsThatSeeNoKey) {
  // L = 2 < s_q = 4: tokens 0 and 1 see nothing, token 2 sees key 0, token 3 keys 0-1.
  const auto c = support::make_decode_case(
      {.seqlens = {2, 4}, .s_q = 4, .h_q = 3, .page_size = 16, .causal = true, .seed = 6});
  ViewBuffers v = make_views(c, true);
  ASSERT_TRUE(reference::mla_decode(v.args).is_ok());
  const Naive want = naive_decode(c);
  expect_matches_naive(c, v, want);
  const TensorRef& l = v.args.lse;
  for (int h = 0; h < 3; ++h) {
    EXPECT_EQ(v.lse[h * l.stride[1] + 0], INFINITY);
    EXPECT_EQ(v.lse[h * l.stride[1] + 1], INFINITY);
    EXPECT_TRUE(std::isfinite(v.lse[h * l.stride[1] + 2]));
  }
  // With a single key the output is that key's value row, rounded.
  const TensorRef& o = v.args.out;
  const int64_t block = c.block_table[0];
  for (int d = 0; d < kDv; ++d) {
    EXPECT_EQ(v.out[2 * o.stride[1] + d], c.kv[block * 16 * kDqk + d]) << d;
  }
}

TEST(Reference, CausalIsIgnoredForOneQueryToken) {
  auto spec = support::DecodeCaseSpec{.seqlens = {77, 5}, .s_q = 1, .h_q = 16, .page_size = 16, .seed = 8};
  const auto c = support::make_decode_case(spec);
  spec.causal = true;
  const auto cc = support::make_decode_case(spec);
  const support::ReferenceResult a = support::run_reference(c), b = support::run_reference(cc);
  EXPECT_EQ(a.out, b.out);
  EXPECT_EQ(a.lse, b.lse);
}

// out may be float32: the unrounded result, which the 16-bit output is the rounding of.
TEST(Reference, FloatOutputIsTheUnroundedResult) {
  for (DType dt : {DType::kBF16, DType::kFP16}) {
    const auto c = support::make_decode_case({.seqlens = {0, 1, 65, 130}, .s_q = 2, .h_q = 6, .h_kv = 2,
                                              .page_size = 64, .causal = true, .dtype = dt, .seed = 13});
    const Naive want = naive_decode(c);
    std::vector<float> out(c.out_elems(), NAN), lse(c.lse_elems(), NAN);
    std::vector<uint16_t> out16(c.out_elems(), kPoison16);
    std::vector<float> lse16(c.lse_elems(), NAN);
    auto args = c.args(const_cast<uint16_t*>(c.q.data()), const_cast<uint16_t*>(c.kv.data()),
                       const_cast<int32_t*>(c.block_table.data()), const_cast<int32_t*>(c.seqlens.data()),
                       out.data(), lse.data());
    args.out.dtype = DType::kFP32;
    ASSERT_TRUE(reference::mla_decode(args).is_ok());
    args.out.data = out16.data();
    args.out.dtype = dt;
    args.lse.data = lse16.data();
    ASSERT_TRUE(reference::mla_decode(args).is_ok());
    for (size_t k = 0; k < out.size(); ++k) {
      // Absolute slack: the default scale is the float nearest 1/24, not 1/24 itself.
      ASSERT_LE(std::fabs(out[k] - want.out[k]), 1e-6 * std::fabs(want.out[k]) + 1e-8) << k;
      ASSERT_EQ(out16[k], dt == DType::kBF16 ? host::float_to_bf16(out[k]) : host::float_to_fp16(out[k])) << k;
    }
    for (size_t k = 0; k < lse.size(); ++k) {
      if (std::isinf(want.lse[k])) {
        ASSERT_EQ(lse[k], INFINITY) << k;
      } else {
        ASSERT_LE(std::fabs(lse[k] - want.lse[k]), 1e-6 * std::max(1.0, std::fabs(want.lse[k]))) << k;
      }
      ASSERT_EQ(std::memcmp(&lse[k], &lse16[k], sizeof(float)), 0) << k;
    }
  }
}

TEST(Reference, ThreadCountDoesNotChangeTheResult) {
  const auto c = support::make_decode_case(
      {.seqlens = {70, 0, 129, 1, 64}, .s_q = 2, .h_q = 6, .h_kv = 2, .page_size = 16, .causal = true, .seed = 9});
  const support::ReferenceResult one = support::run_reference(c, 1);
  for (int threads : {0, 2, 5, 64}) {
    const support::ReferenceResult r = support::run_reference(c, threads);
    EXPECT_EQ(r.out, one.out) << threads << " threads";
    EXPECT_EQ(std::memcmp(r.lse.data(), one.lse.data(), r.lse.size() * sizeof(float)), 0) << threads << " threads";
  }
}

// Block-table entries within a sequence's length that name no block: the sequence's rows
// that would read them become NaN (documented in mlakit/reference.h), nothing crashes, and
// other sequences and rows are unaffected.
TEST(Reference, OutOfRangeBlockGivesNanRowsOfThatSequenceOnly) {
  for (int32_t bad : {-1, -7, INT32_MIN, INT32_MAX, 0 /* num_blocks, set below */}) {
    auto c = support::make_decode_case(
        {.seqlens = {100, 70, 40}, .s_q = 1, .h_q = 16, .page_size = 16, .seed = 10});
    const Naive want = naive_decode(c);  // from the intact table
    c.block_table[1 * c.max_blocks_per_seq + 2] = bad == 0 ? static_cast<int32_t>(c.num_blocks) : bad;
    ViewBuffers v = make_views(c, bad % 2 != 0);
    ASSERT_TRUE(reference::mla_decode(v.args).is_ok());
    SCOPED_TRACE("bad entry " + std::to_string(bad));
    expect_matches_naive(c, v, want, RowFilter{1, {true}});
  }
}

TEST(Reference, OutOfRangeBlockOnlyAffectsCausalRowsThatReachIt) {
  // L 66, s_q 4, page 16: token t sees keys [0, 62 + t]; block 4 holds keys 64, 65.
  auto c = support::make_decode_case(
      {.seqlens = {66, 30}, .s_q = 4, .h_q = 3, .page_size = 16, .causal = true, .seed = 11});
  const Naive want = naive_decode(c);
  c.block_table[4] = -1;
  ViewBuffers v = make_views(c, true);
  ASSERT_TRUE(reference::mla_decode(v.args).is_ok());
  expect_matches_naive(c, v, want, RowFilter{0, {false, false, true, true}});
}

TEST(Reference, TableNarrowerThanTheSequenceGivesNanRows) {
  // A view of the first column only: sequence 1 (two pages) runs past the table's width.
  const auto c = support::make_decode_case({.seqlens = {10, 20}, .s_q = 1, .h_q = 3, .page_size = 16, .seed = 12});
  const Naive want = naive_decode(c);
  ViewBuffers v = make_views(c, false);
  v.args.block_table = make_tensor(v.table.data(), DType::kInt32, {2, 1}, {c.max_blocks_per_seq, 1});
  ASSERT_TRUE(reference::mla_decode(v.args).is_ok());
  expect_matches_naive(c, v, want, RowFilter{1, {true}});
}

}  // namespace
}  // namespace mlakit
