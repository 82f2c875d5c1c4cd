#include "support/sparse_decode_case.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <stdexcept>

#include "mlakit/fp8_cache.h"
#include "reference/host_numeric.h"

namespace mlakit::support {

MlaSparseDecodeProblem HostSparseCase::problem() const {
  return MlaSparseDecodeProblem{.b = spec.b, .s_q = spec.s_q, .h_q = spec.h_q, .topk = spec.topk};
}
int64_t HostSparseCase::out_elems() const { return spec.b * spec.s_q * spec.h_q * 512; }
int64_t HostSparseCase::lse_elems() const { return spec.b * spec.h_q * spec.s_q; }

MlaSparseDecodeArgs HostSparseCase::args(void* q_ptr, void* cache_ptr, void* indices_ptr, void* topk_length_ptr,
                                         void* sink_ptr, void* out_ptr, DType out_dtype, void* lse_ptr) const {
  const SparseCaseSpec& s = spec;
  MlaSparseDecodeArgs a;
  a.q = make_tensor(q_ptr, DType::kBF16, {s.b, s.s_q, s.h_q, 576});
  a.kv_cache = make_tensor(cache_ptr, DType::kUInt8, {s.num_blocks, s.page_size, 1, 656});
  a.indices = make_tensor(indices_ptr, DType::kInt32, {s.b, s.s_q, s.topk});
  if (s.with_topk_length) a.topk_length = make_tensor(topk_length_ptr, DType::kInt32, {s.b});
  if (s.with_sink) a.attn_sink = make_tensor(sink_ptr, DType::kFP32, {s.h_q});
  a.out = make_tensor(out_ptr, out_dtype, {s.b, s.s_q, s.h_q, 512});
  a.lse = make_tensor(lse_ptr, DType::kFP32, {s.b, s.h_q, s.s_q});
  a.softmax_scale = s.softmax_scale;
  return a;
}

HostSparseCase make_sparse_case(const SparseCaseSpec& spec) {
  HostSparseCase c;
  c.spec = spec;
  std::mt19937_64 rng(spec.seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  const int64_t tokens = spec.num_blocks * spec.page_size;
  std::vector<uint16_t> raw(tokens * 576);
  for (auto& x : raw) x = host::float_to_bf16(std::clamp(normal(rng) * 0.1f, -1.f, 1.f));
  c.cache.resize(tokens * 656);
  c.dequantized.resize(tokens * 576);
  Status s = reference::quantize_mla_cache_fp8(make_tensor(raw.data(), DType::kBF16, {tokens, 576}),
                                               make_tensor(c.cache.data(), DType::kUInt8, {tokens, 656}));
  if (s) s = reference::dequantize_mla_cache_fp8(make_tensor(c.cache.data(), DType::kUInt8, {tokens, 656}),
                                                  make_tensor(c.dequantized.data(), DType::kBF16, {tokens, 576}));
  if (!s) throw std::runtime_error(s.to_string());
  c.q.resize(spec.b * spec.s_q * spec.h_q * 576);
  for (auto& x : c.q) x = host::float_to_bf16(std::clamp(normal(rng), -1.f, 1.f));
  std::uniform_int_distribution<int64_t> slot(0, tokens - 1);
  c.indices.resize(spec.b * spec.s_q * spec.topk);
  for (size_t i = 0; i < c.indices.size(); ++i) {
    const int kind = static_cast<int>(i % 11);
    // Invalid slots at both ends of int32 too: the kernels test validity with one unsigned
    // compare (kernels/mla_decode_params.h, slot_limit).
    c.indices[i] = kind == 3 ? -1
                 : kind == 7 ? (i % 3 == 0 ? std::numeric_limits<int32_t>::max() : static_cast<int32_t>(tokens + i % 5))
                 : kind == 9 ? (i % 2 == 0 ? std::numeric_limits<int32_t>::min() : -7)
                 : kind == 5 && i > 0 ? c.indices[i - 1]  // a duplicate of the previous entry
                                      : static_cast<int32_t>(slot(rng));
  }
  for (int k = 0; k < spec.topk; ++k) c.indices[k] = -1;
  if (spec.with_topk_length) {
    std::uniform_int_distribution<int32_t> len(0, spec.topk + 3);  // past topk: clamped
    c.topk_length.resize(spec.b);
    for (auto& l : c.topk_length) l = len(rng);
  }
  if (spec.with_sink) {
    c.sink.resize(spec.h_q);
    for (auto& x : c.sink) x = normal(rng) * 2.f;
  }
  return c;
}

void poison_unlisted_tokens(HostSparseCase& c) {
  const SparseCaseSpec& s = c.spec;
  const int64_t tokens = s.num_blocks * s.page_size;
  std::vector<bool> listed(tokens, false);
  for (int64_t i = 0; i < s.b; ++i) {
    const int64_t counted = s.with_topk_length ? std::clamp<int64_t>(c.topk_length[i], 0, s.topk) : s.topk;
    for (int t = 0; t < s.s_q; ++t) {
      const int32_t* row = c.indices.data() + (i * s.s_q + t) * s.topk;
      for (int64_t k = 0; k < counted; ++k) {
        if (row[k] >= 0 && row[k] < tokens) listed[row[k]] = true;
      }
    }
  }
  for (int64_t slot = 0; slot < tokens; ++slot) {
    if (listed[slot]) continue;
    std::fill_n(c.cache.begin() + slot * 656, 656, uint8_t{0xFF});
    std::fill_n(c.dequantized.begin() + slot * 576, 576, uint16_t{0x7fc0});
  }
}

SparseReferenceResult run_sparse_reference(HostSparseCase& c) {
  SparseReferenceResult r;
  r.out.assign(c.out_elems(), NAN);
  r.lse.assign(c.lse_elems(), NAN);
  const MlaSparseDecodeArgs a = c.args(c.q.data(), c.cache.data(), c.indices.data(), c.topk_length.data(),
                                       c.sink.data(), r.out.data(), DType::kFP32, r.lse.data());
  const Status s = reference::mla_sparse_decode_fp8(a);
  if (!s) throw std::runtime_error(s.to_string());
  return r;
}

}  // namespace mlakit::support
