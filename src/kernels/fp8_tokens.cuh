// Where the sparse decode's listed FP8 tokens are: key position -> (first or second cache,
// index) -> slot -> the token's record and scale bytes, for either token layout
// (kernels/mla_params.h, Fp8TokenLayout). Shared by the portable and the Hopper kernels.
#pragma once

#include <cstdint>

#include "common/fp8_cache_row.h"
#include "common/fp8_v4_cache_row.h"
#include "kernels/attention_rows.cuh"
#include "kernels/mla_params.h"

namespace mlakit::detail {

// A token's bytes: its record (V3.2: the whole 656-byte token; V4: the 576-byte record of e4m3
// NoPE and bf16 RoPE) and its scales (V3.2: 4 float32 at record + 512; V4: 7 UE8M0 bytes in the
// block's scale records). record null: no token (an invalid slot), never dereferenced.
struct Fp8TokenRef {
  const uint8_t* record;
  const uint8_t* scales;
};

// The token at `slot` of one cache (one unsigned compare rejects negatives and slots past
// num_blocks * page_size; the page by multiply-shift division: attention_rows.cuh, slot_offset).
__device__ __forceinline__ Fp8TokenRef fp8_token_at(const ListedKeys& k, Fp8TokenLayout layout, int32_t slot) {
  const uint32_t unsigned_slot = static_cast<uint32_t>(slot);
  if (unsigned_slot >= k.slot_limit) return Fp8TokenRef{nullptr, nullptr};
  const uint32_t page = k.page_divisor.quotient(unsigned_slot);
  const uint32_t offset = unsigned_slot - page * k.page_divisor.divisor;
  const uint8_t* block = static_cast<const uint8_t*>(k.kv) + static_cast<int64_t>(page) * k.kv_stride_block;
  const uint8_t* record = block + static_cast<int64_t>(offset) * k.kv_stride_page;
  if (layout == Fp8TokenLayout::kV4) {
    return Fp8TokenRef{record, block + v4_scale_offset(k.page_divisor.divisor, offset)};
  }
  return Fp8TokenRef{record, record + kFp8ScaleOffset};
}

// The cache and index of key `pos` of scheduled sequence seq: positions below `first` (the
// sequence's first-cache length, SeqLengths::first) list first-cache slots, the rest the
// second cache's from index 0.
__device__ __forceinline__ Fp8TokenRef listed_fp8_token(const SparseDecodeParams& p, int seq, int first, int pos) {
  if (pos < first) return fp8_token_at(p.keys, p.layout, listed_slot(p.core, p.keys, seq, pos));
  return fp8_token_at(p.extra_keys, p.layout, listed_slot(p.core, p.extra_keys, seq, pos - first));
}

}  // namespace mlakit::detail
