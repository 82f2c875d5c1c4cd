"""Dense decode on host (NumPy) arrays: the CPU reference path, output allocation and error
translation. The GPU paths are in test_gpu_torch.py."""

import math

import numpy as np
import pytest

import mlakit
from accuracy import check_out, check_stat
from numpy_cases import as_float, dense_reference, paged_case


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [np.float16, np.uint16], ids=["fp16", "bf16"])
def test_cpu_reference_matches_naive(causal, dtype):
    rng = np.random.default_rng(7)
    q, kv, table, lengths = paged_case(rng, (37, 0, 16), s_q=2, h_q=4, dtype=dtype)
    out, lse = mlakit.mla_decode(q, kv, table, lengths, causal=causal)
    assert out.shape == (3, 2, 4, 512) and out.dtype == dtype
    assert lse.shape == (3, 4, 2) and lse.dtype == np.float32
    ref_out, ref_lse = dense_reference(q, kv, table, lengths, causal=causal)
    check_out(as_float(out), ref_out)
    check_stat(lse, ref_lse)
    assert np.all(out[1] == 0)  # sequence 1 has length 0


def test_kv_heads_share_query_heads():
    rng = np.random.default_rng(3)
    q, kv, table, lengths = paged_case(rng, (20, 33), h_q=6, h_kv=3)
    out, lse = mlakit.mla_decode(q, kv, table, lengths)
    ref_out, ref_lse = dense_reference(q, kv, table, lengths)
    check_out(out, ref_out)
    check_stat(lse, ref_lse)


def test_ml_dtypes_bfloat16_arrays():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(4)
    q, kv, table, lengths = paged_case(rng, (9, 40), dtype=np.uint16)
    out, lse = mlakit.mla_decode(q.view(ml_dtypes.bfloat16), kv.view(ml_dtypes.bfloat16), table, lengths)
    assert out.dtype == ml_dtypes.bfloat16
    ref_out, ref_lse = dense_reference(q, kv, table, lengths)
    check_out(out.astype(np.float64), ref_out)
    check_stat(lse, ref_lse)


def test_softmax_scale_is_used():
    rng = np.random.default_rng(8)
    q, kv, table, lengths = paged_case(rng, (20, 5))
    _, lse_default = mlakit.mla_decode(q, kv, table, lengths)
    _, lse_scaled = mlakit.mla_decode(q, kv, table, lengths, softmax_scale=0.5)
    check_stat(lse_scaled, dense_reference(q, kv, table, lengths, scale=0.5)[1])
    check_stat(lse_default, dense_reference(q, kv, table, lengths, scale=1 / math.sqrt(576))[1])


def test_invalid_arguments_raise_value_error_with_the_library_message():
    rng = np.random.default_rng(9)
    q, kv, table, lengths = paged_case(rng, (37, 0))
    with pytest.raises(ValueError, match=r"q\.shape\[3\] \(d_qk\): expected 576.*got 512"):
        mlakit.mla_decode(q[..., :512].copy(), kv, table, lengths)
    with pytest.raises(ValueError, match=r"block_table\.dtype: expected int32, got float32"):
        mlakit.mla_decode(q, kv, table.astype(np.float32), lengths)
    with pytest.raises(TypeError, match="unsupported dtype"):
        mlakit.mla_decode(q.astype(np.float64), kv, table, lengths)

