"""Empty inputs get the empty result (issue 23, item 4). NumPy gives zero-size arrays
all-zero strides, which the library once refused as ``out.stride[3]: expected 1, got 0``
for arrays the package allocated itself. Where rows remain (no cache blocks, no kv rows)
each is a row with nothing to attend: out 0, lse +inf, max_logits -inf."""

import numpy as np
import pytest

import mlakit
from mlakit import flash_mla
from numpy_cases import D_QK, activations, fp8_cache_case, paged_case, to_bf16


def _assert_nothing_attended(out, lse):
    assert out.size > 0 and np.all(out == 0)
    assert np.all(np.isposinf(lse))


@pytest.mark.parametrize("b, s_q, h_q", [(0, 1, 16), (2, 0, 16), (2, 1, 0)])
def test_dense_decode_of_no_query_rows(b, s_q, h_q):
    rng = np.random.default_rng(30)
    _, kv, table, lengths = paged_case(rng, (7, 12), h_q=16)
    q = np.zeros((b, s_q, h_q, D_QK), np.float16)
    table, lengths = table[:b], lengths[:b]
    plan = mlakit.mla_decode_plan(lengths, s_q, h_q, 1)
    out, lse = mlakit.mla_decode(q, kv.astype(np.float16), table, lengths, plan=plan)
    assert out.shape == (b, s_q, h_q, 512) and lse.shape == (b, h_q, s_q) and out.size == lse.size == 0
    meta, num_splits = flash_mla.get_mla_metadata(lengths, s_q * h_q, 1)
    out, lse = flash_mla.flash_mla_with_kvcache(q, kv.astype(np.float16), table, lengths, 512, meta, num_splits)
    assert out.shape == (b, s_q, h_q, 512) and lse.shape == (b, h_q, s_q)


def test_dense_decode_over_no_cache_blocks():
    q = to_bf16(activations(np.random.default_rng(31), (2, 1, 4, D_QK)))
    kv = np.zeros((0, 64, 1, D_QK), np.uint16)
    out, lse = mlakit.mla_decode(q, kv, np.zeros((2, 0), np.int32), np.zeros(2, np.int32))
    _assert_nothing_attended(out, lse)


@pytest.mark.parametrize("b, s_q, h_q", [(0, 2, 16), (2, 0, 16), (2, 2, 0)])
def test_sparse_decode_of_no_query_rows(b, s_q, h_q):
    _, cache = fp8_cache_case(np.random.default_rng(32))
    q = np.zeros((b, s_q, h_q, D_QK), np.uint16)
    indices = np.zeros((b, s_q, 64), np.int32)
    out, lse = mlakit.mla_sparse_decode(q, cache, indices, plan=mlakit.mla_sparse_decode_plan(b, s_q, h_q, 64, q))
    assert out.shape == (b, s_q, h_q, 512) and lse.shape == (b, h_q, s_q) and out.size == 0


def test_sparse_decode_over_no_cache_blocks():
    q = to_bf16(activations(np.random.default_rng(33), (2, 2, 16, D_QK)))
    out, lse = mlakit.mla_sparse_decode(q, np.zeros((0, 64, 1, 656), np.uint8), np.zeros((2, 2, 64), np.int32))
    _assert_nothing_attended(out, lse)


@pytest.mark.parametrize("s_q, h_q", [(0, 16), (3, 0)])
def test_sparse_prefill_of_no_query_rows(s_q, h_q):
    kv = to_bf16(activations(np.random.default_rng(34), (8, 1, D_QK)) / 10)
    out, max_logits, lse = mlakit.mla_sparse_prefill(
        np.zeros((s_q, h_q, D_QK), np.uint16), kv, np.zeros((s_q, 1, 64), np.int32)
    )
    assert out.shape == (s_q, h_q, 512) and max_logits.shape == lse.shape == (s_q, h_q) and out.size == 0


def test_sparse_prefill_over_no_kv_rows():
    q = to_bf16(activations(np.random.default_rng(35), (3, 16, D_QK)))
    indices = np.arange(3 * 64, dtype=np.int32).reshape(3, 1, 64) - 5
    for fwd in (mlakit.mla_sparse_prefill, lambda *a: flash_mla.flash_mla_sparse_fwd(*a, 0.1)):
        out, max_logits, lse = fwd(q, np.zeros((0, 1, D_QK), np.uint16), indices)
        _assert_nothing_attended(out, lse)
        assert np.all(np.isneginf(max_logits))


def test_fp8_tools_with_no_rows():
    no_tokens = np.zeros((0, D_QK), np.uint16)
    cache = mlakit.quantize_fp8_cache(no_tokens)
    assert cache.shape == (0, 656) and cache.dtype == np.uint8
    assert mlakit.dequantize_fp8_cache(np.zeros((3, 0, 656), np.uint8)).shape == (3, 0, D_QK)
    _, paged = fp8_cache_case(np.random.default_rng(36))
    before = paged.copy()
    mlakit.append_fp8_cache(no_tokens, np.zeros(0, np.int32), paged)
    np.testing.assert_array_equal(paged, before)
    mlakit.append_fp8_cache(no_tokens, np.zeros(0, np.int32), np.zeros((0, 64, 1, 656), np.uint8))
