"""The README's Python snippet, run as written on NumPy host arrays (the README says host
arrays run the CPU reference): plan, dense decode with the plan, FP8 cache, sparse decode
(DeepSeek V3.2, and V4 with a second cache), merge of partial states."""

import math

import numpy as np

import mlakit
from accuracy import check_out, check_stat
from numpy_cases import (
    D_QK,
    activations,
    as_float,
    attention,
    cache_values,
    dense_reference,
    fp8_cache_case,
    paged_case,
    sparse_decode_reference,
    sparse_indices,
    to_bf16,
)


def test_the_readme_python_snippet_runs_on_numpy_arrays():
    rng = np.random.default_rng(40)
    s_q, h_q, h_kv = 2, 8, 1
    q, kv_cache, block_table, cache_seqlens = paged_case(rng, (33, 0, 70), s_q=s_q, h_q=h_q, h_kv=h_kv)
    kv_bf16, _ = fp8_cache_case(rng)

    # --- as in README.md, "Python" ---
    ws_plan = mlakit.mla_decode_plan(cache_seqlens, s_q, h_q, h_kv)        # once per step
    out, lse = mlakit.mla_decode(q, kv_cache, block_table, cache_seqlens, causal=True, plan=ws_plan)
    cache = mlakit.quantize_fp8_cache(kv_bf16)                              # 656-byte FP8 cache
    # ---
    ref_out, ref_lse = dense_reference(q, kv_cache, block_table, cache_seqlens, causal=True)
    check_out(as_float(out), ref_out)
    check_stat(lse, ref_lse)
    workspace, plan = ws_plan
    assert (plan.b, plan.s_q, plan.h_q, plan.h_kv, plan.kernel) == (3, s_q, h_q, h_kv, "reference")
    assert workspace.size == 0  # the CPU reference needs no schedule

    b, topk = 2, 32
    q = to_bf16(activations(rng, (b, s_q, h_q, D_QK)))
    indices = sparse_indices(rng, b, s_q, topk, cache.shape[0] * cache.shape[1])
    topk_length = np.array([topk, 9], np.int32)
    attn_sink = rng.standard_normal(h_q).astype(np.float32)
    # --- as in README.md ---
    out, lse = mlakit.mla_sparse_decode(q, cache, indices, topk_length, attn_sink)
    # ---
    ref_out, ref_lse = sparse_decode_reference(
        q, mlakit.dequantize_fp8_cache(cache), indices, 1 / math.sqrt(D_QK), topk_length, attn_sink
    )
    check_out(as_float(out), ref_out)
    check_stat(lse, ref_lse)

    # DeepSeek V4 with a second cache: against float64 attention over both caches' dequantized tokens.
    kv_v4_bf16 = to_bf16(cache_values(rng, (3, 16, 1, 512)))
    recent_bf16 = to_bf16(cache_values(rng, (2, 8, 1, 512)))
    q_v4 = to_bf16(activations(rng, (b, s_q, h_q, 512)))
    indices_v4 = sparse_indices(rng, b, s_q, topk, 3 * 16)
    window_indices = rng.integers(0, 2 * 8, size=(b, s_q, 8)).astype(np.int32)
    # --- as in README.md ---
    cache_v4, window = mlakit.quantize_fp8_v4_cache(kv_v4_bf16), mlakit.quantize_fp8_v4_cache(recent_bf16)
    out, lse = mlakit.mla_sparse_decode(q_v4, cache_v4, indices_v4, extra_kv_cache=window, extra_indices=window_indices)
    # ---
    first = as_float(mlakit.dequantize_fp8_v4_cache(cache_v4)).reshape(-1, 512)
    second = as_float(mlakit.dequantize_fp8_v4_cache(window)).reshape(-1, 512)
    for i in range(b):
        for t in range(s_q):
            listed = [first[k] for k in indices_v4[i, t] if 0 <= k < len(first)] + [second[k] for k in window_indices[i, t]]
            ref_out, ref_lse = attention(as_float(q_v4)[i, t], np.array(listed), 1 / math.sqrt(512))
            check_out(as_float(out)[i, t], ref_out)
            check_stat(lse[i, :, t], ref_lse)

    # Two partial states of the same rows: the sparse decode's result twice, its LSE viewed as
    # [b, s_q, h_q] like the out's rows; merged, the same output and an LSE larger by log 2.
    outs = np.stack([as_float(out).astype(np.float32)] * 2)
    lses = np.stack([lse.transpose(0, 2, 1)] * 2)
    merged_out, merged_lse = out, lse
    # --- as in README.md ---
    out, lse = mlakit.merge_states(outs, lses)                              # lse_base="e" or "2"
    # ---
    check_out(out, as_float(merged_out))
    check_stat(lse, merged_lse.transpose(0, 2, 1) + math.log(2))
