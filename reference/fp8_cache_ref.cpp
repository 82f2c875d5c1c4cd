// CPU versions of the FP8 MLA cache tools: the same per-row arithmetic as the kernels
// (common/fp8_cache_row.h), one row at a time. They allocate nothing; bf16 rows are read and
// written through host::load_as / store_as, as host rows need not be 2-byte aligned.
#include <cmath>
#include <cstring>

#include "common/fp8_cache_row.h"
#include "host/fp8_cache_args.h"
#include "mlakit/fp8_cache.h"
#include "reference/host_numeric.h"

namespace mlakit::reference {
namespace {

using namespace mlakit::detail;
constexpr int64_t kRowLen = kFp8NopeDim + kFp8RopeDim;

// Row `row` of a bf16 row set, as a byte address (the rows' start may be odd).
unsigned char* bf16_row(const TensorRows& rows, int64_t row) {
  return static_cast<unsigned char*>(rows.data) + row * rows.stride * 2;
}

void quantize_row(const void* src, uint8_t* dst) {
  auto x = [src](int i) { return bf16_bits_to_float(host::load_as<uint16_t>(src, i)); };
  for (int tile = 0; tile < kFp8Tiles; ++tile) {
    float amax = 0.f;
    for (int i = 0; i < kFp8Tile; ++i) amax = std::fmax(amax, std::fabs(x(tile * kFp8Tile + i)));
    const float scale = fp8_tile_scale(amax);
    for (int i = 0; i < kFp8Tile; ++i) dst[tile * kFp8Tile + i] = fp8_quantize(x(tile * kFp8Tile + i), scale);
    std::memcpy(dst + kFp8ScaleOffset + 4 * tile, &scale, 4);
  }
  std::memcpy(dst + kFp8RopeOffset, static_cast<const unsigned char*>(src) + 2 * kFp8NopeDim, 2 * kFp8RopeDim);
}

void dequantize_row(const uint8_t* src, void* dst) {
  for (int tile = 0; tile < kFp8Tiles; ++tile) {
    float scale;
    std::memcpy(&scale, src + kFp8ScaleOffset + 4 * tile, 4);
    for (int i = 0; i < kFp8Tile; ++i) {
      host::store_as<uint16_t>(dst, tile * kFp8Tile + i, fp8_dequantize(src[tile * kFp8Tile + i], scale));
    }
  }
  std::memcpy(static_cast<unsigned char*>(dst) + 2 * kFp8NopeDim, src + kFp8RopeOffset, 2 * kFp8RopeDim);
}

}  // namespace

Status quantize_mla_cache_fp8(const TensorRef& src, const TensorRef& dst) {
  TensorRows s, d;
  MLAKIT_RETURN_IF_ERROR(validate_fp8_convert("reference::quantize_mla_cache_fp8", src, DType::kBF16, kRowLen, dst,
                                              DType::kUInt8, kFp8TokenBytes, &s, &d));
  for (int64_t r = 0; r < s.rows; ++r) {
    quantize_row(bf16_row(s, r), static_cast<uint8_t*>(d.data) + r * d.stride);
  }
  return Status::ok();
}

Status dequantize_mla_cache_fp8(const TensorRef& src, const TensorRef& dst) {
  TensorRows s, d;
  MLAKIT_RETURN_IF_ERROR(validate_fp8_convert("reference::dequantize_mla_cache_fp8", src, DType::kUInt8,
                                              kFp8TokenBytes, dst, DType::kBF16, kRowLen, &s, &d));
  for (int64_t r = 0; r < s.rows; ++r) {
    dequantize_row(static_cast<const uint8_t*>(s.data) + r * s.stride, bf16_row(d, r));
  }
  return Status::ok();
}

Status append_mla_cache_fp8(const TensorRef& tokens, const TensorRef& slots, const TensorRef& cache) {
  Fp8AppendArgs a;
  MLAKIT_RETURN_IF_ERROR(validate_fp8_append("reference::append_mla_cache_fp8", tokens, slots, cache, &a));
  for (int64_t i = 0; i < a.tokens.rows; ++i) {
    const int64_t slot = host::load_as<int32_t>(a.slots, i);
    if (slot < 0 || slot / a.page_size >= a.num_blocks) continue;  // slot >= num_blocks * page_size
    quantize_row(bf16_row(a.tokens, i),
                 a.cache + (slot / a.page_size) * a.block_stride + (slot % a.page_size) * a.page_stride);
  }
  return Status::ok();
}

}  // namespace mlakit::reference
