#include "support/decode_case.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <stdexcept>

#include "mlakit/reference.h"
#include "reference/host_numeric.h"

namespace mlakit::support {
namespace {

constexpr int kDqk = 576;
constexpr int kDv = 512;

uint16_t to_half(float x, DType dtype) {
  return dtype == DType::kBF16 ? host::float_to_bf16(x) : host::float_to_fp16(x);
}
uint16_t nan_half(DType dtype) { return dtype == DType::kBF16 ? 0x7fc0 : 0x7e00; }

}  // namespace

MlaDecodeProblem HostDecodeCase::problem() const {
  return MlaDecodeProblem{.b = b, .s_q = spec.s_q, .h_q = spec.h_q, .h_kv = spec.h_kv, .d_qk = kDqk, .d_v = kDv};
}

int64_t HostDecodeCase::out_elems() const { return b * spec.s_q * spec.h_q * kDv; }
int64_t HostDecodeCase::lse_elems() const { return b * spec.h_q * spec.s_q; }

MlaDecodeArgs HostDecodeCase::args(void* q_ptr, void* kv_ptr, void* table_ptr, void* seqlens_ptr,
                                   void* out_ptr, void* lse_ptr) const {
  MlaDecodeArgs a;
  a.q = make_tensor(q_ptr, spec.dtype, {b, spec.s_q, spec.h_q, kDqk});
  a.kv_cache = make_tensor(kv_ptr, spec.dtype, {num_blocks, spec.page_size, spec.h_kv, kDqk});
  a.block_table = make_tensor(table_ptr, DType::kInt32, {b, max_blocks_per_seq});
  a.cache_seqlens = make_tensor(seqlens_ptr, DType::kInt32, {b});
  a.out = make_tensor(out_ptr, spec.dtype, {b, spec.s_q, spec.h_q, kDv});
  a.lse = make_tensor(lse_ptr, DType::kFP32, {b, spec.h_q, spec.s_q});
  a.softmax_scale = spec.softmax_scale;
  a.causal = spec.causal;
  return a;
}

std::vector<int32_t> fixed_lengths(int64_t b, int32_t len) { return std::vector<int32_t>(b, len); }

std::vector<int32_t> varlen_lengths(int64_t b, int32_t mean, int32_t min_len, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> dist(mean, mean / 2.0);
  std::vector<int32_t> lens(b);
  for (auto& l : lens) l = std::max<int32_t>(min_len, static_cast<int32_t>(std::lround(dist(rng))));
  return lens;
}

HostDecodeCase make_decode_case(const DecodeCaseSpec& spec) {
  HostDecodeCase c;
  c.spec = spec;
  c.b = static_cast<int64_t>(spec.seqlens.size());
  c.seqlens = spec.seqlens;
  std::mt19937_64 rng(spec.seed);
  std::normal_distribution<float> normal(0.f, 1.f);

  std::vector<int64_t> blocks_of(c.b);
  int64_t used = 0;
  for (int64_t i = 0; i < c.b; ++i) {
    blocks_of[i] = (std::max(spec.seqlens[i], 0) + spec.page_size - 1) / spec.page_size;
    used += blocks_of[i];
    c.max_blocks_per_seq = std::max(c.max_blocks_per_seq, blocks_of[i]);
  }
  c.max_blocks_per_seq += 1;  // one garbage column past every sequence's last block
  c.num_blocks = used + spec.spare_blocks;

  // Physical blocks in shuffled order; entries past a sequence's blocks hold garbage that
  // must never be dereferenced (alternately -1 and far out of range).
  std::vector<int32_t> physical(c.num_blocks);
  std::iota(physical.begin(), physical.end(), 0);
  std::shuffle(physical.begin(), physical.end(), rng);
  c.block_table.assign(c.b * c.max_blocks_per_seq, 0);
  int64_t next = 0;
  for (int64_t i = 0; i < c.b; ++i) {
    for (int64_t j = 0; j < c.max_blocks_per_seq; ++j) {
      c.block_table[i * c.max_blocks_per_seq + j] =
          j < blocks_of[i] ? physical[next++] : ((i + j) % 2 ? -1 : 1 << 30);
    }
  }

  const int64_t row = static_cast<int64_t>(spec.h_kv) * kDqk;
  c.kv.assign(c.num_blocks * spec.page_size * row, nan_half(spec.dtype));
  for (int64_t i = 0; i < c.b; ++i) {
    for (int64_t pos = 0; pos < std::max(spec.seqlens[i], 0); ++pos) {
      int64_t block = c.block_table[i * c.max_blocks_per_seq + pos / spec.page_size];
      uint16_t* dst = &c.kv[(block * spec.page_size + pos % spec.page_size) * row];
      for (int64_t e = 0; e < row; ++e) dst[e] = to_half(std::clamp(normal(rng) * 0.1f, -1.f, 1.f), spec.dtype);
    }
  }
  c.q.resize(c.b * spec.s_q * spec.h_q * kDqk);
  for (auto& x : c.q) x = to_half(std::clamp(normal(rng), -1.f, 1.f), spec.dtype);
  return c;
}

ReferenceResult run_reference(const HostDecodeCase& c, int num_threads) {
  ReferenceResult r;
  r.out.assign(c.out_elems(), 0.f);
  r.lse.assign(c.lse_elems(), 0.f);
  auto args = c.args(const_cast<uint16_t*>(c.q.data()), const_cast<uint16_t*>(c.kv.data()),
                     const_cast<int32_t*>(c.block_table.data()), const_cast<int32_t*>(c.seqlens.data()),
                     r.out.data(), r.lse.data());
  args.out.dtype = DType::kFP32;
  Status s = reference::mla_decode(args, num_threads);
  if (!s) throw std::runtime_error(s.to_string());
  return r;
}

double decode_flops(const HostDecodeCase& c) {
  double attended = 0;
  for (int64_t i = 0; i < c.b; ++i) {
    for (int t = 0; t < c.spec.s_q; ++t) {
      int64_t L = std::max(c.seqlens[i], 0);
      int64_t vis = L;
      if (c.spec.causal && c.spec.s_q > 1) vis = std::clamp<int64_t>(L - c.spec.s_q + t + 1, 0, L);
      attended += static_cast<double>(vis);
    }
  }
  return attended * c.spec.h_q * (2.0 * kDqk + 2.0 * kDv);
}

double decode_bytes(const HostDecodeCase& c) {
  double total_len = 0;
  for (int32_t l : c.seqlens) total_len += std::max(l, 0);
  const double q_bytes = static_cast<double>(c.b) * c.spec.s_q * c.spec.h_q * kDqk * 2;
  const double kv_bytes = total_len * c.spec.h_kv * kDqk * 2;
  const double out_bytes = static_cast<double>(c.b) * c.spec.s_q * c.spec.h_q * kDv * 2;
  return q_bytes + kv_bytes + out_bytes;
}

}  // namespace mlakit::support
