// Launchers of the portable (sm80+) attention kernels: the split-KV dense decode (per-dtype
// instantiations in mla_decode_portable_{bf16,fp16}.cu), the split-KV sparse FP8 decode
// (mla_sparse_decode_portable.cu) and the whole-sequence mode of the sparse prefill
// (mla_sparse_prefill_bf16.cu). The planner and the combine both kernel families share are in
// kernels/schedule/ and kernels/combine/; the dispatch starts them.
#pragma once

#include <cuda_runtime.h>

#include "kernels/mha_backward_params.h"
#include "kernels/mha_prefill_params.h"
#include "kernels/mla_params.h"

namespace mlakit::detail {

// Dense decode attention alone (grid: 32-row tiles x h_kv x num_parts); the dispatch starts
// the combine after it. Elem: __nv_bfloat16 or __half. Runs with a plan of any kernel family
// (the schedule does not depend on the tiling).
template <typename Elem>
cudaError_t launch_mla_decode_portable(const DenseDecodeParams& params, cudaStream_t stream);

// Sparse FP8 decode attention alone (bf16; grid and plan as the dense decode's); the dispatch
// starts the combine after it.
cudaError_t launch_mla_sparse_decode_portable(const SparseDecodeParams& params, cudaStream_t stream);

// Sparse prefill attention, without a plan (bf16): grid (b * row tiles, h_kv), each CTA one
// row tile of one sequence over all of its keys, final rows written directly; no workspace,
// no combine. The caller keeps b * row tiles <= 2^31 - 1.
cudaError_t launch_mla_sparse_prefill_portable(const SparsePrefillParams& params, cudaStream_t stream);

// MHA prefill (mha_prefill_kernel.cuh; Elem __nv_bfloat16 or __half): grid query row tiles of
// max_seqlen_q x h_q x b; a CTA whose tile starts past its sequence's length returns at once.
// Any (d_qk, d_v) pair of the contract, any strides with a contiguous last dimension; rows
// 16-byte aligned take 16-byte copies, others 4-byte ones.
template <typename Elem>
cudaError_t launch_mha_prefill_portable(const MhaPrefillParams& params, cudaStream_t stream);

// MHA prefill backward, in stream order (Elem __nv_bfloat16 or __half):
// 1. preprocess (mha_backward_rows.cu): D = rowsum(dout * out) of every query row inside a
//    sequence into row_dot, those rows of dq_accum zeroed, the deterministic counters zeroed;
// 2. main (mha_backward_kernel.cuh): grid key tiles of max_seqlen_k x h_kv x b; dk and dv of
//    the CTA's keys, dq / softmax_scale added into dq_accum;
// 3. postprocess (mha_backward_rows.cu): dq = dq_accum * softmax_scale in q's dtype, rows
//    inside a sequence.
template <typename Elem>
cudaError_t launch_mha_backward_preprocess(const MhaBackwardParams& params, cudaStream_t stream);
template <typename Elem>
cudaError_t launch_mha_backward_main_portable(const MhaBackwardParams& params, cudaStream_t stream);
template <typename Elem>
cudaError_t launch_mha_backward_postprocess(const MhaBackwardParams& params, cudaStream_t stream);

}  // namespace mlakit::detail
