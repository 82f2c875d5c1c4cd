#include "support/sparse_decode_case.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <stdexcept>

#include "mlakit/fp8_cache.h"
#include "reference/host_numeric.h"

namespace mlakit::support {
namespace {

constexpr int64_t kV32TokenBytes = 656, kV4TokenBytes = 584;

void throw_if_error(const Status& s) {
  if (!s) throw std::runtime_error(s.to_string());
}

// A random cache of `spec`'s layout (quantized from bf16 by the library's CPU tools) and its
// dequantized twin; indices of every kind (header comment), lengths past topk included.
HostSparseCache make_cache(const SparseCaseSpec& spec, int64_t num_blocks, int64_t page_size, int topk,
                           bool with_lengths, std::mt19937_64& rng) {
  HostSparseCache c;
  c.num_blocks = num_blocks;
  c.page_size = page_size;
  c.topk = topk;
  const int d_qk = spec.v4 ? 512 : 576;
  c.block_bytes = spec.v4 ? (page_size * kV4TokenBytes + 575) / 576 * 576 : page_size * kV32TokenBytes;
  const int64_t tokens = c.tokens();
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<uint16_t> raw(tokens * d_qk);
  for (auto& x : raw) x = host::float_to_bf16(std::clamp(normal(rng) * 0.1f, -1.f, 1.f));
  c.bytes.assign(num_blocks * c.block_bytes, 0);
  c.dequantized.resize(tokens * d_qk);
  const TensorRef rows = make_tensor(raw.data(), DType::kBF16, {num_blocks, page_size, 1, d_qk});
  const TensorRef twin = make_tensor(c.dequantized.data(), DType::kBF16, {num_blocks, page_size, 1, d_qk});
  const TensorRef cache = c.tensor(c.bytes.data(), spec.v4);
  if (spec.v4) {
    throw_if_error(reference::quantize_mla_cache_fp8_v4(rows, cache));
    throw_if_error(reference::dequantize_mla_cache_fp8_v4(cache, twin));
  } else {
    throw_if_error(reference::quantize_mla_cache_fp8(rows, cache));
    throw_if_error(reference::dequantize_mla_cache_fp8(cache, twin));
  }
  std::uniform_int_distribution<int64_t> slot(0, tokens - 1);
  c.indices.resize(spec.b * spec.s_q * topk);
  for (size_t i = 0; i < c.indices.size(); ++i) {
    const int kind = static_cast<int>(i % 11);
    // Invalid slots at both ends of int32 too: the kernels test validity with one unsigned
    // compare (kernels/mla_params.h, slot_limit).
    c.indices[i] = kind == 3 ? -1
                 : kind == 7 ? (i % 3 == 0 ? std::numeric_limits<int32_t>::max() : static_cast<int32_t>(tokens + i % 5))
                 : kind == 9 ? (i % 2 == 0 ? std::numeric_limits<int32_t>::min() : -7)
                 : kind == 5 && i > 0 ? c.indices[i - 1]  // a duplicate of the previous entry
                                      : static_cast<int32_t>(slot(rng));
  }
  if (with_lengths) {
    std::uniform_int_distribution<int32_t> len(0, topk + 3);  // past topk: clamped
    c.lengths.resize(spec.b);
    for (auto& l : c.lengths) l = len(rng);
  }
  return c;
}

void poison_cache(HostSparseCache& c, const SparseCaseSpec& s, bool v4) {
  const int64_t tokens = c.tokens();
  std::vector<bool> listed(tokens, false);
  for (int64_t i = 0; i < s.b; ++i) {
    const int64_t counted = c.lengths.empty() ? c.topk : std::clamp<int64_t>(c.lengths[i], 0, c.topk);
    for (int t = 0; t < s.s_q; ++t) {
      const int32_t* row = c.indices.data() + (i * s.s_q + t) * c.topk;
      for (int64_t k = 0; k < counted; ++k) {
        if (row[k] >= 0 && row[k] < tokens) listed[row[k]] = true;
      }
    }
  }
  const int d_qk = v4 ? 512 : 576;
  std::vector<uint8_t> poisoned(c.bytes.size(), 0xFF);  // padding stays 0xFF
  for (int64_t slot = 0; slot < tokens; ++slot) {
    const int64_t block = slot / c.page_size, offset = slot % c.page_size;
    uint8_t* dst = poisoned.data() + block * c.block_bytes;
    const uint8_t* src = c.bytes.data() + block * c.block_bytes;
    if (listed[slot]) {
      if (v4) {  // the record and the scale record
        std::copy_n(src + offset * 576, 576, dst + offset * 576);
        const int64_t scales = c.page_size * 576 + offset * 8;
        std::copy_n(src + scales, 8, dst + scales);
      } else {
        std::copy_n(src + offset * kV32TokenBytes, kV32TokenBytes, dst + offset * kV32TokenBytes);
      }
    } else {
      std::fill_n(c.dequantized.begin() + slot * d_qk, d_qk, uint16_t{0x7fc0});
    }
  }
  c.bytes.swap(poisoned);
}

}  // namespace

TensorRef HostSparseCache::tensor(void* data, bool v4) const {
  const int64_t token_bytes = v4 ? kV4TokenBytes : kV32TokenBytes;
  return make_tensor(data, DType::kUInt8, {num_blocks, page_size, 1, token_bytes},
                     {block_bytes, token_bytes, token_bytes, 1});
}

MlaSparseDecodeProblem HostSparseCase::problem() const {
  return MlaSparseDecodeProblem{
      .b = spec.b, .s_q = spec.s_q, .h_q = spec.h_q, .topk = spec.topk, .extra_topk = spec.extra_topk};
}
int64_t HostSparseCase::out_elems() const { return spec.b * spec.s_q * spec.h_q * 512; }
int64_t HostSparseCase::lse_elems() const { return spec.b * spec.h_q * spec.s_q; }

MlaSparseDecodeArgs HostSparseCase::args(void* q_ptr, void* cache_ptr, void* indices_ptr, void* topk_length_ptr,
                                         void* sink_ptr, void* out_ptr, DType out_dtype, void* lse_ptr) const {
  const SparseCaseSpec& s = spec;
  MlaSparseDecodeArgs a;
  a.q = make_tensor(q_ptr, DType::kBF16, {s.b, s.s_q, s.h_q, d_qk()});
  a.kv_cache = main.tensor(cache_ptr, s.v4);
  a.indices = make_tensor(indices_ptr, DType::kInt32, {s.b, s.s_q, s.topk});
  if (s.with_topk_length) a.topk_length = make_tensor(topk_length_ptr, DType::kInt32, {s.b});
  if (s.with_sink) a.attn_sink = make_tensor(sink_ptr, DType::kFP32, {s.h_q});
  a.out = make_tensor(out_ptr, out_dtype, {s.b, s.s_q, s.h_q, 512});
  a.lse = make_tensor(lse_ptr, DType::kFP32, {s.b, s.h_q, s.s_q});
  a.softmax_scale = s.softmax_scale;
  return a;
}

void HostSparseCase::with_extra(MlaSparseDecodeArgs* a, void* cache_ptr, void* indices_ptr, void* lengths_ptr) const {
  if (!has_extra()) return;
  a->extra_kv_cache = extra.tensor(cache_ptr, spec.v4);
  a->extra_indices = make_tensor(indices_ptr, DType::kInt32, {spec.b, spec.s_q, spec.extra_topk});
  if (spec.with_extra_topk_length) a->extra_topk_length = make_tensor(lengths_ptr, DType::kInt32, {spec.b});
}

HostSparseCase make_sparse_case(const SparseCaseSpec& spec) {
  HostSparseCase c;
  c.spec = spec;
  std::mt19937_64 rng(spec.seed);
  c.main = make_cache(spec, spec.num_blocks, spec.page_size, spec.topk, spec.with_topk_length, rng);
  for (int k = 0; k < spec.topk; ++k) c.main.indices[k] = -1;
  if (spec.extra_topk > 0) {
    c.extra = make_cache(spec, spec.extra_num_blocks, spec.extra_page_size, spec.extra_topk,
                         spec.with_extra_topk_length, rng);
  }
  std::normal_distribution<float> normal(0.f, 1.f);
  c.q.resize(spec.b * spec.s_q * spec.h_q * c.d_qk());
  for (auto& x : c.q) x = host::float_to_bf16(std::clamp(normal(rng), -1.f, 1.f));
  if (spec.with_sink) {
    c.sink.resize(spec.h_q);
    for (auto& x : c.sink) x = normal(rng) * 2.f;
  }
  return c;
}

void poison_unlisted_tokens(HostSparseCase& c) {
  poison_cache(c.main, c.spec, c.spec.v4);
  if (c.has_extra()) poison_cache(c.extra, c.spec, c.spec.v4);
}

SparseReferenceResult run_sparse_reference(HostSparseCase& c) {
  SparseReferenceResult r;
  r.out.assign(c.out_elems(), NAN);
  r.lse.assign(c.lse_elems(), NAN);
  MlaSparseDecodeArgs a = c.args(c.q.data(), c.main.bytes.data(), c.main.indices.data(), c.main.lengths.data(),
                                 c.sink.data(), r.out.data(), DType::kFP32, r.lse.data());
  c.with_extra(&a, c.extra.bytes.data(), c.extra.indices.data(), c.extra.lengths.data());
  throw_if_error(reference::mla_sparse_decode_fp8(a));
  return r;
}

}  // namespace mlakit::support
