// The sequences of an MHA prefill, forward or backward (include/mlakit/mha_prefill.h), read
// from the prefix sums with the checks that only the data allows: shared by
// reference/mha_prefill_ref.cpp and reference/mha_prefill_backward_ref.cpp.
#pragma once

#include <cstdint>
#include <vector>

#include "common/mha_prefill_shape.h"
#include "mlakit/status.h"
#include "mlakit/tensor.h"

namespace mlakit::reference {

struct MhaSequence {
  int64_t q0, k0;  // first rows
  int64_t lq, lk;  // lengths
};

// The prefix sums (validated int32 vectors of s.b + 1 entries) ordered, starting at 0, within
// the totals, each length within max_seqlen_*; errors are InvalidArgument from `op` naming the
// entry. Fills `out` with s.b sequences.
Status read_mha_sequences(const char* op, const TensorRef& cu_seqlens_q, const TensorRef& cu_seqlens_k,
                          int max_seqlen_q, int max_seqlen_k, const detail::MhaPrefillShape& s,
                          std::vector<MhaSequence>* out);

}  // namespace mlakit::reference
