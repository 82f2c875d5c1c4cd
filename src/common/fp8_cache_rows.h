// Validated arguments of the FP8 MLA cache tools as plain data: made by host validation
// (host/fp8_cache_args.h), read by the dispatch (dispatch/fp8_cache_dispatch.h) and the CPU
// reference. In common/ because the host and the dispatch layer both use them
// (docs/design.md, Layers).
#pragma once

#include <cstdint>

namespace mlakit::detail {

// A tensor [..., row_len] whose leading dimensions collapse into `rows` rows `stride`
// elements apart.
struct TensorRows {
  void* data = nullptr;
  int64_t rows = 0;
  int64_t stride = 0;  // elements
};

struct Fp8AppendArgs {
  TensorRows tokens;
  const int32_t* slots = nullptr;
  uint8_t* cache = nullptr;
  int64_t block_stride = 0, page_stride = 0, page_size = 0, num_blocks = 0;
};

}  // namespace mlakit::detail
