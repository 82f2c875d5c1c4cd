// CPU reference of the token-sparse FP8 MLA decode: every listed cache token (of the first
// cache, then of the second) is dequantized to bf16 exactly as its layout defines
// (common/fp8_cache_row.h, common/fp8_v4_cache_row.h), then float64 attention. The
// dequantized tokens of a (sequence, query token) are kept as bf16 bits, exactly their values:
// at most topk + extra_topk (<= 2^21) tokens of 1,152 bytes, allocated once at their exact count.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/fp8_cache_row.h"
#include "common/fp8_v4_cache_row.h"
#include "host/mla_decode_validate.h"
#include "host/mla_sparse_decode_validate.h"
#include "mlakit/mla_sparse_decode.h"
#include "reference/guarded.h"
#include "reference/host_numeric.h"
#include "reference/parallel.h"

namespace mlakit::reference {
namespace {

using detail::Fp8TokenLayout;
using detail::SparseDecodeShape;
constexpr int kDv = detail::kFp8NopeDim;  // both layouts

constexpr const char* kOp = "reference::mla_sparse_decode_fp8";

// The bf16 values (as bit patterns) of one 656-byte V3.2 cache token: 576 values.
void dequantized_v32_token(const uint8_t* token, uint16_t* out) {
  for (int tile = 0; tile < detail::kFp8Tiles; ++tile) {
    float scale;
    std::memcpy(&scale, token + detail::kFp8ScaleOffset + 4 * tile, 4);
    for (int i = 0; i < detail::kFp8Tile; ++i) {
      const int e = tile * detail::kFp8Tile + i;
      out[e] = detail::fp8_dequantize(token[e], scale);
    }
  }
  std::memcpy(out + detail::kFp8NopeDim, token + detail::kFp8RopeOffset, 2 * detail::kFp8RopeDim);
}

// The bf16 values of one V4 token (record and scale record): 512 values.
void dequantized_v4_token(const uint8_t* record, const uint8_t* scales, uint16_t* out) {
  for (int tile = 0; tile < detail::kV4Tiles; ++tile) {
    const float scale = detail::ue8m0_to_float(scales[tile]);
    for (int i = 0; i < detail::kV4Tile; ++i) {
      const int e = tile * detail::kV4Tile + i;
      out[e] = detail::v4_dequantize(record[e], scale);
    }
  }
  std::memcpy(out + detail::kV4NopeDim, record + detail::kV4RopeOffset, 2 * detail::kV4RopeDim);
}

// One cache and its index list, as this reference walks them.
struct ListedCache {
  const TensorRef& cache;
  const TensorRef& indices;
  const TensorRef& lengths;  // optional [b]
  int topk;
  int64_t num_blocks, page_size;

  // slot < num_blocks * page_size, without forming the product (free strides let both be large).
  bool valid(int64_t slot) const { return slot >= 0 && slot / page_size < num_blocks; }
  int64_t index(int64_t seq, int t, int64_t k) const {
    return host::load_as<int32_t>(indices.data, seq * indices.stride[0] + t * indices.stride[1] + k);
  }
  int64_t count(int64_t seq) const {
    if (lengths.empty()) return topk;
    return std::clamp<int64_t>(host::load_as<int32_t>(lengths.data, seq * lengths.stride[0]), 0, topk);
  }
  void dequantize(int64_t slot, Fp8TokenLayout layout, uint16_t* out) const {
    const auto* block = static_cast<const uint8_t*>(cache.data) + (slot / page_size) * cache.stride[0];
    const int64_t offset = slot % page_size;
    if (layout == Fp8TokenLayout::kV4) {
      dequantized_v4_token(block + detail::v4_record_offset(offset), block + detail::v4_scale_offset(page_size, offset),
                           out);
    } else {
      dequantized_v32_token(block + offset * cache.stride[1], out);
    }
  }
};

void decode_row_group(const MlaSparseDecodeArgs& a, const SparseDecodeShape& s, double scale, int64_t seq, int t) {
  const int d_qk = s.d_qk;
  std::vector<ListedCache> caches{{a.kv_cache, a.indices, a.topk_length, s.topk, s.num_blocks, s.page_size}};
  if (s.extra.topk > 0) {
    caches.push_back({a.extra_kv_cache, a.extra_indices, a.extra_topk_length, s.extra.topk, s.extra.num_blocks,
                      s.extra.page_size});
  }
  // The valid tokens of this (sequence, query token), of both caches, shared by all heads;
  // duplicates kept.
  int64_t n = 0;
  for (const ListedCache& c : caches) {
    for (int64_t k = 0, count = c.count(seq); k < count; ++k) n += c.valid(c.index(seq, t, k)) ? 1 : 0;
  }
  std::vector<uint16_t> keys(static_cast<std::size_t>(n * d_qk));
  int64_t filled = 0;
  for (const ListedCache& c : caches) {
    for (int64_t k = 0, count = c.count(seq); k < count; ++k) {
      const int64_t slot = c.index(seq, t, k);
      if (c.valid(slot)) c.dequantize(slot, s.layout, keys.data() + filled++ * d_qk);
    }
  }
  auto key = [&](int64_t j, int d) -> double { return host::bf16_to_float(keys[j * d_qk + d]); };
  for (int h = 0; h < s.h_q; ++h) {
    std::vector<double> out(kDv, 0.0);
    double lse = INFINITY;
    if (n > 0) {
      const int64_t q_base = seq * a.q.stride[0] + t * a.q.stride[1] + h * a.q.stride[2];
      std::vector<double> logits(n);
      for (int64_t j = 0; j < n; ++j) {
        double dot = 0;
        for (int d = 0; d < d_qk; ++d) dot += double(host::load_half(a.q.data, q_base + d, DType::kBF16)) * key(j, d);
        logits[j] = dot * scale;
      }
      const double m = *std::max_element(logits.begin(), logits.end());
      double sum = 0;
      for (int64_t j = 0; j < n; ++j) {
        const double w = std::exp(logits[j] - m);
        sum += w;
        for (int d = 0; d < kDv; ++d) out[d] += w * key(j, d);
      }
      lse = m + std::log(sum);
      double factor = 1.0 / sum;
      if (!a.attn_sink.empty()) {
        const double sink = host::load_as<float>(a.attn_sink.data, h * a.attn_sink.stride[0]);
        factor /= 1.0 + std::exp(sink - lse);
      }
      for (double& v : out) v *= factor;
    }
    const int64_t out_base = seq * a.out.stride[0] + t * a.out.stride[1] + h * a.out.stride[2];
    for (int d = 0; d < kDv; ++d) {
      host::store_result(a.out.data, out_base + d, a.out.dtype, static_cast<float>(out[d]));
    }
    host::store_as<float>(a.lse.data, seq * a.lse.stride[0] + h * a.lse.stride[1] + t * a.lse.stride[2],
                          static_cast<float>(lse));
  }
}

}  // namespace

Status mla_sparse_decode_fp8(const MlaSparseDecodeArgs& args, int num_threads) {
  SparseDecodeShape s;
  MLAKIT_RETURN_IF_ERROR(detail::validate_mla_sparse_decode_args(kOp, args, /*allow_float_out=*/true, &s));
  if (detail::is_empty_problem(s)) return Status::ok();  // nothing to write
  const double scale = detail::resolve_softmax_scale(args.softmax_scale, s.d_qk);
  return run_guarded(kOp, [&] {
    parallel_for(s.b, num_threads, [&](int64_t seq) {
      for (int t = 0; t < s.s_q; ++t) decode_row_group(args, s, scale, seq, t);
    });
  });
}

}  // namespace mlakit::reference
