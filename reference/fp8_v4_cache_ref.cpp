// CPU versions of the DeepSeek V4 FP8 cache tools: the kernels' per-value arithmetic
// (common/fp8_v4_cache_row.h), one token at a time. They allocate nothing; bf16 values are
// read and written through host::load_as / store_as, as the host layer does everywhere.
#include <cmath>
#include <cstring>

#include "common/fp8_cache_row.h"
#include "common/fp8_v4_cache_row.h"
#include "common/fp8_v4_cache_tools.h"
#include "host/fp8_v4_cache_args.h"
#include "mlakit/fp8_cache.h"
#include "reference/host_numeric.h"

namespace mlakit::reference {
namespace {

using namespace mlakit::detail;

void quantize_token(const void* src, V4CacheToken dst) {
  auto x = [src](int i) { return bf16_bits_to_float(host::load_as<uint16_t>(src, i)); };
  for (int tile = 0; tile < kV4Tiles; ++tile) {
    float amax = 0.f;
    for (int i = 0; i < kV4Tile; ++i) amax = std::fmax(amax, std::fabs(x(tile * kV4Tile + i)));
    const uint8_t byte = v4_scale_byte(amax);
    const float scale = ue8m0_to_float(byte);
    for (int i = 0; i < kV4Tile; ++i) dst.record[tile * kV4Tile + i] = v4_quantize(x(tile * kV4Tile + i), scale);
    dst.scales[tile] = byte;
  }
  std::memset(dst.scales + kV4Tiles, 0, kV4ScaleRecordBytes - kV4Tiles);
  std::memcpy(dst.record + kV4RopeOffset, static_cast<const unsigned char*>(src) + 2 * kV4NopeDim, 2 * kV4RopeDim);
}

void dequantize_token(V4CacheToken src, void* dst) {
  for (int i = 0; i < kV4NopeDim; ++i) {
    host::store_as<uint16_t>(dst, i, v4_dequantize(src.record[i], ue8m0_to_float(src.scales[i / kV4Tile])));
  }
  std::memcpy(static_cast<unsigned char*>(dst) + 2 * kV4NopeDim, src.record + kV4RopeOffset, 2 * kV4RopeDim);
}

// quantize_mla_cache_fp8_v4 and dequantize_mla_cache_fp8_v4: one walk over the tokens.
Status convert(const char* op, V4Convert direction, const TensorRef& src, const TensorRef& dst) {
  V4ConvertArgs a;
  MLAKIT_RETURN_IF_ERROR(validate_v4_convert(op, direction, src, dst, &a));
  for (int64_t block = 0; block < a.cache.num_blocks; ++block) {
    for (int64_t offset = 0; offset < a.cache.page_size; ++offset) {
      if (direction == V4Convert::kQuantize) {
        quantize_token(v4_token_row(a.rows, block, offset), v4_cache_token(a.cache, block, offset));
      } else {
        dequantize_token(v4_cache_token(a.cache, block, offset), v4_token_row(a.rows, block, offset));
      }
    }
  }
  return Status::ok();
}

}  // namespace

Status quantize_mla_cache_fp8_v4(const TensorRef& src, const TensorRef& dst) {
  return convert("reference::quantize_mla_cache_fp8_v4", V4Convert::kQuantize, src, dst);
}

Status dequantize_mla_cache_fp8_v4(const TensorRef& src, const TensorRef& dst) {
  return convert("reference::dequantize_mla_cache_fp8_v4", V4Convert::kDequantize, src, dst);
}

Status append_mla_cache_fp8_v4(const TensorRef& tokens, const TensorRef& slots, const TensorRef& cache) {
  V4AppendArgs a;
  MLAKIT_RETURN_IF_ERROR(validate_v4_append("reference::append_mla_cache_fp8_v4", tokens, slots, cache, &a));
  for (int64_t i = 0; i < a.tokens.rows; ++i) {
    const int64_t slot = host::load_as<int32_t>(a.slots, i);
    if (slot < 0 || slot / a.cache.page_size >= a.cache.num_blocks) continue;  // slot >= num_blocks * page_size
    quantize_token(static_cast<const unsigned char*>(a.tokens.data) + i * a.tokens.stride * 2,
                   v4_cache_token(a.cache, slot / a.cache.page_size, slot % a.cache.page_size));
  }
  return Status::ok();
}

}  // namespace mlakit::reference
