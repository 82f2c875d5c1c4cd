"""The Python layer on host (NumPy) arrays: the CPU reference path, output allocation and
error translation. GPU paths are tested on the GPU machine."""

import math

import numpy as np
import pytest

import mlakit


def make_case(rng, b=2, s_q=2, h_q=4, h_kv=1, page=16, lengths=(37, 0)):
    max_blocks = max(1, max((l + page - 1) // page for l in lengths)) + 1
    num_blocks = b * max_blocks + 2
    q = np.clip(rng.standard_normal((b, s_q, h_q, 576)), -1, 1).astype(np.float16)
    kv = np.full((num_blocks, page, h_kv, 576), np.nan, dtype=np.float16)
    table = np.full((b, max_blocks), -1, dtype=np.int32)
    physical = rng.permutation(num_blocks)
    used = 0
    for i, length in enumerate(lengths):
        for j in range((length + page - 1) // page):
            table[i, j] = physical[used]
            used += 1
        for pos in range(length):
            kv[table[i, pos // page], pos % page] = np.clip(rng.standard_normal((h_kv, 576)) * 0.1, -1, 1)
    return q, kv, table, np.array(lengths, dtype=np.int32)


def naive(q, kv, table, lengths, scale, causal):
    b, s_q, h_q, _ = q.shape
    page, h_kv = kv.shape[1], kv.shape[2]
    out = np.zeros((b, s_q, h_q, 512))
    lse = np.full((b, h_q, s_q), np.inf)
    for i in range(b):
        length = int(lengths[i])
        keys = np.array([kv[table[i, p // page], p % page] for p in range(length)], dtype=np.float64)
        for t in range(s_q):
            visible = min(max(length - s_q + t + 1, 0), length) if causal and s_q > 1 else length
            for h in range(h_q):
                if visible == 0:
                    continue
                k = keys[:visible, h // (h_q // h_kv)]
                z = k @ q[i, t, h].astype(np.float64) * scale
                m = z.max()
                w = np.exp(z - m)
                out[i, t, h] = (w @ k[:, :512]) / w.sum()
                lse[i, h, t] = m + math.log(w.sum())
    return out, lse


@pytest.mark.parametrize("causal", [False, True])
def test_cpu_reference_matches_naive(causal):
    rng = np.random.default_rng(7)
    q, kv, table, lengths = make_case(rng)
    out, lse = mlakit.mla_decode(q, kv, table, lengths, causal=causal)
    assert out.shape == (2, 2, 4, 512) and out.dtype == np.float16
    assert lse.shape == (2, 4, 2) and lse.dtype == np.float32
    ref_out, ref_lse = naive(q, kv, table, lengths, 1 / math.sqrt(576), causal)
    err = np.abs(out.astype(np.float64) - ref_out)
    assert np.all((err <= 1e-3) | (err <= 2 / 128 * np.abs(ref_out)))
    finite = np.isfinite(ref_lse)
    assert np.array_equal(np.isfinite(lse), finite)
    assert np.all(np.isposinf(lse[~finite]))
    assert np.allclose(lse[finite], ref_lse[finite], rtol=8 / 65536, atol=1e-6)
    assert np.all(out[1] == 0)  # sequence 1 has length 0


def test_softmax_scale_is_used():
    rng = np.random.default_rng(8)
    q, kv, table, lengths = make_case(rng, lengths=(20, 5))
    _, lse_default = mlakit.mla_decode(q, kv, table, lengths)
    _, lse_scaled = mlakit.mla_decode(q, kv, table, lengths, softmax_scale=0.5)
    _, ref_lse = naive(q, kv, table, lengths, 0.5, False)
    assert np.allclose(lse_scaled, ref_lse, rtol=8 / 65536, atol=1e-6)
    assert not np.allclose(lse_default, lse_scaled)


def test_invalid_arguments_raise_value_error_with_the_library_message():
    rng = np.random.default_rng(9)
    q, kv, table, lengths = make_case(rng)
    with pytest.raises(ValueError, match=r"q\.shape\[3\] \(d_qk\): expected 576.*got 512"):
        mlakit.mla_decode(q[..., :512].copy(), kv, table, lengths)
    with pytest.raises(ValueError, match=r"block_table\.dtype: expected int32, got float32"):
        mlakit.mla_decode(q, kv, table.astype(np.float32), lengths)
    with pytest.raises(TypeError, match="unsupported dtype"):
        mlakit.mla_decode(q.astype(np.float64), kv, table, lengths)
