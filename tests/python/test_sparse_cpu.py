"""Sparse FP8 decode, sparse prefill and the FP8 cache tools on host (NumPy) arrays."""

import math

import numpy as np
import pytest

import mlakit
from accuracy import check_out, check_stat
from numpy_cases import (
    D_QK,
    activations,
    as_float,
    cache_values,
    fp8_cache_case,
    sparse_decode_reference,
    sparse_indices,
    sparse_prefill_reference,
    to_bf16,
)


def test_fp8_cache_format_round_trip():
    rng = np.random.default_rng(1)
    kv, cache = fp8_cache_case(rng)
    assert cache.shape == kv.shape[:-1] + (656,) and cache.dtype == np.uint8
    x = as_float(kv).reshape(-1, D_QK)
    rows = cache.reshape(-1, 656)
    scales = rows[:, 512:528].copy().view(np.float32)
    tile_max = np.abs(x[:, :512]).reshape(-1, 4, 128).max(axis=2)
    np.testing.assert_array_equal(scales, (tile_max / 448).astype(np.float32))
    np.testing.assert_array_equal(rows[:, 528:].copy().view(np.uint16), kv.reshape(-1, D_QK)[:, 512:])
    back = as_float(mlakit.dequantize_fp8_cache(cache)).reshape(-1, D_QK)
    np.testing.assert_array_equal(back[:, 512:], x[:, 512:])
    # e4m3: 3 mantissa bits (relative error <= 2^-4), subnormal steps of 2^-9 * scale.
    scale_per_value = np.repeat(scales, 128, axis=1)
    assert np.all(np.abs(back[:, :512] - x[:, :512]) <= 2**-4 * np.abs(x[:, :512]) + 2**-9 * scale_per_value)
    assert np.all(back[0] == 0)  # the all-zero token: scale 0, never NaN


def test_append_fp8_cache_writes_the_quantized_tokens_at_their_slots():
    rng = np.random.default_rng(2)
    kv, cache = fp8_cache_case(rng, num_blocks=3, page=8)
    tokens = to_bf16(cache_values(rng, (4, D_QK)))
    slots = np.array([5, -1, 17, 3 * 8 + 1], dtype=np.int32)  # -1 and past-the-end are skipped
    before = cache.copy()
    mlakit.append_fp8_cache(tokens, slots, cache)
    expected = before.reshape(-1, 656).copy()
    expected[[5, 17]] = mlakit.quantize_fp8_cache(tokens[[0, 2]])
    np.testing.assert_array_equal(cache.reshape(-1, 656), expected)


@pytest.mark.parametrize("with_options", [False, True], ids=["plain", "topk_length+sink"])
def test_sparse_decode_matches_naive(with_options):
    rng = np.random.default_rng(3)
    b, s_q, h_q, topk = 3, 2, 8, 24
    kv, cache = fp8_cache_case(rng)
    q = to_bf16(activations(rng, (b, s_q, h_q, D_QK)))
    indices = sparse_indices(rng, b, s_q, topk, kv.shape[0] * kv.shape[1])
    topk_length = np.array([topk, 0, 7], dtype=np.int32) if with_options else None
    sink = rng.standard_normal(h_q).astype(np.float32) if with_options else None
    out, lse = mlakit.mla_sparse_decode(q, cache, indices, topk_length, sink)
    assert out.dtype == np.uint16 and out.shape == (b, s_q, h_q, 512) and lse.shape == (b, h_q, s_q)
    dequantized = mlakit.dequantize_fp8_cache(cache)
    ref_out, ref_lse = sparse_decode_reference(q, dequantized, indices, 1 / math.sqrt(D_QK), topk_length, sink)
    check_out(as_float(out), ref_out)
    check_stat(lse, ref_lse)
    assert np.all(np.isposinf(lse[0, :, -1]))  # the row without a valid index


@pytest.mark.parametrize("d_qk", [576, 512])
@pytest.mark.parametrize("with_options", [False, True], ids=["plain", "topk_length+sink"])
def test_sparse_prefill_matches_naive_with_base2_statistics(d_qk, with_options):
    rng = np.random.default_rng(4)
    s_q, h_q, s_kv, topk = 5, 16, 40, 64
    q = to_bf16(activations(rng, (s_q, h_q, d_qk)))
    kv = to_bf16(cache_values(rng, (s_kv, 1, d_qk)))
    indices = sparse_indices(rng, 1, s_q, topk, s_kv).reshape(s_q, 1, topk)
    topk_length = rng.integers(0, topk + 1, size=s_q).astype(np.int32) if with_options else None
    sink = rng.standard_normal(h_q).astype(np.float32) if with_options else None
    out, max_logits, lse = mlakit.mla_sparse_prefill(q, kv, indices, 0.07, attn_sink=sink, topk_length=topk_length)
    ref_out, ref_max, ref_lse = sparse_prefill_reference(q, kv, indices, 0.07, topk_length, sink)
    check_out(as_float(out), ref_out)
    check_stat(max_logits, ref_max, "max_logits")
    check_stat(lse, ref_lse)


def test_sparse_prefill_natural_log_statistics():
    rng = np.random.default_rng(5)
    q = to_bf16(activations(rng, (3, 16, D_QK)))
    kv = to_bf16(cache_values(rng, (10, 1, D_QK)))
    indices = rng.integers(0, 10, size=(3, 1, 64)).astype(np.int32)
    _, max2, lse2 = mlakit.mla_sparse_prefill(q, kv, indices)
    _, max_e, lse_e = mlakit.mla_sparse_prefill(q, kv, indices, lse_base="e")
    check_stat(lse_e, lse2.astype(np.float64) * math.log(2))
    check_stat(max_e, max2.astype(np.float64) * math.log(2), "max_logits")


def test_sparse_errors_carry_the_library_message():
    rng = np.random.default_rng(6)
    kv, cache = fp8_cache_case(rng)
    q = to_bf16(activations(rng, (1, 1, 4, D_QK)))
    indices = np.zeros((1, 1, 8), dtype=np.int32)
    with pytest.raises(ValueError, match=r"q\.dtype: expected bf16, got fp16"):
        mlakit.mla_sparse_decode(q.view(np.float16), cache, indices)
    with pytest.raises(ValueError, match=r"kv_cache.*656"):
        mlakit.mla_sparse_decode(q, cache[..., :600], indices)
