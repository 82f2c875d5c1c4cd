// A small GQA decode problem on host memory (include/mlakit/gqa_decode.h) and an independent
// naive float64 computation of it, for the GQA reference and validation tests. The naive
// version is written from the header's text: it gathers each sequence into a contiguous
// [L, h_kv, d] float64 copy and attends directly (no paging, no shared code with the
// reference beyond the bit-exact format conversions). The GPU tests (tests/gpu/gqa_test_util.h)
// build their cases with it too: fp16 activations, chosen lengths, smaller values and NaN in
// every cache slot the step does not read (GqaSpec's last fields; their defaults leave the
// CPU tests' cases as they were).
#pragma once

#include <algorithm>
#include <cmath>
#include <complex>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "common/fp8_e4m3.h"
#include "common/rotary.h"
#include "host/gqa_decode_validate.h"
#include "mlakit/gqa_decode.h"
#include "reference/host_numeric.h"

namespace mlakit::testing {

using detail::GqaScaleLayout;

struct GqaSpec {
  int64_t b = 2;
  int s_q = 1, h_q = 4, h_kv = 2, d = 64;
  int64_t page = 4;
  int max_blocks = 4;
  DType cache = DType::kBF16;
  GqaScaleLayout scales = GqaScaleLayout::kNone;
  bool append = false;
  uint32_t seed = 1;
  DType q_dtype = DType::kBF16;  // q, k_new, v_new; a 16-bit cache (`cache`) must be the same dtype
  std::vector<int32_t> lengths;  // cache_seqlens; empty: random in [append ? s_q : 0, max_blocks * page]
  float amplitude = 1.f;         // cache values (dequantized) and new rows about amplitude * N(0, 1)
  // NaN in every cache slot that holds no token before the step (positions >= L, or >= L - s_q
  // with append: the appended slots start as NaN too; per-token scales NaN as well, int8 values
  // -128), and garbage in the block-table entries past each length's pages.
  bool poison = false;
};

struct GqaCase {
  explicit GqaCase(const GqaSpec& spec) : s(spec), num_blocks(spec.b * spec.max_blocks + 2) {
    std::mt19937 rng(s.seed);
    std::normal_distribution<float> normal(0.f, 1.f);
    auto halfs = [&](int64_t n, float amplitude) {
      std::vector<uint16_t> v(n);
      for (auto& x : v) x = to_half(amplitude * normal(rng));
      return v;
    };
    q = halfs(s.b * s.s_q * s.h_q * s.d, 1.f);
    if (s.append) {
      k_new = halfs(s.b * s.s_q * s.h_kv * s.d, s.amplitude);
      v_new = halfs(s.b * s.s_q * s.h_kv * s.d, s.amplitude);
    }
    const int64_t slots = num_blocks * s.page * s.h_kv;
    for (auto* cache : {&kc, &vc}) {
      cache->resize(slots * s.d * dtype_size(s.cache));
      for (int64_t e = 0; e < slots * s.d; ++e) {
        if (is_half(s.cache)) host::store_half(cache->data(), e, s.cache, s.amplitude * normal(rng));
        if (s.cache == DType::kFP8E4M3) (*cache)[e] = detail::float_to_e4m3(normal(rng));
        if (s.cache == DType::kInt8) (*cache)[e] = static_cast<uint8_t>(static_cast<int8_t>(rng() % 255 - 127));
      }
    }
    const float unit = s.cache == DType::kInt8 ? 1.f / 64 : 1.f;  // dequantized values of about N(0, 1)
    std::uniform_real_distribution<float> around(0.5f * unit, 1.5f * unit);
    const int64_t n_scales = s.scales == GqaScaleLayout::kPerToken ? slots : s.scales == GqaScaleLayout::kPerTensor;
    for (auto* sc : {&ks, &vs}) {
      sc->resize(n_scales);
      for (auto& x : *sc) x = s.amplitude * around(rng);
    }
    std::vector<int32_t> perm(num_blocks);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    table.assign(perm.begin(), perm.begin() + s.b * s.max_blocks);
    seqlens.resize(s.b);
    for (auto& L : seqlens) L = static_cast<int32_t>((s.append ? s.s_q : 0) + rng() % (s.max_blocks * s.page + 1 - (s.append ? s.s_q : 0)));
    if (!s.lengths.empty()) seqlens = s.lengths;
    alibi.resize(s.h_q);
    for (auto& x : alibi) x = 0.25f * around(rng) / unit;
    finished.assign(s.b, 0);
    out.assign(s.b * s.s_q * s.h_q * s.d, NAN);
    lse.assign(s.b * s.h_q * s.s_q, NAN);
    if (s.poison) poison_unused();
    rebuild();
  }
  GqaCase(const GqaCase&) = delete;  // args point into this object's buffers
  GqaCase& operator=(const GqaCase&) = delete;

  // Sets `args` to views of the buffers (fp32 out, lse, no options).
  void rebuild() {
    args = GqaDecodeArgs{};
    args.q = make_tensor(q.data(), s.q_dtype, {s.b, s.s_q, s.h_q, s.d});
    args.k_cache.values = make_tensor(kc.data(), s.cache, {num_blocks, s.page, s.h_kv, s.d});
    args.v_cache.values = make_tensor(vc.data(), s.cache, {num_blocks, s.page, s.h_kv, s.d});
    if (s.scales == GqaScaleLayout::kPerToken) {
      args.k_cache.scale = make_tensor(ks.data(), DType::kFP32, {num_blocks, s.page, s.h_kv});
      args.v_cache.scale = make_tensor(vs.data(), DType::kFP32, {num_blocks, s.page, s.h_kv});
    } else if (s.scales == GqaScaleLayout::kPerTensor) {
      args.k_cache.scale = make_tensor(ks.data(), DType::kFP32, {1});
      args.v_cache.scale = make_tensor(vs.data(), DType::kFP32, {1});
    }
    args.block_table = make_tensor(table.data(), DType::kInt32, {s.b, s.max_blocks});
    args.cache_seqlens = make_tensor(seqlens.data(), DType::kInt32, {s.b});
    if (s.append) {
      args.k_new = make_tensor(k_new.data(), s.q_dtype, {s.b, s.s_q, s.h_kv, s.d});
      args.v_new = make_tensor(v_new.data(), s.q_dtype, {s.b, s.s_q, s.h_kv, s.d});
    }
    args.out = make_tensor(out.data(), DType::kFP32, {s.b, s.s_q, s.h_q, s.d});
    args.lse = make_tensor(lse.data(), DType::kFP32, {s.b, s.h_q, s.s_q});
  }

  // Element index of (block, row, kv head, column) in a cache / of its per-token scale.
  int64_t slot(int64_t block, int64_t row, int hk) const { return (block * s.page + row) * s.h_kv + hk; }
  int64_t block_of(int64_t i, int64_t pos) const { return table[i * s.max_blocks + pos / s.page]; }

  // Cache value as the header defines it: stored * scale.
  double dequant(const std::vector<uint8_t>& cache, const std::vector<float>& sc, int64_t slot_index, int c) const {
    const int64_t e = slot_index * s.d + c;
    double v = is_half(s.cache) ? host::load_half(cache.data(), e, s.cache)
               : s.cache == DType::kInt8 ? static_cast<int8_t>(cache[e])
                                         : detail::e4m3_to_float(cache[e]);
    if (s.scales == GqaScaleLayout::kPerToken) v *= sc[slot_index];
    if (s.scales == GqaScaleLayout::kPerTensor) v *= sc[0];
    return v;
  }

  // What GqaSpec::poison describes, for the current seqlens (the constructor calls it).
  void poison_unused() {
    const int64_t rows = num_blocks * s.page;
    std::vector<bool> holds(rows, false);  // (block, row) holds a token of some entry
    for (int64_t i = 0; i < s.b; ++i) {
      const int64_t L = seqlens[i], kept = std::max<int64_t>(0, s.append ? L - s.s_q : L);
      for (int64_t j = 0; j < kept; ++j) holds[block_of(i, j) * s.page + j % s.page] = true;
      for (int64_t n = (L + s.page - 1) / s.page; n < s.max_blocks; ++n) {
        table[i * s.max_blocks + n] = n % 2 ? -7 : static_cast<int32_t>(num_blocks + 3);
      }
    }
    const int64_t elem = dtype_size(s.cache);
    const uint8_t nan_byte = s.cache == DType::kInt8 ? 0x80 : 0xff;  // int8: -128, never stored
    for (int64_t r = 0; r < rows; ++r) {
      if (holds[r]) continue;
      for (int hk = 0; hk < s.h_kv; ++hk) {
        const int64_t index = r * s.h_kv + hk;
        for (auto* cache : {&kc, &vc}) std::fill_n(cache->begin() + index * s.d * elem, s.d * elem, nan_byte);
        if (s.scales == GqaScaleLayout::kPerToken) ks[index] = vs[index] = NAN;
      }
    }
  }

  static bool is_half(DType t) { return t == DType::kBF16 || t == DType::kFP16; }
  uint16_t to_half(float x) const {
    return s.q_dtype == DType::kBF16 ? host::float_to_bf16(x) : host::float_to_fp16(x);
  }

  GqaSpec s;
  int64_t num_blocks;
  std::vector<uint16_t> q, k_new, v_new;
  std::vector<uint8_t> kc, vc, finished;
  std::vector<float> ks, vs, alibi, out, lse;
  std::vector<int32_t> table, seqlens;
  GqaDecodeArgs args;
};

// Rotation of head vector x by position pos, written with complex numbers: pair c is the
// complex number (x[i], x[j]) times e^(i * pos * theta^(-2c / rotary_dim)).
// q as the kernels rotate it (docs/contract.md, GQA decode): the shared float rotation
// (common/rotary.h, tested against long double in rotary_test.cpp), rounded to q's dtype.
inline void rope_q_as_kernels(std::vector<double>& q, const RotaryEmbedding& rope, int64_t pos, DType dtype) {
  const int d = static_cast<int>(q.size());
  const int rd = rope.style == RopeStyle::kNone ? 0 : (rope.rotary_dim ? rope.rotary_dim : d);
  std::vector<double> rotated = q;
  for (int e = 0; e < rd; ++e) {
    const detail::RopePair pair = detail::rope_pair(e, static_cast<int>(rope.style), rd);
    float cs, sn;
    detail::rope_cos_sin(pos, pair.c, rd, detail::rope_log_theta(rope.theta), &cs, &sn);
    rotated[e] = detail::rope_rotate(static_cast<float>(q[e]), static_cast<float>(q[pair.partner]), cs, sn, pair.first);
  }
  for (int e = 0; e < d; ++e) q[e] = host::round_to_half(static_cast<float>(rotated[e]), dtype);
}

inline void naive_rope(std::vector<double>& x, const RotaryEmbedding& rope, double pos) {
  if (rope.style == RopeStyle::kNone) return;
  const int rd = rope.rotary_dim ? rope.rotary_dim : static_cast<int>(x.size());
  for (int c = 0; c < rd / 2; ++c) {
    const int i = rope.style == RopeStyle::kNeox ? c : 2 * c, j = rope.style == RopeStyle::kNeox ? c + rd / 2 : 2 * c + 1;
    const std::complex<double> z = std::complex<double>(x[i], x[j]) * std::polar(1.0, pos / std::pow(rope.theta, 2.0 * c / rd));
    x[i] = z.real(), x[j] = z.imag();
  }
}

struct GqaNaive {
  std::vector<double> out, lse;  // [b, s_q, h_q, d], [b, h_q, s_q]
};

// The attention of every row from the cache's current contents (run it after the call when
// k_new was appended).
inline GqaNaive naive_gqa(const GqaCase& c, const GqaDecodeArgs& a) {
  const GqaSpec& s = c.s;
  GqaNaive r{std::vector<double>(c.out.size()), std::vector<double>(c.lse.size())};
  const double scale = a.softmax_scale ? *a.softmax_scale : 1.0f / std::sqrt(static_cast<float>(s.d));
  for (int64_t i = 0; i < s.b; ++i) {
    const int64_t L = c.seqlens[i];
    std::vector<double> K(L * s.h_kv * s.d), V(K.size());  // contiguous [L, h_kv, d]
    for (int64_t j = 0; j < L; ++j) {
      for (int hk = 0; hk < s.h_kv; ++hk) {
        for (int d = 0; d < s.d; ++d) {
          const int64_t slot = c.slot(c.block_of(i, j), j % s.page, hk);
          K[(j * s.h_kv + hk) * s.d + d] = c.dequant(c.kc, c.ks, slot, d);
          V[(j * s.h_kv + hk) * s.d + d] = c.dequant(c.vc, c.vs, slot, d);
        }
      }
    }
    for (int t = 0; t < s.s_q; ++t) {
      const int64_t pos = L - s.s_q + t;
      for (int h = 0; h < s.h_q; ++h) {
        const int hk = h / (s.h_q / s.h_kv);
        std::vector<double> q(s.d);
        for (int d = 0; d < s.d; ++d) q[d] = host::load_half(c.q.data(), ((i * s.s_q + t) * s.h_q + h) * s.d + d, s.q_dtype);
        rope_q_as_kernels(q, a.rope, pos, s.q_dtype);
        std::vector<double> z;
        std::vector<int64_t> keys;
        for (int64_t j = 0; j < L; ++j) {
          if (a.causal && j > pos) continue;
          if (a.window > 0 && j <= (a.causal ? pos : L - 1) - a.window) continue;
          double dot = 0;
          for (int d = 0; d < s.d; ++d) dot += q[d] * K[(j * s.h_kv + hk) * s.d + d];
          double logit = scale * dot;
          if (a.softcap > 0) logit = a.softcap * std::tanh(logit / a.softcap);
          if (!a.alibi_slopes.empty()) logit += c.alibi[h] * static_cast<double>(j - pos);
          z.push_back(logit);
          keys.push_back(j);
        }
        double* o = &r.out[((i * s.s_q + t) * s.h_q + h) * s.d];
        double& lse = r.lse[(i * s.h_q + h) * s.s_q + t];
        lse = INFINITY;
        if (z.empty()) continue;
        const double m = *std::max_element(z.begin(), z.end());
        double sum = 0;
        for (std::size_t n = 0; n < z.size(); ++n) {
          const double w = std::exp(z[n] - m);
          sum += w;
          for (int d = 0; d < s.d; ++d) o[d] += w * V[(keys[n] * s.h_kv + hk) * s.d + d];
        }
        for (int d = 0; d < s.d; ++d) o[d] /= sum;
        lse = m + std::log(sum);
      }
    }
  }
  return r;
}

}  // namespace mlakit::testing
