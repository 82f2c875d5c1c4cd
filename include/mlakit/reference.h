// CPU reference implementations (float64 accumulation) of mlakit's operations, for tests and
// for machines without a GPU. They take host pointers and follow the same contract (docs/contract.md) and
// validation as the GPU entry points.
#pragma once

#include <cstdint>

#include "mlakit/mla_decode.h"
#include "mlakit/status.h"

namespace mlakit::reference {

// Dense MLA decode (docs/contract.md) on host memory. No plan is needed. `out` is q's dtype,
// or float32 for the unrounded result (what accuracy checks compare against). Rows attend to keys
// whose block-table entry is out of [0, num_blocks) or past the table's width give NaN rows,
// like the GPU kernels (which never dereference such entries). num_threads 0 = hardware
// concurrency (fewer when the host cannot create that many threads). Host memory it cannot
// allocate (buffers of up to the visible keys that can be dereferenced: block table width *
// page size per sequence and thread) is a ResourceExhausted status, never an exception.
Status mla_decode(const MlaDecodeArgs& args, int num_threads = 0);

// docs/contract.md, Merging states: merges the partial states (o_a, lse_a) and (o_b, lse_b) of one row into
// (o, lse); natural-log LSEs. An LSE of -inf or +inf marks an empty state; merging only empty
// states gives o = 0, lse = +inf. o may alias o_a or o_b. Each of o_a, o_b, o holds d doubles.
// Returns InvalidArgument (nothing written) for d < 1 or a null pointer.
Status merge_states(const double* o_a, double lse_a, const double* o_b, double lse_b, int64_t d,
                    double* o, double* lse);

}  // namespace mlakit::reference
