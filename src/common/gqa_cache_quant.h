// Quantization of one GQA cache row (one token of one kv head, include/mlakit/gqa_decode.h,
// GqaPagedCache) to int8 or float8 e4m3: the per-element arithmetic the CPU reference and the
// GPU append share, so both store identical bytes and scales. Compiled for host and device.
//
//   int8, per (token, head):  scale = max|x| / 127, stored = clamp(rne(x / scale), -127, 127)
//   fp8,  per (token, head):  scale = max|x| / 448, stored = e4m3(x / scale) (saturating)
//   fp8,  per tensor:         the given scale,      stored = e4m3(x / scale)
// x / scale is one float division, rounded as the GPU's. A zero scale (an all-zero row) stores
// zeros, never NaN. Dequantized value = stored * scale.
#pragma once

#include <math.h>

#include <cstdint>

#include "common/fp8_cache_row.h"
#include "common/host_device.h"

namespace mlakit::detail {

inline constexpr float kInt8QuantMax = 127.0f;  // symmetric: -128 is never stored

MLAKIT_HD float int8_row_scale(float amax) { return amax / kInt8QuantMax; }

// rintf rounds to nearest even (the default rounding mode on the host, cvt.rni on the GPU).
// NaN stores 0 (a NaN -> int conversion is undefined in C++).
MLAKIT_HD int8_t int8_quantize(float x, float scale) {
  if (scale == 0.0f) return 0;
  const float q = rintf(x / scale);
  if (q != q) return 0;
  return static_cast<int8_t>(fminf(fmaxf(q, -kInt8QuantMax), kInt8QuantMax));
}

// The MLA FP8 cache's tile rule (common/fp8_cache_row.h) applied to one row: the same
// max / 448 scale and zero-scale convention.
MLAKIT_HD float fp8_row_scale(float amax) { return fp8_tile_scale(amax); }

}  // namespace mlakit::detail
