"""Problems and float64 references in NumPy for the CPU (host-array) tests.

bfloat16 arrays are uint16 bit patterns here (what mlakit reads when NumPy has no
bfloat16), so the tests need no ml_dtypes."""

import math

import numpy as np

import mlakit

D_QK, D_V = 576, 512
LOG2E = 1 / math.log(2)


def to_bf16(x):
    """float array -> bfloat16 bit patterns (uint16), round to nearest even."""
    u = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    bits = rounded.astype(np.uint16)
    return np.where(np.isnan(x), np.uint16(0x7FC0), bits)


def from_bf16(bits):
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def activations(rng, shape):
    """FlashMLA's test distribution for q: N(0, 1)."""
    return rng.standard_normal(shape)


def cache_values(rng, shape):
    """FlashMLA's test distribution for the cache: N(0, 1) / 10 clamped to [-1, 1]."""
    return np.clip(rng.standard_normal(shape) / 10, -1, 1)


def paged_case(rng, lengths, s_q=1, h_q=4, h_kv=1, page=16, dtype=np.float16):
    """q, kv_cache (NaN in unused slots), block_table (-1 past the length), cache_seqlens.
    dtype np.float16, or np.uint16 for bfloat16 bit patterns."""
    b = len(lengths)
    max_blocks = max(1, max((n + page - 1) // page for n in lengths)) + 1
    num_blocks = b * max_blocks + 2
    cast = to_bf16 if dtype == np.uint16 else (lambda x: np.asarray(x, dtype=np.float16))
    q = cast(activations(rng, (b, s_q, h_q, D_QK)))
    kv = np.full((num_blocks, page, h_kv, D_QK), np.nan)
    table = np.full((b, max_blocks), -1, dtype=np.int32)
    physical = iter(rng.permutation(num_blocks))
    for i, length in enumerate(lengths):
        for j in range((length + page - 1) // page):
            table[i, j] = next(physical)
        for pos in range(length):
            kv[table[i, pos // page], pos % page] = cache_values(rng, (h_kv, D_QK))
    return q, cast(kv), table, np.array(lengths, dtype=np.int32)


def as_float(x):
    return from_bf16(x) if x.dtype == np.uint16 else np.asarray(x, dtype=np.float64)


def attention(q, keys, scale, sink=None):
    """Softmax attention of rows q [rows, d_qk] over keys [n, d_qk] (V = keys[:, :512]) in
    float64: (out [rows, 512], natural-log lse [rows]); no key: 0 and +inf."""
    if len(keys) == 0:
        return np.zeros((len(q), D_V)), np.full(len(q), np.inf)
    z = q @ keys.T * scale
    m = z.max(axis=1, keepdims=True)
    w = np.exp(z - m)
    lse = (m[:, 0] + np.log(w.sum(axis=1)))
    out = (w @ keys[:, :D_V]) / w.sum(axis=1, keepdims=True)
    if sink is not None:
        out *= (1 / (1 + np.exp(sink - lse)))[:, None]
    return out, lse


def dense_reference(q, kv, table, lengths, scale=1 / math.sqrt(D_QK), causal=False):
    q, kv = as_float(q), as_float(kv)
    b, s_q, h_q, _ = q.shape
    page, h_kv = kv.shape[1], kv.shape[2]
    group = h_q // h_kv
    out = np.zeros((b, s_q, h_q, D_V))
    lse = np.full((b, h_q, s_q), np.inf)
    for i in range(b):
        n = int(lengths[i])
        keys = np.array([kv[table[i, p // page], p % page] for p in range(n)]).reshape(n, h_kv, D_QK)
        for t in range(s_q):
            visible = min(max(n - s_q + t + 1, 0), n) if causal and s_q > 1 else n
            for hk in range(h_kv):
                heads = slice(hk * group, (hk + 1) * group)
                o, l = attention(q[i, t, heads], keys[:visible, hk], scale)
                out[i, t, heads], lse[i, heads, t] = o, l
    return out, lse


def fp8_cache_case(rng, num_blocks=6, page=16):
    """A bf16 cache [num_blocks, page, 1, 576] and its FP8-with-scale bytes (mlakit's CPU
    quantizer), with one all-zero token."""
    kv = to_bf16(cache_values(rng, (num_blocks, page, 1, D_QK)))
    kv[0, 0] = 0
    return kv, mlakit.quantize_fp8_cache(kv)


def sparse_indices(rng, b, s_q, topk, num_tokens):
    """Slots in [0, num_tokens) with duplicates, -1 and out-of-range entries; the last row
    of the first sequence has no valid index."""
    idx = rng.integers(0, num_tokens, size=(b, s_q, topk)).astype(np.int32)
    idx[rng.random(idx.shape) < 0.15] = -1
    idx[rng.random(idx.shape) < 0.05] = num_tokens + 3
    idx[0, -1] = -1
    return idx


def sparse_decode_reference(q, cache_bf16, indices, scale, topk_length=None, sink=None):
    """Float64 over the dequantized (bf16) cache; invalid or past-topk_length indices skipped."""
    q = as_float(q)
    keys_all = as_float(cache_bf16).reshape(-1, D_QK)
    b, s_q, h_q, _ = q.shape
    out = np.zeros((b, s_q, h_q, D_V))
    lse = np.full((b, h_q, s_q), np.inf)
    for i in range(b):
        count = indices.shape[-1] if topk_length is None else max(0, min(int(topk_length[i]), indices.shape[-1]))
        for t in range(s_q):
            valid = [k for k in indices[i, t, :count] if 0 <= k < len(keys_all)]
            out[i, t], lse[i, :, t] = attention(q[i, t], keys_all[valid], scale, sink)
    return out, lse


def sparse_prefill_reference(q, kv, indices, sm_scale, topk_length=None, sink=None, natural=False):
    """Float64: (out, max_logits, lse), statistics in base 2 (natural log with `natural`)."""
    to_base = 1.0 if natural else LOG2E
    q, kv = as_float(q), as_float(kv)[:, 0]
    s_q, h_q, d_qk = q.shape
    out = np.zeros((s_q, h_q, D_V))
    max_logits = np.full((s_q, h_q), -np.inf)
    lse = np.full((s_q, h_q), np.inf)
    for i in range(s_q):
        count = indices.shape[-1] if topk_length is None else max(0, min(int(topk_length[i]), indices.shape[-1]))
        valid = [k for k in indices[i, 0, :count] if 0 <= k < len(kv)]
        if not valid:
            continue
        keys = kv[valid]
        out[i], lse_e = attention(q[i], keys, sm_scale, sink)
        lse[i] = lse_e * to_base
        max_logits[i] = (q[i] @ keys.T * sm_scale).max(axis=1) * to_base
    return out, max_logits, lse
