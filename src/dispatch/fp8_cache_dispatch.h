// Dispatch of the FP8 MLA cache tools: validated rows -> one launch each. Plain C++
// interface; implemented in CUDA (fp8_cache_dispatch.cu), absent without CUDA.
#pragma once

#include "common/fp8_cache_rows.h"
#include "mlakit/status.h"
#include "mlakit/stream.h"

namespace mlakit::detail {

// src: rows of 576 bf16; dst: rows of 656 bytes (the same row count). `op` names the entry
// point in a CUDA error.
Status dispatch_quantize_mla_fp8(const char* op, const TensorRows& src, const TensorRows& dst, cudaStream_t stream);
// src: rows of 656 bytes; dst: rows of 576 bf16.
Status dispatch_dequantize_mla_fp8(const char* op, const TensorRows& src, const TensorRows& dst, cudaStream_t stream);
Status dispatch_append_mla_fp8(const char* op, const Fp8AppendArgs& args, cudaStream_t stream);

}  // namespace mlakit::detail
