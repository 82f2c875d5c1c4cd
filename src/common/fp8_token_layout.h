// The byte layouts of the sparse decode's FP8 cache tokens. In common/ because the host
// validation finds it and the kernels read it (docs/design.md, Layers).
#pragma once

namespace mlakit::detail {

enum class Fp8TokenLayout : int {
  // DeepSeek V3.2 (common/fp8_cache_row.h): 656 bytes per token, d_qk 576: 512 e4m3 + 4 float32
  // scales + 64 bf16 RoPE; V = the 512 NoPE values.
  kV32 = 0,
  // DeepSeek V4 (common/fp8_v4_cache_row.h): per block, 576-byte records (448 e4m3 + 64 bf16
  // RoPE) then 8-byte UE8M0 scale records; d_qk 512, V = the whole row.
  kV4 = 1,
};

}  // namespace mlakit::detail
