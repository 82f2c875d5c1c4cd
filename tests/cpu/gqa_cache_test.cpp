// The CPU GQA cache tools (include/mlakit/gqa_cache.h, reference::): quantize / dequantize
// round trips with exact scales and error bounds, zero rows, per-tensor saturation, the append
// (positions, skipped entries / positions / blocks, the rotation against a float64 one, bytes
// outside the appended rows untouched), a validation error for every argument, empty inputs,
// and the GPU entry points' answer in a build without CUDA. (GPU against CPU, byte for byte:
// tests/gpu/gqa_cache_test.cpp.)
#include "mlakit/gqa_cache.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common/fp8_e4m3.h"
#include "cpu_test_util.h"
#include "gqa_case.h"
#include "reference/host_numeric.h"

namespace mlakit {
namespace {

using detail::GqaScaleLayout;
using testing::IsInvalid;
using testing::StatusIs;

constexpr uint16_t kPoison16 = 0x7fc0;  // NaN as bf16 and as fp16
constexpr uint8_t kPoison8 = 0x7f;      // NaN as fp8 e4m3 (127 as int8)

float half_to_float(uint16_t h, DType dtype) {
  return dtype == DType::kBF16 ? host::bf16_to_float(h) : host::fp16_to_float(h);
}
uint16_t float_to_half(float x, DType dtype) {
  return dtype == DType::kBF16 ? host::float_to_bf16(x) : host::float_to_fp16(x);
}

// The stored value before the scale.
float stored_value(const std::vector<uint8_t>& cache, int64_t index, DType dtype) {
  if (dtype == DType::kInt8) return static_cast<int8_t>(cache[index]);
  if (dtype == DType::kFP8E4M3) return detail::e4m3_to_float(cache[index]);
  return half_to_float(host::load_as<uint16_t>(cache.data(), index), dtype);
}

// |dequantized - x| allowed for a value x of a row with scale `scale`, read back as `dense`
// (the final rounding) or compared unrounded (dense = kFP32).
double quant_bound(double x, float scale, DType cache, DType dense) {
  double b = 0;
  if (cache == DType::kInt8) b = 0.5 * scale * (1 + 1e-6);
  if (cache == DType::kFP8E4M3) b = std::fabs(x) / 16 + scale * 0x1p-10 * (1 + 1e-6);
  if (cache == DType::kBF16) b = std::fabs(x) * 0x1p-8;  // half an ulp, relative
  if (cache == DType::kFP16) b = std::fabs(x) * 0x1p-11 + 0x1p-25;
  if (dense == DType::kBF16) b += (std::fabs(x) + b) * 0x1p-8;
  if (dense == DType::kFP16) b += (std::fabs(x) + b) * 0x1p-11 + 0x1p-25;
  return b;
}

// ---------------------------------------------------------------------------------------------
// quantize / dequantize

struct ConvertCase {
  int64_t blocks = 3, page = 5;
  int h_kv = 2, d = 64;
  DType dense = DType::kBF16, cache = DType::kInt8;
  GqaScaleLayout layout = GqaScaleLayout::kPerToken;
  int64_t pad = 8;  // elements between rows of the dense tensors

  int64_t rows() const { return blocks * page * h_kv; }
  int64_t pitch() const { return d + pad; }
  TensorRef dense_ref(void* data) const {
    return make_tensor(data, dense, {blocks, page, h_kv, d}, {page * h_kv * pitch(), h_kv * pitch(), pitch(), 1});
  }
};

// Rows of several magnitudes; row 1 all zero, row 2 one large value among small ones.
std::vector<uint16_t> random_dense(const ConvertCase& k, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<uint16_t> v(k.rows() * k.pitch(), kPoison16);
  for (int64_t r = 0; r < k.rows(); ++r) {
    const float magnitude = std::pow(10.f, static_cast<float>(r % 7) - 3.f);
    for (int c = 0; c < k.d; ++c) {
      float x = normal(rng) * magnitude;
      if (r == 1) x = 0;
      if (r == 2) x = c == 5 ? 300.f : 1e-3f * normal(rng);
      v[r * k.pitch() + c] = float_to_half(x, k.dense);
    }
  }
  return v;
}

void check_round_trip(const ConvertCase& k) {
  SCOPED_TRACE(std::string(dtype_name(k.dense)) + " -> " + dtype_name(k.cache) +
               (k.layout == GqaScaleLayout::kPerTensor ? " per tensor" : " per token") + " d " + std::to_string(k.d));
  std::vector<uint16_t> src = random_dense(k, 17 + k.d);
  std::vector<uint8_t> values(k.rows() * k.d, kPoison8);
  const bool per_token = k.layout == GqaScaleLayout::kPerToken;
  std::vector<float> scale(per_token ? k.rows() : 1, NAN);
  if (!per_token) scale[0] = 0.5f / 448.f;  // the large rows saturate
  GqaPagedCache cache{make_tensor(values.data(), k.cache, {k.blocks, k.page, k.h_kv, k.d}),
                      per_token ? make_tensor(scale.data(), DType::kFP32, {k.blocks, k.page, k.h_kv})
                                : make_tensor(scale.data(), DType::kFP32, {1})};
  const Status q = reference::quantize_gqa_cache(k.dense_ref(src.data()), cache);
  ASSERT_TRUE(q) << q.to_string();
  std::vector<uint16_t> back(k.rows() * k.pitch(), kPoison16);
  const Status dq = reference::dequantize_gqa_cache(cache, k.dense_ref(back.data()));
  ASSERT_TRUE(dq) << dq.to_string();

  const float qmax = k.cache == DType::kInt8 ? 127.f : 448.f;
  for (int64_t r = 0; r < k.rows(); ++r) {
    float amax = 0;
    for (int c = 0; c < k.d; ++c) amax = std::max(amax, std::fabs(half_to_float(src[r * k.pitch() + c], k.dense)));
    const float s = per_token ? scale[r] : scale[0];
    if (per_token) ASSERT_EQ(s, amax / qmax) << "row " << r;
    for (int c = 0; c < k.d; ++c) {
      const float x = half_to_float(src[r * k.pitch() + c], k.dense);
      const float stored = stored_value(values, r * k.d + c, k.cache);
      const float got = half_to_float(back[r * k.pitch() + c], k.dense);
      ASSERT_EQ(back[r * k.pitch() + c], float_to_half(stored * s, k.dense)) << "row " << r << " col " << c;
      ASSERT_FALSE(std::isnan(got)) << "row " << r << " col " << c;
      if (s == 0) {
        ASSERT_EQ(values[r * k.d + c], 0) << "row " << r << " col " << c;
        continue;
      }
      const double clamped = std::clamp<double>(x, -448.0 * s, 448.0 * s);  // per tensor: saturation
      ASSERT_LE(std::fabs(got - clamped), quant_bound(clamped, s, k.cache, k.dense))
          << "row " << r << " col " << c << ": " << x << " -> " << got << " (scale " << s << ")";
    }
    for (int64_t c = k.d; c < k.pitch(); ++c) ASSERT_EQ(back[r * k.pitch() + c], kPoison16) << "padding, row " << r;
  }
  if (per_token) EXPECT_EQ(scale[1], 0.f);  // the all-zero row
}

TEST(GqaCacheTools, QuantizeDequantizeRoundTrip) {
  for (DType dense : {DType::kBF16, DType::kFP16}) {
    for (int d : {64, 128, 256}) {
      check_round_trip({.d = d, .dense = dense, .cache = DType::kInt8});
      check_round_trip({.d = d, .dense = dense, .cache = DType::kFP8E4M3});
      check_round_trip({.d = d, .dense = dense, .cache = DType::kFP8E4M3, .layout = GqaScaleLayout::kPerTensor});
    }
  }
}

// The largest magnitude maps to +-127 / +-448; an all-zero row stores zeros and scale 0 and
// reads back as zeros, never NaN.
TEST(GqaCacheTools, LargestValueMapsToTheRangeEndAndZeroRowsStoreScaleZero) {
  for (DType cache : {DType::kInt8, DType::kFP8E4M3}) {
    const ConvertCase k{.blocks = 1, .page = 2, .h_kv = 1, .d = 64, .cache = cache, .pad = 0};
    std::vector<uint16_t> src(2 * 64, 0);
    src[3] = host::float_to_bf16(-2.5f);
    src[9] = host::float_to_bf16(1.0f);
    std::vector<uint8_t> values(2 * 64, kPoison8);
    std::vector<float> scale(2, NAN);
    const GqaPagedCache c{make_tensor(values.data(), cache, {1, 2, 1, 64}),
                          make_tensor(scale.data(), DType::kFP32, {1, 2, 1})};
    ASSERT_TRUE(reference::quantize_gqa_cache(k.dense_ref(src.data()), c));
    const float qmax = cache == DType::kInt8 ? 127.f : 448.f;
    EXPECT_EQ(scale[0], 2.5f / qmax);
    EXPECT_EQ(stored_value(values, 3, cache), -qmax);
    EXPECT_EQ(scale[1], 0.f);
    for (int c2 = 64; c2 < 128; ++c2) EXPECT_EQ(values[c2], 0) << c2;
    std::vector<uint16_t> back(2 * 64, kPoison16);
    ASSERT_TRUE(reference::dequantize_gqa_cache(c, k.dense_ref(back.data())));
    for (int c2 = 64; c2 < 128; ++c2) EXPECT_EQ(back[c2], 0) << c2;
  }
}

// ---------------------------------------------------------------------------------------------
// append

struct AppendSpec {
  DType dense = DType::kBF16, cache = DType::kBF16;
  GqaScaleLayout layout = GqaScaleLayout::kNone;
  int d = 64;
  int64_t page = 4;
  RotaryEmbedding rope{};
  int s_q = 3;
};

// Four entries of width 4 pages: 0 normal (its second page's block id invalid), 1 finished, 2
// with L = 1 < s_q (two tokens at negative positions), 3 with L past the table (two tokens
// past it). Caches and scales poisoned.
struct AppendCase {
  explicit AppendCase(const AppendSpec& spec, uint32_t seed = 5) : s(spec) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.f, 1.f);
    for (auto* v : {&k_new, &v_new}) {
      v->resize(b * s.s_q * h_kv * s.d);
      for (auto& x : *v) x = float_to_half(normal(rng), s.dense);
    }
    std::fill(k_new.begin(), k_new.begin() + s.d, 0);  // entry 0, token 0, head 0: a zero row
    const int64_t elems = num_blocks * s.page * h_kv * s.d;
    for (auto* c : {&kc, &vc}) c->assign(elems * dtype_size(s.cache), kPoison8);
    const int64_t n_scales = s.layout == GqaScaleLayout::kPerToken    ? num_blocks * s.page * h_kv
                             : s.layout == GqaScaleLayout::kPerTensor ? 1
                                                                      : 0;
    for (auto* sc : {&ks, &vs}) sc->assign(n_scales, NAN);
    if (s.layout == GqaScaleLayout::kPerTensor) ks[0] = 1.5f / 448.f, vs[0] = 2.f / 448.f;
    std::vector<int32_t> perm(num_blocks);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    table.assign(perm.begin(), perm.begin() + b * width);
    table[0 * width + 1] = static_cast<int32_t>(num_blocks);  // entry 0, page 1: invalid
    const int64_t capacity = width * s.page;
    seqlens = {static_cast<int32_t>(s.page + 2), 7, 1, static_cast<int32_t>(capacity + 2)};
    finished = {0, 1, 0, 0};
    rebuild();
  }
  AppendCase(const AppendCase&) = delete;

  void rebuild() {
    const std::initializer_list<int64_t> cache_shape = {num_blocks, s.page, h_kv, s.d};
    args = GqaCacheAppendArgs{};
    args.k_new = make_tensor(k_new.data(), s.dense, {b, s.s_q, h_kv, s.d});
    args.v_new = make_tensor(v_new.data(), s.dense, {b, s.s_q, h_kv, s.d});
    args.k_cache.values = make_tensor(kc.data(), s.cache, cache_shape);
    args.v_cache.values = make_tensor(vc.data(), s.cache, cache_shape);
    if (s.layout == GqaScaleLayout::kPerToken) {
      args.k_cache.scale = make_tensor(ks.data(), DType::kFP32, {num_blocks, s.page, h_kv});
      args.v_cache.scale = make_tensor(vs.data(), DType::kFP32, {num_blocks, s.page, h_kv});
    } else if (s.layout == GqaScaleLayout::kPerTensor) {
      args.k_cache.scale = make_tensor(ks.data(), DType::kFP32, {1});
      args.v_cache.scale = make_tensor(vs.data(), DType::kFP32, {1});
    }
    args.block_table = make_tensor(table.data(), DType::kInt32, {b, width});
    args.cache_seqlens = make_tensor(seqlens.data(), DType::kInt32, {b});
    args.finished = make_tensor(finished.data(), DType::kUInt8, {b});
    args.rope = s.rope;
  }

  // The cache row (block * page + row) * h_kv + hk token t of entry i lands on, or -1.
  int64_t slot_of(int64_t i, int t, int hk) const {
    if (finished[i]) return -1;
    const int64_t pos = seqlens[i] - s.s_q + t;
    if (pos < 0 || pos / s.page >= width) return -1;
    const int64_t block = table[i * width + pos / s.page];
    if (block < 0 || block >= num_blocks) return -1;
    return (block * s.page + pos % s.page) * h_kv + hk;
  }

  AppendSpec s;
  int64_t b = 4, width = 4, num_blocks = 4 * 4 + 2;
  int h_kv = 2;
  std::vector<uint16_t> k_new, v_new;
  std::vector<uint8_t> kc, vc, finished;
  std::vector<float> ks, vs;
  std::vector<int32_t> table, seqlens;
  GqaCacheAppendArgs args;
};

// Each written row against the float64 computation of the header's rule (k rotated with
// complex numbers, gqa_case.h's naive_rope), within the format's error; the per-token scale
// against max|x| / 127 or / 448 of the float64 row (the float rotation is within 1e-6 of it);
// every row nothing was appended to keeps its poison.
void check_append(const AppendSpec& spec) {
  SCOPED_TRACE(std::string(dtype_name(spec.dense)) + " -> " + dtype_name(spec.cache) + " d " + std::to_string(spec.d) +
               " page " + std::to_string(spec.page) + " rope " + std::to_string(static_cast<int>(spec.rope.style)) +
               "/" + std::to_string(spec.rope.rotary_dim));
  AppendCase c(spec);
  const Status st = reference::gqa_cache_append(c.args);
  ASSERT_TRUE(st) << st.to_string();
  const int64_t slots = c.num_blocks * spec.page * c.h_kv;
  std::vector<bool> written(slots, false);
  int rows = 0;
  for (int64_t i = 0; i < c.b; ++i) {
    for (int t = 0; t < spec.s_q; ++t) {
      for (int hk = 0; hk < c.h_kv; ++hk) {
        const int64_t slot = c.slot_of(i, t, hk);
        if (slot < 0) continue;
        written[slot] = true;
        ++rows;
        const int64_t pos = c.seqlens[i] - spec.s_q + t;
        for (const bool is_k : {true, false}) {
          const std::vector<uint16_t>& src = is_k ? c.k_new : c.v_new;
          std::vector<double> x(spec.d);
          for (int e = 0; e < spec.d; ++e)
            x[e] = half_to_float(src[((i * spec.s_q + t) * c.h_kv + hk) * spec.d + e], spec.dense);
          if (is_k) testing::naive_rope(x, spec.rope, static_cast<double>(pos));
          double amax = 0;
          for (double v : x) amax = std::max(amax, std::fabs(v));
          const std::vector<float>& sc = is_k ? c.ks : c.vs;
          float scale = 1.f;
          if (spec.layout == GqaScaleLayout::kPerTensor) scale = sc[0];
          if (spec.layout == GqaScaleLayout::kPerToken) {
            scale = sc[slot];
            const double want = amax / (spec.cache == DType::kInt8 ? 127.0 : 448.0);
            ASSERT_NEAR(scale, want, 1e-6 * want) << "scale of slot " << slot << (is_k ? " (k)" : " (v)");
          }
          const std::vector<uint8_t>& cache = is_k ? c.kc : c.vc;
          for (int e = 0; e < spec.d; ++e) {
            const double got = static_cast<double>(stored_value(cache, slot * spec.d + e, spec.cache)) * scale;
            const double want =
                spec.layout == GqaScaleLayout::kPerTensor ? std::clamp(x[e], -448.0 * scale, 448.0 * scale) : x[e];
            ASSERT_LE(std::fabs(got - want),
                      quant_bound(want, scale, spec.cache, DType::kFP32) + 2e-6 * (1 + std::fabs(want)))
                << "entry " << i << " token " << t << " head " << hk << " col " << e << (is_k ? " (k)" : " (v)");
          }
          if (is_k && i == 0 && t == 0 && hk == 0 && spec.layout == GqaScaleLayout::kPerToken) ASSERT_EQ(scale, 0.f);
        }
      }
    }
  }
  // Entry 0: positions page - 1 (page 0) and page, page + 1 (page 1: invalid block; with
  // page size 1, position 2 is on page 2 again); entry 2: position 0; entry 3: capacity - 1.
  EXPECT_EQ(rows, (spec.page == 1 ? 4 : 3) * c.h_kv);
  const int64_t row_bytes = spec.d * dtype_size(spec.cache);
  for (int64_t slot = 0; slot < slots; ++slot) {
    if (written[slot]) continue;
    for (const auto* cache : {&c.kc, &c.vc}) {
      ASSERT_TRUE(std::all_of(cache->begin() + slot * row_bytes, cache->begin() + (slot + 1) * row_bytes,
                              [](uint8_t x) { return x == kPoison8; }))
          << "slot " << slot << " was written";
    }
    if (spec.layout == GqaScaleLayout::kPerToken) ASSERT_TRUE(std::isnan(c.ks[slot]) && std::isnan(c.vs[slot])) << slot;
  }
}

TEST(GqaCacheTools, AppendWritesRotatedQuantizedRowsAtTheirPositionsAndSkipsTheRest) {
  const RotaryEmbedding ropes[] = {
      {}, {RopeStyle::kNeox, 10000.0, 0}, {RopeStyle::kGptj, 500.0, 32}, {RopeStyle::kNeox, 1e6, 18}};
  const struct {
    DType cache;
    GqaScaleLayout layout;
  } formats[] = {{DType::kBF16, GqaScaleLayout::kNone},
                 {DType::kInt8, GqaScaleLayout::kPerToken},
                 {DType::kFP8E4M3, GqaScaleLayout::kPerToken},
                 {DType::kFP8E4M3, GqaScaleLayout::kPerTensor}};
  for (DType dense : {DType::kBF16, DType::kFP16}) {
    for (const auto& f : formats) {
      for (const RotaryEmbedding& rope : ropes) {
        for (int d : {64, 256}) {
          for (int64_t page : {1, 4, 16}) {
            check_append({.dense = dense,
                          .cache = f.cache == DType::kBF16 ? dense : f.cache,
                          .layout = f.layout,
                          .d = d,
                          .page = page,
                          .rope = rope});
          }
        }
      }
    }
  }
}

// Far positions: a 1M-token table (page 2^16) with one entry at position 2^20 - 3.
TEST(GqaCacheTools, AppendRotatesAtLargePositions) {
  constexpr int64_t kPage = int64_t{1} << 16, kBlocks = 2;
  constexpr int d = 64;
  std::mt19937 rng(9);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<uint16_t> k_new(d), v_new(d);
  for (auto* v : {&k_new, &v_new}) {
    for (auto& x : *v) x = host::float_to_bf16(normal(rng));
  }
  std::vector<uint16_t> kc(kBlocks * kPage * d, kPoison16), vc(kc.size(), kPoison16);
  std::vector<int32_t> table(16, 0), seqlens = {(1 << 20) - 2};
  table[15] = 1;
  GqaCacheAppendArgs a;
  a.k_new = make_tensor(k_new.data(), DType::kBF16, {1, 1, 1, d});
  a.v_new = make_tensor(v_new.data(), DType::kBF16, {1, 1, 1, d});
  a.k_cache.values = make_tensor(kc.data(), DType::kBF16, {kBlocks, kPage, 1, d});
  a.v_cache.values = make_tensor(vc.data(), DType::kBF16, {kBlocks, kPage, 1, d});
  a.block_table = make_tensor(table.data(), DType::kInt32, {1, 16});
  a.cache_seqlens = make_tensor(seqlens.data(), DType::kInt32, {1});
  for (RotaryEmbedding rope :
       {RotaryEmbedding{RopeStyle::kNeox, 10000.0, 0}, RotaryEmbedding{RopeStyle::kGptj, 1e6, 0}}) {
    a.rope = rope;
    ASSERT_TRUE(reference::gqa_cache_append(a));
    const int64_t pos = seqlens[0] - 1, row = kPage + pos % kPage;
    std::vector<double> x(d);
    for (int e = 0; e < d; ++e) x[e] = host::bf16_to_float(k_new[e]);
    testing::naive_rope(x, rope, static_cast<double>(pos));
    for (int e = 0; e < d; ++e) {
      const double got = host::bf16_to_float(kc[row * d + e]);
      ASSERT_LE(std::fabs(got - x[e]), std::fabs(x[e]) * 0x1p-8 + 1e-5) << "col " << e;
      ASSERT_EQ(vc[row * d + e], v_new[e]) << "col " << e;
    }
  }
}

// quantize and append store one row alike (append_cache_row without rotation).
TEST(GqaCacheTools, QuantizeStoresWhatAnUnrotatedAppendStores) {
  AppendCase c({.dense = DType::kFP16, .cache = DType::kFP8E4M3, .layout = GqaScaleLayout::kPerToken, .d = 128});
  ASSERT_TRUE(reference::gqa_cache_append(c.args));
  // Entry 2's token 2 (position 0), kv head 1.
  const int64_t slot = c.slot_of(2, 2, 1);
  ASSERT_GE(slot, 0);
  const uint16_t* row = &c.v_new[((2 * c.s.s_q + 2) * c.h_kv + 1) * c.s.d];
  std::vector<uint8_t> q(c.s.d);
  float scale = NAN;
  ASSERT_TRUE(reference::quantize_gqa_cache(
      make_tensor(const_cast<uint16_t*>(row), DType::kFP16, {1, 1, 1, c.s.d}),
      {make_tensor(q.data(), DType::kFP8E4M3, {1, 1, 1, c.s.d}), make_tensor(&scale, DType::kFP32, {1, 1, 1})}));
  EXPECT_EQ(scale, c.vs[slot]);
  EXPECT_EQ(0, std::memcmp(q.data(), &c.vc[slot * c.s.d], c.s.d));
}

// ---------------------------------------------------------------------------------------------
// validation

struct Mutation {
  const char* what;
  std::function<void(AppendCase&)> mutate;
  StatusCode code;
  std::vector<std::string> parts;
};

TEST(GqaCacheTools, AppendValidationNamesEachArgument) {
  const StatusCode kInvalid = StatusCode::kInvalidArgument, kUnsupported = StatusCode::kUnsupported;
  const AppendSpec int8{.cache = DType::kInt8, .layout = GqaScaleLayout::kPerToken};
  const std::vector<std::pair<AppendSpec, Mutation>> cases = {
      {{},
       {"k_new dtype",
        [](AppendCase& c) { c.args.k_new.dtype = DType::kFP32; },
        kInvalid,
        {"k_new.dtype", "bf16 or fp16", "float32"}}},
      {{},
       {"k_new rank",
        [](AppendCase& c) { c.args.k_new.rank = 3; },
        kInvalid,
        {"k_new", "expected rank 4", "got rank 3"}}},
      {{},
       {"k_new d",
        [](AppendCase& c) { c.args.k_new.shape[3] = 96; },
        kUnsupported,
        {"k_new.shape[3] (d)", "64, 128 or 256", "got 96"}}},
      {{},
       {"k_new broadcast rows",
        [](AppendCase& c) {
          c.args.k_new.shape[0] = 1 << 30, c.args.k_new.shape[1] = 1 << 20,
          c.args.k_new.stride[0] = c.args.k_new.stride[1] = 0;
        },
        kInvalid,
        {"k_new", "2^48 rows"}}},
      {{},
       {"v_new dtype",
        [](AppendCase& c) { c.args.v_new.dtype = DType::kFP16; },
        kInvalid,
        {"v_new.dtype", "expected bf16 (the dtype of k_new)", "got fp16"}}},
      {{},
       {"v_new s_q",
        [](AppendCase& c) { c.args.v_new.shape[1] = 2; },
        kInvalid,
        {"v_new.shape[1] (s_q)", "expected 3", "got 2"}}},
      {{}, {"v_new missing", [](AppendCase& c) { c.args.v_new = TensorRef{}; }, kInvalid, {"v_new", "rank"}}},
      {{},
       {"k_cache dtype",
        [](AppendCase& c) { c.args.k_cache.values.dtype = DType::kFP16; },
        kInvalid,
        {"k_cache.values.dtype", "bf16 or int8 or fp8_e4m3", "got fp16"}}},
      {{},
       {"k_cache h_kv",
        [](AppendCase& c) { c.args.k_cache.values.shape[2] = 1; },
        kInvalid,
        {"k_cache.values.shape[2] (h_kv)", "expected 2", "got 1"}}},
      {{},
       {"k_cache d",
        [](AppendCase& c) { c.args.k_cache.values.shape[3] = 128; },
        kInvalid,
        {"k_cache.values.shape[3] (d)", "expected 64", "got 128"}}},
      {{},
       {"k_cache page",
        [](AppendCase& c) { c.args.k_cache.values.shape[1] = 0; },
        kInvalid,
        {"k_cache.values.shape[1] (page_block_size)", "got 0"}}},
      {{},
       {"v_cache dtype",
        [](AppendCase& c) { c.args.v_cache.values.dtype = DType::kInt8; },
        kInvalid,
        {"v_cache.values.dtype", "expected bf16 (the dtype of k_cache.values)", "got int8"}}},
      {{},
       {"v_cache blocks",
        [](AppendCase& c) { c.args.v_cache.values.shape[0] = 5; },
        kInvalid,
        {"v_cache.values.shape[0] (num_blocks)", "expected 18", "got 5"}}},
      {{},
       {"scale for bf16",
        [](AppendCase& c) { c.args.k_cache.scale = make_tensor(c.ks.data(), DType::kFP32, {1}); },
        kInvalid,
        {"k_cache.scale", "expected none", "got shape [1]"}}},
      {int8,
       {"int8 scale missing",
        [](AppendCase& c) { c.args.k_cache.scale = TensorRef{}; },
        kInvalid,
        {"k_cache.scale", "a int8 cache needs dequantization scales", "got none"}}},
      {int8,
       {"int8 per tensor",
        [](AppendCase& c) { c.args.k_cache.scale = make_tensor(c.ks.data(), DType::kFP32, {1}); },
        kInvalid,
        {"k_cache.scale", "expected rank 3", "int8 has per-token scales only", "got rank 1"}}},
      {int8,
       {"scale dtype",
        [](AppendCase& c) { c.args.k_cache.scale.dtype = DType::kInt32; },
        kInvalid,
        {"k_cache.scale.dtype", "float32", "int32"}}},
      {int8,
       {"scale page",
        [](AppendCase& c) { c.args.v_cache.scale.shape[1] = 3; },
        kInvalid,
        {"v_cache.scale.shape[1] (page_size)", "expected 4", "got 3"}}},
      {{.cache = DType::kFP8E4M3, .layout = GqaScaleLayout::kPerTensor},
       {"v layout",
        [](AppendCase& c) {
          c.args.v_cache.scale = make_tensor(c.ks.data(), DType::kFP32, {18, 4, 2});
        },
        kInvalid,
        {"v_cache.scale", "expected rank 1 (the layout of k_cache.scale)", "got rank 3"}}},
      {{},
       {"block_table dtype",
        [](AppendCase& c) { c.args.block_table.dtype = DType::kUInt8; },
        kInvalid,
        {"block_table.dtype", "int32", "uint8"}}},
      {{},
       {"block_table rows",
        [](AppendCase& c) { c.args.block_table.shape[0] = 3; },
        kInvalid,
        {"block_table.shape[0] (b)", "expected 4", "got 3"}}},
      {{},
       {"cache_seqlens",
        [](AppendCase& c) { c.args.cache_seqlens.shape[0] = 5; },
        kInvalid,
        {"cache_seqlens.shape[0] (b)", "expected 4", "got 5"}}},
      {{},
       {"finished dtype",
        [](AppendCase& c) { c.args.finished.dtype = DType::kInt32; },
        kInvalid,
        {"finished.dtype", "uint8", "int32"}}},
      {{},
       {"rope style",
        [](AppendCase& c) { c.args.rope.style = static_cast<RopeStyle>(3); },
        kInvalid,
        {"rope.style", "got 3"}}},
      {{}, {"rope theta", [](AppendCase& c) { c.args.rope.theta = 0; }, kInvalid, {"rope.theta", "> 0"}}},
      {{},
       {"rope rotary_dim",
        [](AppendCase& c) { c.args.rope.rotary_dim = 33; },
        kInvalid,
        {"rope.rotary_dim", "d = 64", "got 33"}}},
      {{},
       {"v cache over k cache",
        [](AppendCase& c) { c.args.v_cache.values.data = c.kc.data(); },
        kInvalid,
        {"expected memory disjoint from", "k_cache.values"}}},
      {{},
       {"k cache over k_new",
        [](AppendCase& c) { c.args.k_new.data = c.kc.data(); },
        kInvalid,
        {"k_cache.values", "expected memory disjoint from k_new"}}},
  };
  for (const auto& [spec, m] : cases) {
    SCOPED_TRACE(m.what);
    AppendCase c(spec);
    m.mutate(c);
    const std::vector<uint8_t> kc = c.kc;
    EXPECT_TRUE(StatusIs(reference::gqa_cache_append(c.args), m.code, m.parts));
    EXPECT_TRUE(StatusIs(gqa_cache_append(c.args, nullptr), m.code, m.parts)) << "the GPU entry point";
    EXPECT_EQ(c.kc, kc) << "nothing written";
  }
}

TEST(GqaCacheTools, QuantizeAndDequantizeValidationNamesEachArgument) {
  std::vector<uint16_t> dense(3 * 5 * 2 * 64);
  std::vector<uint8_t> values(3 * 5 * 2 * 64);
  std::vector<float> scale(3 * 5 * 2);
  const TensorRef d_ok = make_tensor(dense.data(), DType::kBF16, {3, 5, 2, 64});
  const TensorRef v_ok = make_tensor(values.data(), DType::kInt8, {3, 5, 2, 64});
  const TensorRef s_ok = make_tensor(scale.data(), DType::kFP32, {3, 5, 2});
  struct Case {
    const char* what;
    TensorRef dense, values, scale;
    StatusCode code;
    std::vector<std::string> q_parts, dq_parts;  // empty: the same as q_parts
  };
  auto with = [](TensorRef t, auto f) {
    f(t);
    return t;
  };
  const StatusCode kInvalid = StatusCode::kInvalidArgument;
  const Case cases[] = {
      {"dense dtype",
       with(d_ok, [](TensorRef& t) { t.dtype = DType::kFP32; }),
       v_ok,
       s_ok,
       kInvalid,
       {"src.dtype", "bf16 or fp16", "float32"},
       {"dst.dtype", "bf16 or fp16", "float32"}},
      {"dense d",
       with(d_ok, [](TensorRef& t) { t.shape[3] = 32; }),
       v_ok,
       s_ok,
       StatusCode::kUnsupported,
       {"src.shape[3] (d)", "64, 128 or 256", "got 32"},
       {"dst.shape[3] (d)", "expected 64", "got 32"}},
      {"dense rank",
       with(d_ok, [](TensorRef& t) { t.rank = 3; }),
       v_ok,
       s_ok,
       kInvalid,
       {"src", "expected rank 4", "got rank 3"},
       {"dst", "expected rank 4"}},
      {"values dtype",
       d_ok,
       with(v_ok, [](TensorRef& t) { t.dtype = DType::kBF16; }),
       s_ok,
       kInvalid,
       {"dst.values.dtype", "int8 or fp8_e4m3", "got bf16"},
       {"src.values.dtype", "int8 or fp8_e4m3", "got bf16"}},
      {"values blocks",
       d_ok,
       with(v_ok, [](TensorRef& t) { t.shape[0] = 2; }),
       s_ok,
       kInvalid,
       {"dst.values.shape[0] (num_blocks)", "expected 3", "got 2"},
       {"src.scale.shape[0] (num_blocks)", "expected 2", "got 3"}},
      {"values not contiguous",
       d_ok,
       with(v_ok, [](TensorRef& t) { t.stride[3] = 2; }),
       s_ok,
       kInvalid,
       {"dst.values"},
       {"src.values"}},
      {"scale missing", d_ok, v_ok, TensorRef{}, kInvalid, {"dst.scale", "got none"}, {"src.scale", "got none"}},
      {"scale dims",
       d_ok,
       v_ok,
       with(s_ok, [](TensorRef& t) { t.shape[2] = 1; }),
       kInvalid,
       {"dst.scale.shape[2] (h_kv)", "expected 2", "got 1"},
       {"src.scale.shape[2] (h_kv)", "expected 2", "got 1"}},
      {"int8 per tensor",
       d_ok,
       v_ok,
       make_tensor(scale.data(), DType::kFP32, {1}),
       kInvalid,
       {"dst.scale", "int8 has per-token scales only"},
       {"src.scale", "int8 has per-token scales only"}},
      {"overlap",
       make_tensor(values.data(), DType::kBF16, {3, 5, 1, 64}),
       make_tensor(values.data(), DType::kInt8, {3, 5, 1, 64}),
       make_tensor(scale.data(), DType::kFP32, {3, 5, 1}),
       kInvalid,
       {"dst.values", "expected memory disjoint from src"},
       {"dst", "expected memory disjoint from src.values"}},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.what);
    const GqaPagedCache cache{k.values, k.scale};
    EXPECT_TRUE(StatusIs(reference::quantize_gqa_cache(k.dense, cache), k.code, k.q_parts));
    EXPECT_TRUE(StatusIs(quantize_gqa_cache(k.dense, cache, nullptr), k.code, k.q_parts));
    const std::vector<std::string>& dq = k.dq_parts.empty() ? k.q_parts : k.dq_parts;
    const StatusCode dq_code = std::string(k.what) == "dense d" ? kInvalid : k.code;  // dst's d is compared to src's
    EXPECT_TRUE(StatusIs(reference::dequantize_gqa_cache(cache, k.dense), dq_code, dq));
    EXPECT_TRUE(StatusIs(dequantize_gqa_cache(cache, k.dense, nullptr), dq_code, dq));
  }
}

// ---------------------------------------------------------------------------------------------
// empty inputs and the build without CUDA

// NumPy's layout of a tensor without elements: null data, all strides 0.
TensorRef empty_tensor(DType dtype, std::initializer_list<int64_t> shape) {
  TensorRef t = make_tensor(nullptr, dtype, shape);
  for (int i = 0; i < t.rank; ++i) t.stride[i] = 0;
  return t;
}

void expect_ok_or_no_device(const Status& s) {
  EXPECT_TRUE(s.is_ok() || s.code() == StatusCode::kNoDevice) << s.to_string();
}

TEST(GqaCacheTools, EmptyInputsAreValid) {
  const TensorRef dense = empty_tensor(DType::kBF16, {0, 16, 2, 128});
  const GqaPagedCache cache{empty_tensor(DType::kFP8E4M3, {0, 16, 2, 128}), empty_tensor(DType::kFP32, {0, 16, 2})};
  EXPECT_TRUE(reference::quantize_gqa_cache(dense, cache));
  EXPECT_TRUE(reference::dequantize_gqa_cache(cache, dense));
  expect_ok_or_no_device(quantize_gqa_cache(dense, cache, nullptr));
  expect_ok_or_no_device(dequantize_gqa_cache(cache, dense, nullptr));

  // b = 0, and s_q = 0 with entries: nothing to append (the caches' other bytes untouched).
  for (int64_t b : {0, 2}) {
    std::vector<uint16_t> kc(2 * 4 * 1 * 64, kPoison16), vc = kc;
    std::vector<int32_t> table(8, 0), seqlens(2, 3);
    GqaCacheAppendArgs a;
    a.k_new = empty_tensor(DType::kBF16, {b, 0, 1, 64});
    a.v_new = empty_tensor(DType::kBF16, {b, 0, 1, 64});
    a.k_cache.values = make_tensor(kc.data(), DType::kBF16, {2, 4, 1, 64});
    a.v_cache.values = make_tensor(vc.data(), DType::kBF16, {2, 4, 1, 64});
    a.block_table = b ? make_tensor(table.data(), DType::kInt32, {b, 4}) : empty_tensor(DType::kInt32, {0, 4});
    a.cache_seqlens = b ? make_tensor(seqlens.data(), DType::kInt32, {b}) : empty_tensor(DType::kInt32, {0});
    a.rope = {RopeStyle::kNeox, 10000.0, 0};
    EXPECT_TRUE(reference::gqa_cache_append(a)) << "b " << b;
    for (uint16_t x : kc) ASSERT_EQ(x, kPoison16);
  }
}

TEST(GqaCacheTools, GpuEntryPointsWithoutCudaSayBuiltWithoutCuda) {
  if (MLAKIT_WITH_CUDA) GTEST_SKIP() << "a CUDA build: the GPU suite tests these entry points";
  ConvertCase k;
  std::vector<uint16_t> dense(k.rows() * k.pitch());
  std::vector<uint8_t> values(k.rows() * k.d);
  std::vector<float> scale(k.rows());
  const GqaPagedCache cache{make_tensor(values.data(), DType::kInt8, {k.blocks, k.page, k.h_kv, k.d}),
                            make_tensor(scale.data(), DType::kFP32, {k.blocks, k.page, k.h_kv})};
  AppendCase c({});
  for (const Status& s :
       {quantize_gqa_cache(k.dense_ref(dense.data()), cache, nullptr),
        dequantize_gqa_cache(cache, k.dense_ref(dense.data()), nullptr), gqa_cache_append(c.args, nullptr)}) {
    EXPECT_EQ(s.code(), StatusCode::kNoDevice) << s.to_string();
    EXPECT_NE(s.message().find("built without CUDA"), std::string::npos) << s.message();
  }
}

}  // namespace
}  // namespace mlakit
