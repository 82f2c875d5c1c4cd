// The CPU reference of the GQA decode (reference::gqa_decode) against the naive float64
// computation of gqa_case.h: masks, ALiBi, softcap, RoPE, quantized caches, the append of
// k_new / v_new (bytes and scales), empty, finished and NaN rows, and the data checks.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "common/fp8_e4m3.h"
#include "common/rotary.h"
#include "cpu_test_util.h"
#include "gqa_case.h"
#include "mlakit/gqa_decode.h"
#include "reference/gqa_cache_ref.h"
#include "reference/host_numeric.h"

namespace mlakit {
namespace {

using testing::GqaCase;
using testing::GqaScaleLayout;
using testing::GqaSpec;

// Reference (float32 out / lse of float64 results) against the naive float64 values.
void expect_matches_naive(const GqaCase& c) {
  const testing::GqaNaive n = testing::naive_gqa(c, c.args);
  for (std::size_t e = 0; e < c.out.size(); ++e) {
    ASSERT_NEAR(c.out[e], n.out[e], 1e-5 * (1 + std::fabs(n.out[e]))) << "out element " << e;
  }
  for (std::size_t e = 0; e < c.lse.size(); ++e) {
    if (std::isinf(n.lse[e])) {
      ASSERT_EQ(c.lse[e], INFINITY) << "lse element " << e;
    } else {
      ASSERT_NEAR(c.lse[e], n.lse[e], 1e-5 * (1 + std::fabs(n.lse[e]))) << "lse element " << e;
    }
  }
}

struct Options {
  const char* name;
  bool causal = false;
  int window = 0;
  float softcap = 0;
  bool alibi = false;
  RotaryEmbedding rope{};
};

const Options kOptions[] = {
    {"plain"},
    {"causal", true},
    {"window", false, 3},
    {"causal_window", true, 2},
    {"alibi_softcap", true, 0, 5.f, true},
    {"neox", false, 0, 0, false, {RopeStyle::kNeox, 10000.0, 0}},
    {"gptj_partial", true, 5, 0, true, {RopeStyle::kGptj, 500.0, 32}},
};

void run_case(const GqaSpec& spec, const Options& o) {
  GqaCase c(spec);
  c.args.causal = o.causal;
  c.args.window = o.window;
  c.args.softcap = o.softcap;
  c.args.rope = o.rope;
  if (o.alibi) c.args.alibi_slopes = make_tensor(c.alibi.data(), DType::kFP32, {spec.h_q});
  ASSERT_TRUE(reference::gqa_decode(c.args, 3).is_ok());
  expect_matches_naive(c);
}

// (a) bf16 cache: every option set, h_q / h_kv 1 and 4, s_q 1 and 3.
TEST(GqaDecodeRef, MatchesNaiveOnBf16Cache) {
  for (int group : {1, 4}) {
    for (int s_q : {1, 3}) {
      for (const Options& o : kOptions) {
        SCOPED_TRACE(std::string(o.name) + " group " + std::to_string(group) + " s_q " + std::to_string(s_q));
        run_case({.b = 3, .s_q = s_q, .h_q = 2 * group, .h_kv = 2, .seed = static_cast<uint32_t>(7 * group + s_q)}, o);
      }
    }
  }
}

// (b) quantized caches: the naive side dequantizes with the scales (random per token), so a
// reference that ignored or misplaced them fails.
TEST(GqaDecodeRef, MatchesNaiveOnQuantizedCaches) {
  const struct {
    DType dtype;
    GqaScaleLayout scales;
  } kinds[] = {{DType::kInt8, GqaScaleLayout::kPerToken},
               {DType::kFP8E4M3, GqaScaleLayout::kPerToken},
               {DType::kFP8E4M3, GqaScaleLayout::kPerTensor}};
  for (const auto& k : kinds) {
    for (int s_q : {1, 3}) {
      SCOPED_TRACE(std::string(dtype_name(k.dtype)) + " s_q " + std::to_string(s_q));
      run_case({.s_q = s_q, .h_q = 8, .h_kv = 2, .cache = k.dtype, .scales = k.scales, .seed = 11u + s_q},
               kOptions[4]);
    }
  }
}

TEST(GqaDecodeRef, RoundsOutToQsDtype) {
  GqaCase c({.s_q = 2, .seed = 5});
  ASSERT_TRUE(reference::gqa_decode(c.args).is_ok());
  std::vector<uint16_t> out16(c.out.size(), 0x7fc0);
  c.args.out = make_tensor(out16.data(), DType::kBF16, {c.s.b, c.s.s_q, c.s.h_q, c.s.d});
  ASSERT_TRUE(reference::gqa_decode(c.args).is_ok());
  for (std::size_t e = 0; e < out16.size(); ++e) ASSERT_EQ(out16[e], host::float_to_bf16(c.out[e])) << e;
}

// The key rotation the GPU append computes (common/rotary.h: float cos / sin of the float64
// angle, each value x cos -+ partner sin with the partner's product rounded first), written
// out from the primitives; the stored bytes are checked against it, and it against the
// float64 rotation.
std::vector<float> shared_float_rope(const std::vector<double>& row, const RotaryEmbedding& rope, int64_t pos) {
  std::vector<float> x(row.begin(), row.end()), y = x;
  const int rd = rope.rotary_dim ? rope.rotary_dim : static_cast<int>(row.size());
  for (int e = 0; e < rd; ++e) {
    const detail::RopePair p = detail::rope_pair(e, static_cast<int>(rope.style), rd);
    float cs, sn;
    detail::rope_cos_sin(pos, p.c, rd, std::log(rope.theta), &cs, &sn);
    y[e] = detail::rope_rotate(x[e], x[p.partner], cs, sn, p.first);
  }
  return y;
}

// (c) The append: each new token's rows land at position L - s_q + t of its entry, k rotated
// (in float as the GPU does, within 1e-6 of the float64 rotation), both quantized with the
// header's rule (written out here); every other byte is untouched. The attention then reads
// what was written.
void check_append(DType dtype, GqaScaleLayout scales) {
  SCOPED_TRACE(dtype_name(dtype));
  GqaCase c({.s_q = 3, .h_q = 4, .h_kv = 2, .cache = dtype, .scales = scales, .append = true, .seed = 21});
  c.args.rope = {RopeStyle::kNeox, 10000.0, 0};
  std::fill(c.k_new.begin(), c.k_new.begin() + c.s.d, 0);  // entry 0, token 0, head 0: a zero row
  const std::vector<uint8_t> k_before = c.kc, v_before = c.vc;
  const std::vector<float> ks_before = c.ks;
  ASSERT_TRUE(reference::gqa_decode(c.args, 2).is_ok());

  std::vector<bool> written(c.num_blocks * c.s.page * c.s.h_kv, false);
  const int64_t elem = dtype_size(dtype);
  for (int64_t i = 0; i < c.s.b; ++i) {
    for (int t = 0; t < c.s.s_q; ++t) {
      const int64_t pos = c.seqlens[i] - c.s.s_q + t;
      for (int hk = 0; hk < c.s.h_kv; ++hk) {
        const int64_t slot = c.slot(c.block_of(i, pos), pos % c.s.page, hk);
        written[slot] = true;
        for (const bool is_k : {true, false}) {
          const std::vector<uint16_t>& src = is_k ? c.k_new : c.v_new;
          std::vector<double> row(c.s.d);
          for (int d = 0; d < c.s.d; ++d) row[d] = host::bf16_to_float(src[((i * c.s.s_q + t) * c.s.h_kv + hk) * c.s.d + d]);
          std::vector<float> xs(row.begin(), row.end());
          if (is_k) {
            xs = shared_float_rope(row, c.args.rope, pos);
            testing::naive_rope(row, c.args.rope, static_cast<double>(pos));
            for (int d = 0; d < c.s.d; ++d) ASSERT_NEAR(xs[d], row[d], 1e-6 * (1 + std::fabs(row[d]))) << "col " << d;
          }
          float amax = 0;
          for (float x : xs) amax = std::max(amax, std::fabs(x));
          const float per_token = dtype == DType::kInt8 ? amax / 127.f : amax / 448.f;
          const float scale = scales == GqaScaleLayout::kPerTensor ? (is_k ? c.ks : c.vs)[0] : per_token;
          if (scales == GqaScaleLayout::kPerToken) ASSERT_EQ((is_k ? c.ks : c.vs)[slot], per_token);
          if (i == 0 && t == 0 && hk == 0 && is_k) ASSERT_EQ(per_token, 0.f);
          const std::vector<uint8_t>& cache = is_k ? c.kc : c.vc;
          for (int d = 0; d < c.s.d; ++d) {
            const float x = xs[d];
            const int64_t e = slot * c.s.d + d;
            if (dtype == DType::kBF16) {
              ASSERT_EQ(host::load_as<uint16_t>(cache.data(), e), host::float_to_bf16(x));
            } else if (dtype == DType::kInt8) {
              const float q = scale == 0 ? 0.f : std::clamp(std::nearbyint(x / scale), -127.f, 127.f);
              ASSERT_EQ(static_cast<int8_t>(cache[e]), static_cast<int8_t>(q)) << "slot " << slot << " col " << d;
            } else {
              ASSERT_EQ(cache[e], scale == 0 ? 0 : detail::float_to_e4m3(x / scale)) << "slot " << slot << " col " << d;
            }
          }
        }
      }
    }
  }
  for (int64_t slot = 0; slot < static_cast<int64_t>(written.size()); ++slot) {
    if (written[slot]) continue;
    ASSERT_EQ(std::memcmp(&c.kc[slot * c.s.d * elem], &k_before[slot * c.s.d * elem], c.s.d * elem), 0) << slot;
    ASSERT_EQ(std::memcmp(&c.vc[slot * c.s.d * elem], &v_before[slot * c.s.d * elem], c.s.d * elem), 0) << slot;
    if (scales == GqaScaleLayout::kPerToken) ASSERT_EQ(c.ks[slot], ks_before[slot]) << slot;
  }
  expect_matches_naive(c);
}

TEST(GqaDecodeRef, AppendWritesRotatedQuantizedRows) {
  check_append(DType::kBF16, GqaScaleLayout::kNone);
  check_append(DType::kInt8, GqaScaleLayout::kPerToken);
  check_append(DType::kFP8E4M3, GqaScaleLayout::kPerToken);
  check_append(DType::kFP8E4M3, GqaScaleLayout::kPerTensor);
}

// (d) RoPE by hand: e0 rotated by angle 1 (pair 0) is (cos 1, sin 1) on columns (0, 2) for
// NeoX and (0, 1) for GPT-J; pair 1 turns by 1 * 10000^(-1/2) = 0.01.
TEST(GqaDecodeRef, RopeRotatesTheDocumentedPairs) {
  std::vector<double> neox = {1, 0, 0, 1}, gptj = {1, 0, 0, 1};
  reference::apply_rope(neox.data(), RopeStyle::kNeox, 10000.0, 4, 1.0);
  reference::apply_rope(gptj.data(), RopeStyle::kGptj, 10000.0, 4, 1.0);
  const std::vector<double> want_neox = {std::cos(1.0), -std::sin(0.01), std::sin(1.0), std::cos(0.01)};
  const std::vector<double> want_gptj = {std::cos(1.0), std::sin(1.0), -std::sin(0.01), std::cos(0.01)};
  for (int c = 0; c < 4; ++c) {
    EXPECT_NEAR(neox[c], want_neox[c], 1e-15) << c;
    EXPECT_NEAR(gptj[c], want_gptj[c], 1e-15) << c;
  }
  std::vector<double> none = {1, 2, 3, 4};
  reference::apply_rope(none.data(), RopeStyle::kNone, 10000.0, 4, 3.0);
  EXPECT_EQ(none, (std::vector<double>{1, 2, 3, 4}));
}

// Through the decode: q = e0 at position 2 against the single visible key e32 (window 1):
// NeoX pairs column 0 with 32, so the logit is scale * sin 2; GPT-J pairs 0 with 1: logit 0.
TEST(GqaDecodeRef, RopeOfQUsesTheCachePosition) {
  for (RopeStyle style : {RopeStyle::kNeox, RopeStyle::kGptj}) {
    GqaCase c({.b = 1, .h_q = 1, .h_kv = 1, .seed = 2});
    c.seqlens[0] = 3;
    std::fill(c.q.begin(), c.q.end(), 0);
    c.q[0] = host::float_to_bf16(1.f);
    const int64_t slot = c.slot(c.block_of(0, 2), 2, 0);
    for (int d = 0; d < c.s.d; ++d) host::store_as<uint16_t>(c.kc.data(), slot * c.s.d + d, host::float_to_bf16(d == 32));
    c.args.window = 1;
    c.args.rope = {style, 10000.0, 0};
    ASSERT_TRUE(reference::gqa_decode(c.args).is_ok());
    EXPECT_NEAR(c.lse[0], style == RopeStyle::kNeox ? 0.125 * std::sin(2.0) : 0.0, 1e-7);
    for (int d = 0; d < c.s.d; ++d) EXPECT_EQ(c.out[d], static_cast<float>(c.dequant(c.vc, c.vs, slot, d))) << d;
  }
}

// (e) Rows with no visible key: out 0 and lse +inf (L 0; causal with L < s_q).
TEST(GqaDecodeRef, EmptyRowsGiveZeroAndInfiniteLse) {
  GqaCase c({.s_q = 3, .seed = 4});
  c.seqlens = {0, 1};
  c.args.causal = true;
  ASSERT_TRUE(reference::gqa_decode(c.args).is_ok());
  const int64_t row = c.s.h_q * c.s.d;  // one token's elements
  for (int64_t e = 0; e < c.s.s_q * row; ++e) ASSERT_EQ(c.out[e], 0.f) << e;           // entry 0: L = 0
  for (int64_t e = 0; e < 2 * row; ++e) ASSERT_EQ(c.out[c.s.s_q * row + e], 0.f) << e;  // entry 1: t 0, 1
  for (int h = 0; h < c.s.h_q; ++h) {
    for (int t = 0; t < c.s.s_q; ++t) {
      EXPECT_EQ(c.lse[h * c.s.s_q + t], INFINITY);
      EXPECT_EQ(c.lse[(c.s.h_q + h) * c.s.s_q + t] == INFINITY, t < 2) << "entry 1 head " << h << " token " << t;
    }
  }
  expect_matches_naive(c);
}

// (f) A finished entry: out, lse and every cache byte stay as they were, and its length is not
// even read (garbage here); the other entry is computed and appended.
TEST(GqaDecodeRef, FinishedEntriesAreUntouched) {
  GqaCase c({.s_q = 2, .cache = DType::kInt8, .scales = GqaScaleLayout::kPerToken, .append = true, .seed = 9});
  c.finished[1] = 1;
  c.seqlens[1] = -5;
  c.args.finished = make_tensor(c.finished.data(), DType::kUInt8, {c.s.b});
  const std::vector<uint8_t> k_before = c.kc;
  ASSERT_TRUE(reference::gqa_decode(c.args).is_ok());
  const int64_t half = c.out.size() / 2;
  for (int64_t e = 0; e < half; ++e) ASSERT_FALSE(std::isnan(c.out[e])) << e;
  for (int64_t e = half; e < 2 * half; ++e) ASSERT_TRUE(std::isnan(c.out[e])) << e;  // the poison
  for (int64_t e = c.lse.size() / 2; e < static_cast<int64_t>(c.lse.size()); ++e) ASSERT_TRUE(std::isnan(c.lse[e]));
  int64_t changed = 0;
  for (std::size_t e = 0; e < k_before.size(); ++e) changed += k_before[e] != c.kc[e];
  EXPECT_GT(changed, 0);  // entry 0 appended
  for (int64_t j = 0; j < c.s.max_blocks * c.s.page; ++j) {  // none of entry 1's pages changed
    const int64_t base = c.slot(c.block_of(1, j), j % c.s.page, 0) * c.s.d;
    ASSERT_EQ(std::memcmp(&c.kc[base], &k_before[base], c.s.h_kv * c.s.d), 0) << j;
  }
}

// A key behind a table entry outside [0, num_blocks) is never read: its rows are NaN; rows
// that do not reach it are computed.
TEST(GqaDecodeRef, OutOfRangeBlocksGiveNanRows) {
  GqaCase c({.b = 1, .s_q = 2, .h_q = 2, .h_kv = 1, .seed = 6});
  c.seqlens[0] = 9;
  c.table[2] = 1000;  // positions 8.. (page 4)
  c.args.causal = true;
  ASSERT_TRUE(reference::gqa_decode(c.args).is_ok());
  for (int h = 0; h < 2; ++h) {
    EXPECT_FALSE(std::isnan(c.lse[h * 2 + 0]));  // token 0 sees 0..7
    EXPECT_TRUE(std::isnan(c.lse[h * 2 + 1]));   // token 1 sees position 8
    EXPECT_TRUE(std::isnan(c.out[(1 * 2 + h) * c.s.d]));
  }
}

// Data the reference checks before writing anything: lengths and colliding append slots.
TEST(GqaDecodeRef, RejectsBadDataWithoutWriting) {
  const struct {
    const char* what;
    void (*mutate)(GqaCase&);
    std::vector<std::string> parts;
  } cases[] = {
      {"negative", [](GqaCase& c) { c.seqlens[1] = -1; }, {"cache_seqlens[1]", ">= 0", "got -1"}},
      {"past the table", [](GqaCase& c) { c.seqlens[0] = 17; }, {"cache_seqlens[0]", "<= max_blocks_per_seq * page_size = 16", "got 17"}},
      {"shorter than s_q", [](GqaCase& c) { c.seqlens[0] = 1; }, {"cache_seqlens[0]", ">= s_q = 2", "got 1"}},
      {"one slot twice", [](GqaCase& c) { c.seqlens = {8, 8}, c.table[5] = c.table[1]; }, {"block_table", "distinct", "entry 0 token 0", "entry 1 token 0"}},
  };
  for (const auto& k : cases) {
    SCOPED_TRACE(k.what);
    GqaCase c({.s_q = 2, .append = true, .seed = 8});
    k.mutate(c);
    const std::vector<uint8_t> kc = c.kc;
    EXPECT_TRUE(testing::IsInvalid(reference::gqa_decode(c.args), k.parts));
    EXPECT_EQ(c.kc, kc);
    for (float x : c.out) ASSERT_TRUE(std::isnan(x));
  }
}

}  // namespace
}  // namespace mlakit
