"""Dense MHA prefill forward on host (NumPy) arrays against a NumPy float64 formula written
here: varlen batches with empty sequences, causal bottom-right alignment, GQA, every head-dim
pair, bfloat16 bit patterns and float16, strided views, the given scale, errors."""

import math

import numpy as np
import pytest

import mlakit
from accuracy import check_out, check_stat
from numpy_cases import as_float, to_bf16

PAIRS = [(64, 64), (128, 128), (192, 128), (256, 256)]


def case(rng, lq, lk, h_q, h_kv, d_qk, d_v, bf16):
    cast = to_bf16 if bf16 else (lambda x: np.asarray(x, dtype=np.float16))
    q = cast(rng.standard_normal((sum(lq), h_q, d_qk)))
    k = cast(rng.standard_normal((sum(lk), h_kv, d_qk)))
    v = cast(rng.standard_normal((sum(lk), h_kv, d_v)))
    cu = lambda ls: np.concatenate([[0], np.cumsum(ls)]).astype(np.int32)  # noqa: E731
    return q, k, v, cu(lq), cu(lk)


def formula(q, k, v, cu_q, cu_k, scale, causal):
    q, k, v = as_float(q), as_float(k), as_float(v)
    h_q, h_kv = q.shape[1], k.shape[1]
    out = np.zeros((q.shape[0], h_q, v.shape[2]))
    lse = np.zeros((h_q, q.shape[0]))
    for i in range(len(cu_q) - 1):
        q0, q1, k0, k1 = cu_q[i], cu_q[i + 1], cu_k[i], cu_k[i + 1]
        lq, lk = q1 - q0, k1 - k0
        for h in range(h_q):
            hk = h // (h_q // h_kv)
            z = q[q0:q1, h] @ k[k0:k1, hk].T * scale  # [lq, lk]
            if causal:
                z = np.where(np.arange(lk)[None, :] <= np.arange(lq)[:, None] + lk - lq, z, -np.inf)
            for t in range(lq):
                if not np.isfinite(z[t]).any():
                    lse[h, q0 + t] = np.inf
                    continue
                m = z[t].max()
                w = np.exp(z[t] - m)
                lse[h, q0 + t] = m + np.log(w.sum())
                out[q0 + t, h] = w @ v[k0:k1, hk] / w.sum()
    return out, lse


@pytest.mark.parametrize("d_qk,d_v", PAIRS)
@pytest.mark.parametrize("causal", [False, True])
def test_matches_the_formula(d_qk, d_v, causal):
    rng = np.random.default_rng(d_qk + d_v + causal)
    lq, lk = [5, 0, 17, 3, 1], [9, 4, 17, 0, 1]  # Lq < Lk, 0 on either side, Lq == Lk, Lq > Lk
    q, k, v, cu_q, cu_k = case(rng, lq, lk, 4, 2, d_qk, d_v, bf16=d_qk != 64)
    out, lse = mlakit.mha_prefill(q, k, v, cu_q, cu_k, max(lq), max(lk), causal=causal)
    want_out, want_lse = formula(q, k, v, cu_q, cu_k, 1 / math.sqrt(d_qk), causal)
    check_out(as_float(out), want_out)
    check_stat(lse, want_lse)
    assert out.dtype == q.dtype and lse.dtype == np.float32


@pytest.mark.parametrize("h_kv", [1, 2, 8])
def test_gqa_ratios_a_given_scale_and_strided_views(h_kv):
    rng = np.random.default_rng(10 + h_kv)
    q, k, v, cu_q, cu_k = case(rng, [6, 11], [11, 6], 8, h_kv, 128, 128, bf16=True)
    wide = np.full((q.shape[0], 8, 256), 0x7FC0, dtype=np.uint16)  # NaN padding beside the view
    wide[:, :, :128] = q
    out, lse = mlakit.mha_prefill(wide[:, :, :128], k, v, cu_q, cu_k, 11, 11, softmax_scale=0.05, causal=True)
    want_out, want_lse = formula(q, k, v, cu_q, cu_k, 0.05, True)
    check_out(as_float(out), want_out)
    check_stat(lse, want_lse)


def test_errors_name_the_argument():
    rng = np.random.default_rng(20)
    q, k, v, cu_q, cu_k = case(rng, [3, 2], [4, 2], 4, 2, 128, 128, bf16=False)
    with pytest.raises(ValueError, match="max_seqlen_k"):
        mlakit.mha_prefill(q, k, v, cu_q, cu_k, 3, 3)
    with pytest.raises(ValueError, match=r"cu_seqlens_q\[2\]"):
        mlakit.mha_prefill(q, k, v, np.array([0, 4, 3], np.int32), cu_k, 4, 4)
    with pytest.raises(ValueError, match="h_kv"):
        mlakit.mha_prefill(q, k[:, :1].repeat(3, axis=1), v[:, :1].repeat(3, axis=1), cu_q, cu_k, 3, 4)
    with pytest.raises(ValueError, match="d_qk, d_v"):
        mlakit.mha_prefill(q, k, v[:, :, :64], cu_q, cu_k, 3, 4)
    with pytest.raises(ValueError, match="softmax_scale"):
        mlakit.mha_prefill(q, k, v, cu_q, cu_k, 3, 4, softmax_scale=float("nan"))
    with pytest.raises(TypeError, match="q"):
        mlakit.mha_prefill([1, 2], k, v, cu_q, cu_k, 3, 4)


def test_empty_batches_and_rows_in_no_sequence():
    rng = np.random.default_rng(30)
    q, k, v, cu_q, cu_k = case(rng, [2, 2], [3, 3], 2, 1, 64, 64, bf16=False)
    out, lse = mlakit.mha_prefill(q, k, v, np.array([0, 2, 3], np.int32), cu_k, 2, 3)
    assert np.all(as_float(out[3]) == 0) and np.all(lse[:, 3] == 0)
    out, lse = mlakit.mha_prefill(q[:0], k, v, np.zeros(1, np.int32), np.zeros(1, np.int32), 0, 0)
    assert out.shape == (0, 2, 64) and lse.shape == (2, 0)
