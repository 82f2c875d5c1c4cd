// The base of a log-sum-exp an operation reads or returns (docs/contract.md, LSE): base 2
// (FlashMLA's 2025 sparse kernels, FlashInfer's merge) or natural (mlakit's decodes,
// FlashAttention). One type for every operation that lets the caller choose.
#pragma once

#include <cstdint>

namespace mlakit {

enum class LseBase : int32_t {
  kBase2 = 0,    // log2(sum 2^x): the sparse prefill's P = q.k * sm_scale * log2(e)
  kNatural = 1,  // log(sum e^x): the same quantities multiplied by ln(2)
};

}  // namespace mlakit
