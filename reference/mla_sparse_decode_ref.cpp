// CPU reference of the token-sparse FP8 MLA decode: every listed cache token is dequantized
// to bf16 exactly as the format defines (common/fp8_cache_row.h), then float64 attention.
// The dequantized tokens of a (sequence, query token) are kept as bf16 bits, exactly their
// values: at most topk (<= 2^20) tokens of 1,152 bytes, allocated once at their exact count.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/fp8_cache_row.h"
#include "host/mla_decode_validate.h"
#include "host/mla_sparse_decode_validate.h"
#include "mlakit/mla_sparse_decode.h"
#include "reference/guarded.h"
#include "reference/host_numeric.h"
#include "reference/parallel.h"

namespace mlakit::reference {
namespace {

using detail::SparseDecodeShape;
constexpr int kDqk = detail::kFp8NopeDim + detail::kFp8RopeDim;
constexpr int kDv = detail::kFp8NopeDim;

constexpr const char* kOp = "reference::mla_sparse_decode_fp8";

// The bf16 values (as bit patterns) of one 656-byte cache token.
void dequantized_token(const uint8_t* token, uint16_t* out) {
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

// slot < num_blocks * page_size, without forming the product (free strides let both be large).
bool valid_slot(const SparseDecodeShape& s, int64_t slot) { return slot >= 0 && slot / s.page_size < s.num_blocks; }

void decode_row_group(const MlaSparseDecodeArgs& a, const SparseDecodeShape& s, double scale, int64_t seq, int t) {
  const int64_t indices_base = seq * a.indices.stride[0] + t * a.indices.stride[1];
  auto index = [&](int64_t k) -> int64_t { return host::load_as<int32_t>(a.indices.data, indices_base + k); };
  int64_t count = s.topk;
  if (!a.topk_length.empty()) {
    count = std::clamp<int64_t>(host::load_as<int32_t>(a.topk_length.data, seq * a.topk_length.stride[0]), 0, s.topk);
  }
  // The valid tokens of this (sequence, query token), shared by all heads; duplicates kept.
  int64_t n = 0;
  for (int64_t k = 0; k < count; ++k) n += valid_slot(s, index(k)) ? 1 : 0;
  std::vector<uint16_t> keys(static_cast<std::size_t>(n * kDqk));
  const auto* cache = static_cast<const uint8_t*>(a.kv_cache.data);
  for (int64_t k = 0, j = 0; k < count; ++k) {
    const int64_t slot = index(k);
    if (!valid_slot(s, slot)) continue;
    dequantized_token(cache + (slot / s.page_size) * a.kv_cache.stride[0] + (slot % s.page_size) * a.kv_cache.stride[1],
                      keys.data() + j++ * kDqk);
  }
  auto key = [&](int64_t j, int d) -> double { return host::bf16_to_float(keys[j * kDqk + d]); };
  for (int h = 0; h < s.h_q; ++h) {
    std::vector<double> out(kDv, 0.0);
    double lse = INFINITY;
    if (n > 0) {
      const int64_t q_base = seq * a.q.stride[0] + t * a.q.stride[1] + h * a.q.stride[2];
      std::vector<double> logits(n);
      for (int64_t j = 0; j < n; ++j) {
        double dot = 0;
        for (int d = 0; d < kDqk; ++d) dot += double(host::load_half(a.q.data, q_base + d, DType::kBF16)) * key(j, d);
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
  const double scale = detail::resolve_softmax_scale(args.softmax_scale, kDqk);
  return run_guarded(kOp, [&] {
    parallel_for(s.b, num_threads, [&](int64_t seq) {
      for (int t = 0; t < s.s_q; ++t) decode_row_group(args, s, scale, seq, t);
    });
  });
}

}  // namespace mlakit::reference
