#include "host/gqa_decode_validate.h"

#include <cmath>
#include <string>

#include "host/check.h"
#include "host/output_check.h"

namespace mlakit::detail {
namespace {

constexpr int kMaxSq = 8;  // the kernels keep one step's s_q * (h_q / h_kv) rows resident

// The argument names of one cache, for the messages.
struct CacheNames {
  const char* values;
  const char* scale;
};
constexpr CacheNames kKeys{"k_cache.values", "k_cache.scale"};
constexpr CacheNames kValues{"v_cache.values", "v_cache.scale"};

std::string rank_text(const TensorRef& t) {
  return t.empty() ? std::string("none") : "a tensor of shape " + shape_string(t);
}

// A rank-4 tensor [d0, d1, d2, d3] with the given dimension names and sizes, in `dtype`.
Status check_4d(const char* op, const char* name, const TensorRef& t, DType dtype, const char* dtype_of,
                const char* const (&dims)[4], const int64_t (&sizes)[4]) {
  MLAKIT_RETURN_IF_ERROR(check_tensor_wellformed(op, name, t));
  MLAKIT_RETURN_IF_ERROR(check_same_dtype(op, name, t, dtype_of, dtype));
  MLAKIT_RETURN_IF_ERROR(check_rank(op, name, t, 4));
  for (int axis = 0; axis < 4; ++axis) MLAKIT_RETURN_IF_ERROR(check_dim(op, name, t, axis, dims[axis], sizes[axis]));
  return check_last_dim_contiguous(op, name, t);
}

// The scale tensor of one cache against the cache's dtype; `layout` is k's layout when
// checking v's (both caches must store their scales alike), else filled.
Status check_scale(const char* op, const CacheNames& n, const TensorRef& scale, const GqaDecodeShape& p,
                   DType q_dtype, GqaScaleLayout* layout, bool is_v) {
  if (p.cache_dtype == q_dtype) {
    if (!scale.empty()) {
      return invalid(op, std::string(n.scale) + ": expected none (the cache holds q's dtype " + dtype_name(q_dtype) +
                             ", nothing to dequantize), got " + rank_text(scale));
    }
    *layout = GqaScaleLayout::kNone;
    return Status::ok();
  }
  if (scale.empty()) {
    return invalid(op, std::string(n.scale) + ": expected a float32 tensor (a " + dtype_name(p.cache_dtype) +
                           " cache needs dequantization scales), got none");
  }
  MLAKIT_RETURN_IF_ERROR(check_tensor_wellformed(op, n.scale, scale));
  MLAKIT_RETURN_IF_ERROR(check_dtype(op, n.scale, scale, {DType::kFP32}));
  const bool fp8 = p.cache_dtype == DType::kFP8E4M3;
  if (is_v) {
    const int rank = *layout == GqaScaleLayout::kPerTensor ? 1 : 3;
    if (scale.rank != rank) {
      return invalid(op, std::string(n.scale) + ": expected rank " + std::to_string(rank) +
                             " (the layout of k_cache.scale), got rank " + std::to_string(scale.rank));
    }
  } else if (scale.rank != 3 && !(fp8 && scale.rank == 1)) {
    return invalid(op, std::string(n.scale) + ": expected rank 3 ([num_blocks, page_size, h_kv]" +
                           (fp8 ? ") or rank 1 ([1], one scale per tensor)" : "; int8 has per-token scales only)") +
                           ", got rank " + std::to_string(scale.rank) + " (shape " + shape_string(scale) + ")");
  }
  if (scale.rank == 1) {
    *layout = GqaScaleLayout::kPerTensor;
    return check_dim(op, n.scale, scale, 0, "one per tensor", 1);
  }
  *layout = GqaScaleLayout::kPerToken;
  MLAKIT_RETURN_IF_ERROR(check_dim(op, n.scale, scale, 0, "num_blocks", p.num_blocks));
  MLAKIT_RETURN_IF_ERROR(check_dim(op, n.scale, scale, 1, "page_size", p.page_size));
  MLAKIT_RETURN_IF_ERROR(check_dim(op, n.scale, scale, 2, "h_kv", p.h_kv));
  return check_last_dim_contiguous(op, n.scale, scale);
}

// Both caches: k fixes dtype and shape, v must match; then their scales.
Status check_caches(const char* op, const GqaDecodeArgs& a, GqaDecodeShape* p) {
  const TensorRef& k = a.k_cache.values;
  MLAKIT_RETURN_IF_ERROR(check_tensor_wellformed(op, kKeys.values, k));
  MLAKIT_RETURN_IF_ERROR(check_dtype(op, kKeys.values, k, {a.q.dtype, DType::kInt8, DType::kFP8E4M3}));
  MLAKIT_RETURN_IF_ERROR(check_rank(op, kKeys.values, k, 4));
  MLAKIT_RETURN_IF_ERROR(check_dim(op, kKeys.values, k, 3, "d", p->d));
  MLAKIT_RETURN_IF_ERROR(check_last_dim_contiguous(op, kKeys.values, k));
  MLAKIT_RETURN_IF_ERROR(check_paged_cache_dims(op, kKeys.values, k));
  MLAKIT_RETURN_IF_ERROR(int_dim(op, kKeys.values, k, 2, "h_kv", &p->h_kv));
  p->num_blocks = k.shape[0];
  p->page_size = k.shape[1];
  p->cache_dtype = k.dtype;
  MLAKIT_RETURN_IF_ERROR(check_4d(op, kValues.values, a.v_cache.values, k.dtype, kKeys.values,
                                  {"num_blocks", "page_size", "h_kv", "d"}, {k.shape[0], k.shape[1], k.shape[2], p->d}));
  MLAKIT_RETURN_IF_ERROR(check_scale(op, kKeys, a.k_cache.scale, *p, a.q.dtype, &p->scale_layout, false));
  return check_scale(op, kValues, a.v_cache.scale, *p, a.q.dtype, &p->scale_layout, true);
}

Status check_heads(const char* op, const GqaDecodeShape& p) {
  if (p.b > (int64_t{1} << 30)) return invalid(op, "q.shape[0] (b): expected <= 2^30, got " + std::to_string(p.b));
  if (p.s_q > kMaxSq) {
    return unsupported(op, "q.shape[1] (s_q): expected <= " + std::to_string(kMaxSq) +
                               " (1..8 query tokens per step; 0 is an empty problem), got " + std::to_string(p.s_q));
  }
  if (p.h_kv < 1) return invalid(op, "k_cache.values.shape[2] (h_kv): expected >= 1, got " + std::to_string(p.h_kv));
  if (p.h_q % p.h_kv != 0) {
    return invalid(op, "h_q % h_kv: expected 0 (h_q a multiple of h_kv), got h_q = " + std::to_string(p.h_q) +
                           ", h_kv = " + std::to_string(p.h_kv));
  }
  return Status::ok();
}

Status check_options(const char* op, const GqaDecodeArgs& a) {
  MLAKIT_RETURN_IF_ERROR(check_logit_scale(op, "softmax_scale", a.softmax_scale));
  if (a.window < 0) {
    return invalid(op, "window: expected >= 0 (0: no window), got " + std::to_string(a.window));
  }
  if (!std::isfinite(a.softcap) || a.softcap < 0) {
    return invalid(op, "softcap: expected a finite value >= 0 (0: none), got " + std::to_string(a.softcap));
  }
  return Status::ok();
}

}  // namespace

Status check_rope(const char* op, const RotaryEmbedding& rope, int d, int* rotary_dim) {
  const auto style = static_cast<int32_t>(rope.style);
  if (style < 0 || style > 2) {
    return invalid(op, "rope.style: expected kNone (0), kNeox (1) or kGptj (2), got " + std::to_string(style));
  }
  if (!std::isfinite(rope.theta) || !(rope.theta > 0)) {
    return invalid(op, "rope.theta: expected a finite value > 0, got " + std::to_string(rope.theta));
  }
  if (rope.rotary_dim != 0 && (rope.rotary_dim < 2 || rope.rotary_dim > d || rope.rotary_dim % 2 != 0)) {
    return invalid(op, "rope.rotary_dim: expected 0 (the head dim) or an even value in [2, d = " + std::to_string(d) +
                           "], got " + std::to_string(rope.rotary_dim));
  }
  *rotary_dim = rope.style == RopeStyle::kNone ? 0 : (rope.rotary_dim == 0 ? d : rope.rotary_dim);
  return Status::ok();
}

Status validate_gqa_decode_args(const char* op, const GqaDecodeArgs& a, GqaDecodeShape* problem,
                                bool allow_float_out) {
  MLAKIT_RETURN_IF_ERROR(check_tensor_wellformed(op, "q", a.q));
  MLAKIT_RETURN_IF_ERROR(check_dtype(op, "q", a.q, {DType::kBF16, DType::kFP16}));
  MLAKIT_RETURN_IF_ERROR(check_rank(op, "q", a.q, 4));
  MLAKIT_RETURN_IF_ERROR(check_last_dim_contiguous(op, "q", a.q));
  GqaDecodeShape p;
  p.b = a.q.shape[0];
  MLAKIT_RETURN_IF_ERROR(int_dim(op, "q", a.q, 1, "s_q", &p.s_q));
  MLAKIT_RETURN_IF_ERROR(int_dim(op, "q", a.q, 2, "h_q", &p.h_q));
  MLAKIT_RETURN_IF_ERROR(int_dim(op, "q", a.q, 3, "d", &p.d));
  if (p.d != 64 && p.d != 128 && p.d != 256) {  // before the caches, whose d is compared to it
    return unsupported(op, "q.shape[3] (d): expected 64, 128 or 256, got " + std::to_string(p.d));
  }
  MLAKIT_RETURN_IF_ERROR(check_caches(op, a, &p));
  MLAKIT_RETURN_IF_ERROR(check_heads(op, p));

  MLAKIT_RETURN_IF_ERROR(check_block_table(op, a.block_table, p.b));
  MLAKIT_RETURN_IF_ERROR(int_dim(op, "block_table", a.block_table, 1, "max_blocks_per_seq", &p.max_blocks_per_seq));
  MLAKIT_RETURN_IF_ERROR(check_vector(op, "cache_seqlens", a.cache_seqlens, DType::kInt32, "b", p.b));

  if (a.k_new.empty() != a.v_new.empty()) {
    const bool k_given = !a.k_new.empty();
    return invalid(op, std::string(k_given ? "v_new" : "k_new") + ": expected a tensor (" +
                           (k_given ? "k_new" : "v_new") + " is given; both or neither), got none");
  }
  p.append = !a.k_new.empty();
  if (p.append) {
    const int64_t sizes[4] = {p.b, p.s_q, p.h_kv, p.d};
    MLAKIT_RETURN_IF_ERROR(check_4d(op, "k_new", a.k_new, a.q.dtype, "q", {"b", "s_q", "h_kv", "d"}, sizes));
    MLAKIT_RETURN_IF_ERROR(check_4d(op, "v_new", a.v_new, a.q.dtype, "q", {"b", "s_q", "h_kv", "d"}, sizes));
  }
  MLAKIT_RETURN_IF_ERROR(check_rope(op, a.rope, p.d, &p.rotary_dim));
  MLAKIT_RETURN_IF_ERROR(check_optional_vector(op, "alibi_slopes", a.alibi_slopes, DType::kFP32, "h_q", p.h_q));
  MLAKIT_RETURN_IF_ERROR(check_optional_vector(op, "finished", a.finished, DType::kUInt8, "b", p.b));

  MLAKIT_RETURN_IF_ERROR(check_tensor_wellformed(op, "out", a.out));
  MLAKIT_RETURN_IF_ERROR(check_output_dtype(op, "out", a.out, a.q.dtype, allow_float_out));
  MLAKIT_RETURN_IF_ERROR(check_rank(op, "out", a.out, 4));
  MLAKIT_RETURN_IF_ERROR(check_dim(op, "out", a.out, 0, "b", p.b));
  MLAKIT_RETURN_IF_ERROR(check_dim(op, "out", a.out, 1, "s_q", p.s_q));
  MLAKIT_RETURN_IF_ERROR(check_dim(op, "out", a.out, 2, "h_q", p.h_q));
  MLAKIT_RETURN_IF_ERROR(check_dim(op, "out", a.out, 3, "d", p.d));
  MLAKIT_RETURN_IF_ERROR(check_last_dim_contiguous(op, "out", a.out));
  if (!a.lse.empty()) {
    MLAKIT_RETURN_IF_ERROR(check_tensor_wellformed(op, "lse", a.lse));
    MLAKIT_RETURN_IF_ERROR(check_dtype(op, "lse", a.lse, {DType::kFP32}));
    MLAKIT_RETURN_IF_ERROR(check_rank(op, "lse", a.lse, 3));
    MLAKIT_RETURN_IF_ERROR(check_dim(op, "lse", a.lse, 0, "b", p.b));
    MLAKIT_RETURN_IF_ERROR(check_dim(op, "lse", a.lse, 1, "h_q", p.h_q));
    MLAKIT_RETURN_IF_ERROR(check_dim(op, "lse", a.lse, 2, "s_q", p.s_q));
    MLAKIT_RETURN_IF_ERROR(check_last_dim_contiguous(op, "lse", a.lse));
  }
  MLAKIT_RETURN_IF_ERROR(check_options(op, a));

  // The append writes the caches and their per-token scales; a per-tensor scale is only read.
  // Each tensor goes to one list and an empty view to the other.
  const TensorRef none;
  const bool w = p.append, ws = p.append && p.scale_layout == GqaScaleLayout::kPerToken;
  auto in = [&none](const TensorRef& t, bool written) -> const TensorRef& { return written ? none : t; };
  auto out = [&none](const TensorRef& t, bool written) -> const TensorRef& { return written ? t : none; };
  MLAKIT_RETURN_IF_ERROR(check_outputs(
      op,
      {{"out", a.out}, {"lse", a.lse}, {kKeys.values, out(a.k_cache.values, w)},
       {kValues.values, out(a.v_cache.values, w)}, {kKeys.scale, out(a.k_cache.scale, ws)},
       {kValues.scale, out(a.v_cache.scale, ws)}},
      {{"q", a.q}, {"block_table", a.block_table}, {"cache_seqlens", a.cache_seqlens}, {"k_new", a.k_new},
       {"v_new", a.v_new}, {"alibi_slopes", a.alibi_slopes}, {"finished", a.finished},
       {kKeys.values, in(a.k_cache.values, w)}, {kValues.values, in(a.v_cache.values, w)},
       {kKeys.scale, in(a.k_cache.scale, ws)}, {kValues.scale, in(a.v_cache.scale, ws)}}));
  *problem = p;
  return Status::ok();
}

}  // namespace mlakit::detail
