// The GPU GQA cache tools against the CPU tools (reference::), byte for byte: quantize and
// dequantize (padded rows, NaN in the padding and in the outputs), and the append for every
// (dtype, cache format, d, rope style, rotary_dim < d and = d, page size 1 / 16 / 64) into
// NaN-prefilled caches with finished entries, short and overlong lengths and invalid block
// ids; rows misaligned for vector accesses; positions near 2^20; host pointers rejected.
// (The CPU tools against float64: tests/cpu/gqa_cache_test.cpp.)
#include "mlakit/gqa_cache.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gpu_test_util.h"
#include "reference/host_numeric.h"

namespace mlakit::testing {
namespace {

constexpr uint8_t kNan8 = 0x7f;  // NaN as fp8 e4m3 (127 as int8); kNan16, kNan32: gpu_test_util.h

enum class Scales { kNone, kPerToken, kPerTensor };

struct Format {
  DType cache;  // kBF16 here means "the dense dtype"
  Scales scales;
  const char* name;
};
const Format kFormats[] = {{DType::kBF16, Scales::kNone, "dense"},
                           {DType::kInt8, Scales::kPerToken, "int8"},
                           {DType::kFP8E4M3, Scales::kPerToken, "fp8"},
                           {DType::kFP8E4M3, Scales::kPerTensor, "fp8_tensor"}};

uint16_t to_half(float x, DType dtype) {
  return dtype == DType::kBF16 ? host::float_to_bf16(x) : host::float_to_fp16(x);
}

// n 16-bit values of several magnitudes (row by row of `row` values), some rows all zero.
std::vector<uint16_t> random_halves(int64_t rows, int64_t row, DType dtype, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<uint16_t> v(rows * row);
  for (int64_t r = 0; r < rows; ++r) {
    const float magnitude = r % 11 == 4 ? 0.f : std::pow(10.f, static_cast<float>(r % 7) - 3.f);
    for (int64_t c = 0; c < row; ++c) v[r * row + c] = to_half(normal(rng) * magnitude, dtype);
  }
  return v;
}

// The 32-bit words of a float vector (NaN compares equal to itself bit for bit).
std::vector<uint32_t> bits_of(const std::vector<float>& v) {
  std::vector<uint32_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = host::float_to_bits(v[i]);
  return out;
}

// Passes when the vectors are equal; else names the first differing element (a failure does
// not print megabytes of bytes).
template <typename T>
::testing::AssertionResult SameElements(const std::vector<T>& gpu, const std::vector<T>& cpu) {
  if (gpu.size() != cpu.size()) {
    return ::testing::AssertionFailure() << "sizes differ: " << gpu.size() << " vs " << cpu.size();
  }
  const auto diff = std::mismatch(gpu.begin(), gpu.end(), cpu.begin());
  if (diff.first == gpu.end()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "element " << (diff.first - gpu.begin()) << ": gpu "
                                       << static_cast<uint64_t>(*diff.first) << ", cpu "
                                       << static_cast<uint64_t>(*diff.second);
}

// ---------------------------------------------------------------------------------------------

TEST(GqaCacheGpu, QuantizeAndDequantizeMatchTheCpuBitForBit) {
  MLAKIT_SKIP_WITHOUT_GPU();
  constexpr int64_t kBlocks = 7, kPage = 16, kHkv = 3;
  for (DType dense : {DType::kBF16, DType::kFP16}) {
    for (const Format& f : kFormats) {
      if (f.scales == Scales::kNone) continue;
      for (int d : {64, 128, 256}) {
        SCOPED_TRACE(std::string(dtype_name(dense)) + " " + f.name + " d " + std::to_string(d));
        const int64_t rows = kBlocks * kPage * kHkv, pitch = d + 8;  // padded src / dst rows
        const std::vector<uint16_t> raw = random_halves(rows, d, dense, 31 + d);
        std::vector<uint16_t> src(rows * pitch, kNan16);
        for (int64_t r = 0; r < rows; ++r) std::copy_n(&raw[r * d], d, &src[r * pitch]);
        const bool per_token = f.scales == Scales::kPerToken;
        std::vector<uint8_t> values(rows * d, kNan8);
        std::vector<float> scale(per_token ? rows : 1, NAN);
        if (!per_token) scale[0] = 0.05f / 448.f;  // the large rows saturate
        std::vector<uint16_t> back(rows * pitch, kNan16);

        auto dense_ref = [&](void* p) {
          return make_tensor(p, dense, {kBlocks, kPage, kHkv, d}, {kPage * kHkv * pitch, kHkv * pitch, pitch, 1});
        };
        auto cache_ref = [&](void* v, void* s) {
          return GqaPagedCache{
              make_tensor(v, f.cache, {kBlocks, kPage, kHkv, d}),
              per_token ? make_tensor(s, DType::kFP32, {kBlocks, kPage, kHkv}) : make_tensor(s, DType::kFP32, {1})};
        };
        DeviceBuffer d_src(src), d_values(values), d_scale(scale), d_back(back);
        Status st = quantize_gqa_cache(dense_ref(d_src.get()), cache_ref(d_values.get(), d_scale.get()), nullptr);
        ASSERT_TRUE(st) << st.to_string();
        st = dequantize_gqa_cache(cache_ref(d_values.get(), d_scale.get()), dense_ref(d_back.get()), nullptr);
        ASSERT_TRUE(st) << st.to_string();
        MLAKIT_ASSERT_CUDA(cudaDeviceSynchronize());

        ASSERT_TRUE(reference::quantize_gqa_cache(dense_ref(src.data()), cache_ref(values.data(), scale.data())));
        ASSERT_TRUE(reference::dequantize_gqa_cache(cache_ref(values.data(), scale.data()), dense_ref(back.data())));
        EXPECT_TRUE(SameElements(d_values.download<uint8_t>(), values)) << "values";
        EXPECT_TRUE(SameElements(bits_of(d_scale.download<float>()), bits_of(scale))) << "scales";
        EXPECT_TRUE(SameElements(d_back.download<uint16_t>(), back)) << "dequantized (padding: NaN on both)";
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------

struct AppendSpec {
  DType dense = DType::kBF16;
  Format format = kFormats[0];
  int d = 128;
  int64_t page = 16;
  RotaryEmbedding rope{};
  int s_q = 3;
  int64_t row_pad = 0;  // elements added to the rows' strides (odd: rows misaligned for vectors)
  uint32_t seed = 1;
};

// Host buffers of one append and their device copies; run() appends on both sides.
struct AppendCase {
  explicit AppendCase(const AppendSpec& spec) : s(spec) {
    std::mt19937 rng(s.seed);
    cache_dtype = s.format.cache == DType::kBF16 ? s.dense : s.format.cache;
    row = s.d + s.row_pad;
    k_new = random_halves(b * s.s_q * h_kv, row, s.dense, s.seed);
    v_new = random_halves(b * s.s_q * h_kv, row, s.dense, s.seed + 1000);
    const int64_t slots = num_blocks * s.page * h_kv;
    const int64_t bytes = slots * row * static_cast<int64_t>(dtype_size(cache_dtype));
    if (dtype_size(cache_dtype) == 2) {
      kc.resize(bytes);
      for (int64_t e = 0; e < slots * row; ++e) host::store_as<uint16_t>(kc.data(), e, kNan16);
    } else {
      kc.assign(bytes, kNan8);
    }
    vc = kc;
    const int64_t n_scales = s.format.scales == Scales::kPerToken ? slots : (s.format.scales == Scales::kPerTensor);
    ks.assign(n_scales, NAN);
    vs.assign(n_scales, NAN);
    if (s.format.scales == Scales::kPerTensor) ks[0] = 0.8f / 448.f, vs[0] = 3.f / 448.f;
    // Distinct blocks per entry, some ids invalid; lengths: ordinary, 1 (< s_q), 0, past the
    // table; two entries finished.
    std::vector<int32_t> perm(num_blocks);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    table.assign(b * width, 0);
    for (int64_t i = 0; i < b * width; ++i) table[i] = perm[i];  // no two appended rows on one slot
    const int32_t invalid[] = {-1, static_cast<int32_t>(num_blocks), 1 << 30, INT32_MIN};
    for (int n = 0; n < 4; ++n) table[(2 * n + 1) * width + n % width] = invalid[n];
    const int64_t capacity = width * s.page;
    seqlens.resize(b);
    finished.assign(b, 0);
    for (int64_t i = 0; i < b; ++i) {
      seqlens[i] = static_cast<int32_t>(s.s_q + rng() % (capacity - s.s_q + 1));
      if (i % 5 == 2) seqlens[i] = 1;
      if (i % 7 == 3) seqlens[i] = 0;
      if (i % 6 == 5) seqlens[i] = static_cast<int32_t>(capacity + 1);
      if (i % 4 == 1) finished[i] = 1;
    }
  }

  // Views of the given buffers with this case's shapes.
  GqaCacheAppendArgs args(void* kn, void* vn, void* kcv, void* vcv, void* kss, void* vss, void* bt, void* sl,
                          void* fin) const {
    GqaCacheAppendArgs a;
    const int64_t new_strides[4] = {s.s_q * h_kv * row, h_kv * row, row, 1};
    a.k_new = make_tensor(kn, s.dense, {b, s.s_q, h_kv, s.d},
                          {new_strides[0], new_strides[1], new_strides[2], new_strides[3]});
    a.v_new = make_tensor(vn, s.dense, {b, s.s_q, h_kv, s.d},
                          {new_strides[0], new_strides[1], new_strides[2], new_strides[3]});
    a.k_cache.values =
        make_tensor(kcv, cache_dtype, {num_blocks, s.page, h_kv, s.d}, {s.page * h_kv * row, h_kv * row, row, 1});
    a.v_cache.values =
        make_tensor(vcv, cache_dtype, {num_blocks, s.page, h_kv, s.d}, {s.page * h_kv * row, h_kv * row, row, 1});
    if (s.format.scales == Scales::kPerToken) {
      a.k_cache.scale = make_tensor(kss, DType::kFP32, {num_blocks, s.page, h_kv});
      a.v_cache.scale = make_tensor(vss, DType::kFP32, {num_blocks, s.page, h_kv});
    } else if (s.format.scales == Scales::kPerTensor) {
      a.k_cache.scale = make_tensor(kss, DType::kFP32, {1});
      a.v_cache.scale = make_tensor(vss, DType::kFP32, {1});
    }
    a.block_table = make_tensor(bt, DType::kInt32, {b, width});
    a.cache_seqlens = make_tensor(sl, DType::kInt32, {b});
    a.finished = make_tensor(fin, DType::kUInt8, {b});
    a.rope = s.rope;
    return a;
  }

  // Appends on the GPU (copies of the buffers) and on the CPU (the buffers); compares all bytes
  // of both caches and scales, then checks which rows of the GPU's k cache changed.
  void run_and_compare() {
    DeviceBuffer d_kn(k_new), d_vn(v_new), d_kc(kc), d_vc(vc), d_bt(table), d_sl(seqlens), d_fin(finished);
    DeviceBuffer d_ks(std::max<size_t>(ks.size(), 1) * 4), d_vs(std::max<size_t>(vs.size(), 1) * 4);
    if (!ks.empty()) d_ks.upload(ks.data(), ks.size() * 4), d_vs.upload(vs.data(), vs.size() * 4);
    const Status st = gqa_cache_append(args(d_kn.get(), d_vn.get(), d_kc.get(), d_vc.get(), d_ks.get(), d_vs.get(),
                                            d_bt.get(), d_sl.get(), d_fin.get()),
                                       nullptr);
    ASSERT_TRUE(st) << st.to_string();
    MLAKIT_ASSERT_CUDA(cudaDeviceSynchronize());
    const std::vector<uint8_t> kc_before = kc;
    ASSERT_TRUE(reference::gqa_cache_append(args(k_new.data(), v_new.data(), kc.data(), vc.data(), ks.data(), vs.data(),
                                                 table.data(), seqlens.data(), finished.data())));
    const std::vector<uint8_t> gpu_kc = d_kc.download<uint8_t>(), gpu_vc = d_vc.download<uint8_t>();
    EXPECT_TRUE(SameElements(gpu_kc, kc)) << "k_cache.values";
    EXPECT_TRUE(SameElements(gpu_vc, vc)) << "v_cache.values";
    if (!ks.empty()) {
      std::vector<float> gks(ks.size()), gvs(vs.size());
      d_ks.download_to(gks.data(), gks.size() * 4);
      d_vs.download_to(gvs.data(), gvs.size() * 4);
      EXPECT_TRUE(SameElements(bits_of(gks), bits_of(ks))) << "k_cache.scale";
      EXPECT_TRUE(SameElements(bits_of(gvs), bits_of(vs))) << "v_cache.scale";
    }
    // Independently of the CPU: exactly the rows of live entries at valid positions and blocks
    // changed; the rest keeps its NaN prefill (finished entries, skipped rows, row padding).
    std::vector<bool> live(num_blocks * s.page * h_kv, false);
    for (int64_t i = 0; i < b; ++i) {
      for (int t = 0; t < s.s_q && !finished[i]; ++t) {
        const int64_t pos = static_cast<int64_t>(seqlens[i]) - s.s_q + t;
        if (pos < 0 || pos >= width * s.page) continue;
        const int64_t block = table[i * width + pos / s.page];
        if (block < 0 || block >= num_blocks) continue;
        for (int hk = 0; hk < h_kv; ++hk) live[(block * s.page + pos % s.page) * h_kv + hk] = true;
        ++appended;
      }
    }
    const int64_t elem = static_cast<int64_t>(dtype_size(cache_dtype));
    for (int64_t slot = 0; slot < static_cast<int64_t>(live.size()); ++slot) {
      const int64_t first = slot * row * elem, data_end = first + s.d * elem, end = first + row * elem;
      const bool same = std::equal(gpu_kc.begin() + first, gpu_kc.begin() + end, kc_before.begin() + first);
      if (!live[slot]) {
        ASSERT_TRUE(same) << "slot " << slot << ": written, but no appended row lands there";
        if (s.format.scales == Scales::kPerToken) {
          ASSERT_TRUE(std::isnan(ks[slot])) << "scale of slot " << slot;
        }
      } else {
        ASSERT_TRUE(std::equal(gpu_kc.begin() + data_end, gpu_kc.begin() + end, kc_before.begin() + data_end))
            << "slot " << slot << ": row padding written";
      }
    }
  }

  AppendSpec s;
  DType cache_dtype;
  int64_t row;
  int64_t b = 12, width = 4, num_blocks = 12 * 4 + 3;  // a block of its own for every table entry
  int h_kv = 2;
  int appended = 0;  // tokens appended (of all kv heads)
  std::vector<uint16_t> k_new, v_new;
  std::vector<uint8_t> kc, vc, finished;
  std::vector<float> ks, vs;
  std::vector<int32_t> table, seqlens;
};

TEST(GqaCacheGpu, AppendMatchesTheCpuBitForBit) {
  MLAKIT_SKIP_WITHOUT_GPU();
  int cases = 0, tokens = 0;
  for (DType dense : {DType::kBF16, DType::kFP16}) {
    for (const Format& f : kFormats) {
      for (int d : {64, 128, 256}) {
        // rotary_dim: 0 (= d), d / 2 (lane blocks pair up whole: shuffles) and 2, 6 or 18 (not
        // a multiple of d / 32 values per lane at half: reloads from src).
        const int partial = d == 64 ? 6 : (d == 128 ? 18 : 2);
        const RotaryEmbedding ropes[] = {{},
                                         {RopeStyle::kNeox, 10000.0, 0},
                                         {RopeStyle::kNeox, 1e6, d / 2},
                                         {RopeStyle::kNeox, 500.0, partial},
                                         {RopeStyle::kGptj, 10000.0, 0},
                                         {RopeStyle::kGptj, 123.5, partial}};
        for (const RotaryEmbedding& rope : ropes) {
          for (int64_t page : {1, 16, 64}) {
            SCOPED_TRACE(std::string(dtype_name(dense)) + " " + f.name + " d " + std::to_string(d) + " rope " +
                         std::to_string(static_cast<int>(rope.style)) + "/" + std::to_string(rope.rotary_dim) +
                         " page " + std::to_string(page));
            AppendCase c({.dense = dense,
                          .format = f,
                          .d = d,
                          .page = page,
                          .rope = rope,
                          .seed = static_cast<uint32_t>(++cases)});
            c.run_and_compare();
            if (HasFatalFailure()) return;
            tokens += c.appended;
          }
        }
      }
    }
  }
  EXPECT_EQ(cases, 2 * 4 * 3 * 6 * 3);
  EXPECT_GT(tokens, cases * 10);  // most entries append
}

// Rows whose strides are odd element counts: the vector accesses fall back to scalar ones.
TEST(GqaCacheGpu, AppendOfMisalignedRowsMatchesTheCpu) {
  MLAKIT_SKIP_WITHOUT_GPU();
  for (const Format& f : kFormats) {
    for (int64_t pad : {1, 3}) {
      SCOPED_TRACE(std::string(f.name) + " pad " + std::to_string(pad));
      AppendCase c({.dense = DType::kFP16,
                    .format = f,
                    .d = 128,
                    .page = 16,
                    .rope = {RopeStyle::kNeox, 10000.0, 0},
                    .row_pad = pad,
                    .seed = 77});
      c.run_and_compare();
      if (HasFatalFailure()) return;
    }
  }
}

// Positions near 2^20 (a 16384-entry table of 64-token pages), both styles.
TEST(GqaCacheGpu, AppendAtLargePositionsMatchesTheCpu) {
  MLAKIT_SKIP_WITHOUT_GPU();
  for (RopeStyle style : {RopeStyle::kNeox, RopeStyle::kGptj}) {
    AppendCase c(
        {.dense = DType::kBF16, .format = kFormats[2], .d = 128, .page = 64, .rope = {style, 1e6, 0}, .seed = 5});
    c.width = 16384;
    c.table.assign(c.b * c.width, -1);
    for (int64_t i = 0; i < c.b; ++i) {
      c.seqlens[i] = (1 << 20) - static_cast<int32_t>(37 * i);
      const int64_t last = (c.seqlens[i] - 1) / 64, first = (c.seqlens[i] - c.s.s_q) / 64;
      for (int64_t p = first; p <= last; ++p)
        c.table[i * c.width + p] = static_cast<int32_t>((2 * i + p - first) % c.num_blocks);
    }
    c.run_and_compare();
    if (HasFatalFailure()) return;
    EXPECT_GT(c.appended, 0);
  }
}

TEST(GqaCacheGpu, EmptyAppendLaunchesNothingAndHostPointersAreRejected) {
  MLAKIT_SKIP_WITHOUT_GPU();
  AppendCase c({.s_q = 1});
  DeviceBuffer d_kn(c.k_new), d_vn(c.v_new), d_kc(c.kc), d_vc(c.vc), d_bt(c.table), d_sl(c.seqlens), d_fin(c.finished);
  GqaCacheAppendArgs a =
      c.args(d_kn.get(), d_vn.get(), d_kc.get(), d_vc.get(), nullptr, nullptr, d_bt.get(), d_sl.get(), d_fin.get());
  a.k_new.shape[1] = a.v_new.shape[1] = 0;  // s_q = 0
  Status st = gqa_cache_append(a, nullptr);
  ASSERT_TRUE(st) << st.to_string();
  MLAKIT_ASSERT_CUDA(cudaDeviceSynchronize());
  EXPECT_TRUE(SameElements(d_kc.download<uint8_t>(), c.kc));

  a = c.args(c.k_new.data(), d_vn.get(), d_kc.get(), d_vc.get(), nullptr, nullptr, d_bt.get(), d_sl.get(), d_fin.get());
  st = gqa_cache_append(a, nullptr);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  EXPECT_NE(st.message().find("k_new: expected device memory"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace mlakit::testing
