"""GQA decode and its cache tools on host (NumPy) arrays: the CPU reference path against an
independent float64 NumPy implementation written here (rotary embedding, int8 / fp8
quantization and e4m3 decoding included), output allocation, argument errors and empty
inputs. bfloat16 is uint16 bit patterns and fp8 uint8 bytes (what mlakit reads when NumPy
has no such dtype), so only the ml_dtypes test needs ml_dtypes. The GPU paths are in
test_gpu_gqa_decode.py."""

import math

import numpy as np
import pytest

import mlakit
from accuracy import check_out, check_stat
from numpy_cases import from_bf16, to_bf16

# ----------------------------------------------------------------------------------------
# The independent implementation.

E4M3_MAX = 448.0


def e4m3_values():
    """The float value of every float8 e4m3fn code 0..255 (NaN for 0x7F / 0xFF)."""
    codes = np.arange(256)
    sign = np.where(codes & 0x80, -1.0, 1.0)
    exp, man = (codes >> 3) & 0xF, codes & 0x7
    value = np.where(exp == 0, man / 8 * 2.0**-6, (1 + man / 8) * 2.0 ** (exp - 7))
    value = np.where((exp == 15) & (man == 7), np.nan, value)
    return sign * value


E4M3 = e4m3_values()


def e4m3_round(y):
    """float32 values -> the e4m3 value each rounds to (nearest, ties to the even code,
    saturating at +-448), as float64."""
    y = np.asarray(y, dtype=np.float64)
    positive = E4M3[:127]  # codes 0..126: 0 .. 448, increasing
    a = np.minimum(np.abs(y), E4M3_MAX)
    hi = np.clip(np.searchsorted(positive, a), 0, 126)
    lo = np.maximum(hi - 1, 0)
    d_lo, d_hi = a - positive[lo], positive[hi] - a
    pick_hi = (d_hi < d_lo) | ((d_hi == d_lo) & (hi % 2 == 0))
    return np.sign(y) * positive[np.where(pick_hi, hi, lo)]


def as_float(x):
    """bf16 bits (uint16), fp16 or float arrays -> float64."""
    x = np.asarray(x)
    return from_bf16(x) if x.dtype == np.uint16 else x.astype(np.float64)


def cast(x, dtype):
    """float -> bf16 bits (np.uint16) or fp16."""
    return to_bf16(np.asarray(x, np.float32)) if dtype == np.uint16 else np.asarray(x, np.float16)


def rope(x, pos, style, theta=10000.0, rotary_dim=0):
    """x [..., d] float64 rotated at position `pos`: NeoX pairs (c, c + r/2), GPT-J (2c, 2c + 1)."""
    if style is None:
        return x
    r = rotary_dim or x.shape[-1]
    c = np.arange(r // 2)
    angle = pos * theta ** (-2.0 * c / r)
    cos, sin = np.cos(angle), np.sin(angle)
    first, second = (c, c + r // 2) if style == "neox" else (2 * c, 2 * c + 1)
    y = x.copy()
    a, b = x[..., first], x[..., second]
    y[..., first] = a * cos - b * sin
    y[..., second] = a * sin + b * cos
    return y


def quantize_rows(x, kind, tensor_scale=None):
    """float32 rows [..., d] -> (stored values as float64, scale [...]) by the contract's rules."""
    x = np.asarray(x, np.float32)
    if tensor_scale is not None:
        s = np.float32(tensor_scale)
        y = np.zeros_like(x) if s == 0 else x / s
        return e4m3_round(y), None
    amax = np.abs(x).max(axis=-1)
    s = (amax / np.float32(127.0 if kind == "int8" else E4M3_MAX)).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        y = np.where(s[..., None] > 0, x / s[..., None], np.float32(0))
    if kind == "int8":
        return np.clip(np.rint(y), -127, 127).astype(np.float64), s
    return e4m3_round(y), s


def gqa_reference(q, k, v, table, lengths, scale=None, causal=False, window=0, softcap=0.0, alibi=None,
                  rope_style=None, rope_theta=10000.0, rotary_dim=0, skip=(), q_dtype=None):
    """Float64 GQA decode over dequantized caches k, v [num_blocks, page, h_kv, d]:
    (out [b, s_q, h_q, d], lse [b, h_q, s_q]); rows seeing no key give 0 and +inf. A rotated
    q is rounded to q's dtype (`q_dtype`, np.uint16 for bf16 or np.float16; default q's), as
    the contract says: the kernels' matrix units take it in that dtype."""
    q_dtype = q.dtype if q_dtype is None else q_dtype
    q = as_float(q)
    b, s_q, h_q, d = q.shape
    page, h_kv = k.shape[1], k.shape[2]
    group = h_q // h_kv
    scale = 1 / math.sqrt(d) if scale is None else scale
    out = np.zeros((b, s_q, h_q, d))
    lse = np.full((b, h_q, s_q), np.inf)
    for i in range(b):
        if i in skip:
            continue
        n = int(lengths[i])
        slots = [(table[i, p // page], p % page) for p in range(n)]
        keys = np.array([k[blk, row] for blk, row in slots]).reshape(n, h_kv, d)
        values = np.array([v[blk, row] for blk, row in slots]).reshape(n, h_kv, d)
        for t in range(s_q):
            pos = n - s_q + t
            last = pos if causal else n - 1
            first = max(0, last - window + 1) if window > 0 else 0
            if last < first:
                continue
            for h in range(h_q):
                hk = h // group
                qr = rope(q[i, t, h], pos, rope_style, rope_theta, rotary_dim)
                if rope_style is not None:
                    qr = as_float(cast(qr.astype(np.float32), q_dtype))
                s = keys[first : last + 1, hk] @ qr * scale
                if softcap > 0:
                    s = softcap * np.tanh(s / softcap)
                if alibi is not None:
                    s = s + alibi[h] * (np.arange(first, last + 1) - pos)
                m = s.max()
                w = np.exp(s - m)
                out[i, t, h] = w @ values[first : last + 1, hk] / w.sum()
                lse[i, h, t] = m + np.log(w.sum())
    return out, lse


def paged_case(rng, lengths, s_q=1, h_q=8, h_kv=2, d=64, page=16, dtype=np.uint16):
    """q, k_cache, v_cache (NaN in every unused slot), block_table (shuffled, -1 past each
    sequence), cache_seqlens."""
    b = len(lengths)
    max_blocks = max(1, max(-(-n // page) for n in lengths)) + 1
    num_blocks = b * max_blocks + 2
    q = cast(rng.standard_normal((b, s_q, h_q, d)), dtype)
    caches = [np.full((num_blocks, page, h_kv, d), np.nan) for _ in range(2)]
    table = np.full((b, max_blocks), -1, np.int32)
    physical = iter(rng.permutation(num_blocks))
    for i, n in enumerate(lengths):
        for j in range(-(-n // page)):
            table[i, j] = next(physical)
        for pos in range(n):
            for cache in caches:
                cache[table[i, pos // page], pos % page] = np.clip(rng.standard_normal((h_kv, d)) / 4, -1, 1)
    return q, cast(caches[0], dtype), cast(caches[1], dtype), table, np.array(lengths, np.int32)


def dequantized(values, scale):
    """float64 of a cache: int8 / fp8 bytes (uint8) times the scale, or bf16 / fp16."""
    if values.dtype == np.uint8:
        stored = E4M3[values]
    elif values.dtype == np.int8:
        stored = values.astype(np.float64)
    else:
        return as_float(values)
    if scale is None:
        return stored
    s = np.asarray(scale, np.float64)
    return stored * (s[0] if s.ndim == 1 else s[..., None])


def assert_row_stored(stored, scale, x, kind, tensor_scale=None, exact=True):
    """A cache row (stored values as float64 [h_kv, d], scale [h_kv] or a scalar) holds the
    float32 rows x [h_kv, d] quantized by the contract's rules: exactly, or for rotated keys
    (x from the float64 rotation here, the library rotating in float, which may differ in the
    last bits of x) within half a quantization step after the scale."""
    expected, expected_scale = quantize_rows(x, kind, tensor_scale)
    if exact:
        np.testing.assert_array_equal(stored, expected)
        if tensor_scale is None:
            np.testing.assert_array_equal(scale, expected_scale)
        return
    s = np.float64(tensor_scale) if tensor_scale is not None else np.asarray(scale, np.float64)
    if tensor_scale is None:
        np.testing.assert_allclose(s, expected_scale, rtol=1e-5)
    s = np.broadcast_to(np.asarray(s)[..., None] if np.ndim(s) else s, stored.shape)
    target = x.astype(np.float64)
    if kind == "int8":
        bound = 0.5 * s * (1 + 1e-3) + 1e-12
    else:
        target = np.clip(target, -E4M3_MAX * s, E4M3_MAX * s)
        bound = 2.0**-4 * np.abs(target) * (1 + 1e-3) + 2.0**-10 * s * 1.01 + 1e-12
    assert np.all(np.abs(stored * s - target) <= bound), "a rotated row is off by more than half a step"


def check(got, expected):
    if isinstance(got, tuple):
        check_out(as_float(got[0]), expected[0])
        check_stat(got[1], expected[1])
    else:
        check_out(as_float(got), expected[0])


# ----------------------------------------------------------------------------------------
# The decode.


@pytest.mark.parametrize("dtype", [np.uint16, np.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("heads", [(8, 2), (4, 4), (6, 1)], ids=["gqa4", "mha", "mqa6"])
def test_decode_matches_numpy(dtype, heads):
    h_q, h_kv = heads
    rng = np.random.default_rng(1)
    q, k, v, table, lengths = paged_case(rng, (37, 0, 16, 5), h_q=h_q, h_kv=h_kv, dtype=dtype)
    out, lse = mlakit.gqa_decode(q, k, v, table, lengths, return_lse=True)
    assert out.shape == q.shape and out.dtype == dtype
    assert lse.shape == (4, h_q, 1) and lse.dtype == np.float32
    check((out, lse), gqa_reference(q, as_float(k), as_float(v), table, lengths))
    assert np.all(out[1] == 0) and np.all(np.isposinf(lse[1]))  # sequence 1 has length 0


@pytest.mark.parametrize("d", [64, 128, 256])
def test_head_dims(d):
    rng = np.random.default_rng(d)
    q, k, v, table, lengths = paged_case(rng, (21, 40), h_q=4, h_kv=2, d=d, page=8)
    out = mlakit.gqa_decode(q, k, v, table, lengths)
    assert out.shape == (2, 1, 4, d)
    check(out, gqa_reference(q, as_float(k), as_float(v), table, lengths))


OPTIONS = {
    "causal_s_q3": dict(s_q=3, causal=True),
    "window": dict(s_q=2, causal=True, window=5),
    "window_not_causal": dict(window=7),
    "softcap_scale": dict(softcap=2.0, softmax_scale=0.7),
    "alibi": dict(alibi=True),
    "rope_neox": dict(rope_style="neox"),
    "rope_gptj_partial": dict(rope_style="gptj", rotary_dim=32, rope_theta=500.0),
}


@pytest.mark.parametrize("name", list(OPTIONS))
def test_options_match_numpy(name):
    opts = dict(OPTIONS[name])
    rng = np.random.default_rng(len(name))
    s_q = opts.pop("s_q", 1)
    q, k, v, table, lengths = paged_case(rng, (30, 2, 17), s_q=s_q)
    alibi = rng.uniform(0.01, 0.5, 8).astype(np.float32) if opts.pop("alibi", False) else None
    out, lse = mlakit.gqa_decode(q, k, v, table, lengths, alibi_slopes=alibi, return_lse=True, **opts)
    ref_opts = {("scale" if key == "softmax_scale" else key): val for key, val in opts.items()}
    check((out, lse), gqa_reference(q, as_float(k), as_float(v), table, lengths, alibi=alibi, **ref_opts))


def test_causal_rows_before_the_sequence_are_empty():
    """s_q = 3 over a sequence of 1 token, causal: tokens 0 and 1 sit at positions -2, -1."""
    rng = np.random.default_rng(5)
    q, k, v, table, lengths = paged_case(rng, (1, 9), s_q=3)
    out, lse = mlakit.gqa_decode(q, k, v, table, lengths, causal=True, return_lse=True)
    assert np.all(out[0, :2] == 0) and np.all(np.isposinf(lse[0, :, :2]))
    check((out, lse), gqa_reference(q, as_float(k), as_float(v), table, lengths, causal=True))


@pytest.mark.parametrize("style", ["neox", "gptj"])
@pytest.mark.parametrize("dtype", [np.uint16, np.float16], ids=["bf16", "fp16"])
def test_append_with_rope_writes_the_rotated_rows_then_attends(style, dtype):
    rng = np.random.default_rng(11)
    s_q = 2
    q, k, v, table, lengths = paged_case(rng, (20, 2, 33), s_q=s_q, dtype=dtype)
    k_new = cast(rng.standard_normal((3, s_q, 2, 64)) / 4, dtype)
    v_new = cast(rng.standard_normal((3, s_q, 2, 64)) / 4, dtype)
    before_k, before_v = k.copy(), v.copy()
    out, lse = mlakit.gqa_decode(q, k, v, table, lengths, k_new=k_new, v_new=v_new, rope_style=style, causal=True,
                                 return_lse=True)
    written = np.zeros(k.shape[:3], bool)
    for i, n in enumerate(lengths):
        for t in range(s_q):
            pos = n - s_q + t
            blk, row = table[i, pos // 16], pos % 16
            written[blk, row] = True
            # The key rotated (in float by the library: within one 16-bit ulp of the float64 rotation).
            expected_k = rope(as_float(k_new[i, t]), pos, style)
            ulp = 2.0**-7 if dtype == np.uint16 else 2.0**-10
            np.testing.assert_allclose(as_float(k[blk, row]), expected_k, rtol=ulp, atol=1e-6,
                                       err_msg=f"k at entry {i} token {t}")
            np.testing.assert_array_equal(v[blk, row], v_new[i, t])
    # Nothing else changed (NaN slots stay NaN: compare the bits).
    np.testing.assert_array_equal(k[~written].view(np.uint16), before_k[~written].view(np.uint16))
    np.testing.assert_array_equal(v[~written].view(np.uint16), before_v[~written].view(np.uint16))
    check((out, lse), gqa_reference(q, as_float(k), as_float(v), table, lengths, causal=True, rope_style=style))


@pytest.mark.parametrize("kind", ["int8", "fp8", "fp8_per_tensor"])
def test_quantize_matches_the_contract_rules(kind):
    rng = np.random.default_rng(12)
    _, k, _, _, _ = paged_case(rng, (40, 7), page=8)
    k = np.where(np.isnan(as_float(k)), 0, as_float(k))
    k[0, 0, 0] = 0  # an all-zero row: scale 0, never NaN
    k16 = cast(k, np.uint16)
    tensor_scale = 0.004 if kind == "fp8_per_tensor" else None
    values, scale = mlakit.quantize_gqa_cache(k16, "int8" if kind == "int8" else "fp8", scale=tensor_scale)
    assert values.shape == k.shape
    assert values.dtype == np.int8 if kind == "int8" else values.dtype.name in ("uint8", "float8_e4m3fn")
    stored, expected_scale = quantize_rows(as_float(k16), "int8" if kind == "int8" else "fp8", tensor_scale)
    if tensor_scale is None:
        assert scale.shape == k.shape[:3] and scale.dtype == np.float32
        np.testing.assert_array_equal(scale, expected_scale)
        assert scale[0, 0, 0] == 0
    else:
        assert scale.shape == (1,) and scale[0] == np.float32(tensor_scale)
    bytes_ = values.view(np.int8 if kind == "int8" else np.uint8)
    got = bytes_.astype(np.float64) if kind == "int8" else E4M3[bytes_]
    np.testing.assert_array_equal(got, stored)
    # Dequantize: stored * scale, rounded to bf16 / fp16 (within one unit in the last place of
    # the exact product: the product may be rounded to float32 first).
    exact = dequantized(bytes_.view(np.uint8) if kind != "int8" else bytes_, scale)
    for name, dtype, ulp in (("bfloat16", np.uint16, 2.0**-8), ("float16", np.float16, 2.0**-11)):
        back = mlakit.dequantize_gqa_cache(values, scale, dtype=name)
        assert back.shape == k.shape
        got = as_float(back.view(np.uint16) if name == "bfloat16" else back)
        np.testing.assert_allclose(got, exact, rtol=ulp, atol=1e-7)


@pytest.mark.parametrize("kind", ["int8", "fp8", "fp8_per_tensor"])
def test_decode_over_quantized_caches_with_append(kind):
    rng = np.random.default_rng(13)
    q, k, v, table, lengths = paged_case(rng, (25, 3, 48), s_q=2)
    k, v = (cast(np.nan_to_num(as_float(x)), np.uint16) for x in (k, v))
    dtype = "int8" if kind == "int8" else "fp8"
    tensor_scale = 0.003 if kind == "fp8_per_tensor" else None
    kq, ks = mlakit.quantize_gqa_cache(k, dtype, scale=tensor_scale)
    vq, vs = mlakit.quantize_gqa_cache(v, dtype, scale=tensor_scale)
    kq, vq = (x.view(np.int8 if dtype == "int8" else np.uint8) for x in (kq, vq))  # fp8 as its bytes
    k_new = to_bf16(rng.standard_normal((3, 2, 2, 64)) / 4)
    v_new = to_bf16(rng.standard_normal((3, 2, 2, 64)) / 4)
    out, lse = mlakit.gqa_decode(q, kq, vq, table, lengths, k_scale=ks, v_scale=vs, k_new=k_new, v_new=v_new,
                                 rope_style="neox", causal=True, return_lse=True)
    for i, n in enumerate(lengths):  # the appended rows, quantized by the contract's rules
        for t in range(2):
            pos = n - 2 + t
            blk, row = table[i, pos // 16], pos % 16
            for cache, scale, new, rot in ((kq, ks, k_new, "neox"), (vq, vs, v_new, None)):
                x = rope(as_float(new[i, t]), pos, rot).astype(np.float32)
                got = cache[blk, row].astype(np.float64) if dtype == "int8" else E4M3[cache[blk, row]]
                got_scale = scale[0] if tensor_scale is not None else scale[blk, row]
                assert_row_stored(got, got_scale, x, dtype, tensor_scale, exact=rot is None)
    ref = gqa_reference(q, dequantized(kq, ks), dequantized(vq, vs), table, lengths, causal=True, rope_style="neox")
    check((out, lse), ref)


def test_the_append_tool_stores_what_the_fused_append_stores():
    rng = np.random.default_rng(14)
    q, k, v, table, lengths = paged_case(rng, (19, 40), s_q=3)
    k, v = (cast(np.nan_to_num(as_float(x)), np.uint16) for x in (k, v))
    kq, ks = mlakit.quantize_gqa_cache(k, "int8")
    vq, vs = mlakit.quantize_gqa_cache(v, "int8")
    k_new = to_bf16(rng.standard_normal((2, 3, 2, 64)))
    v_new = to_bf16(rng.standard_normal((2, 3, 2, 64)))
    finished = np.array([0, 1], np.uint8)
    fused = [x.copy() for x in (kq, ks, vq, vs)]
    mlakit.gqa_decode(q, fused[0], fused[2], table, lengths, k_scale=fused[1], v_scale=fused[3], k_new=k_new,
                      v_new=v_new, rope_style="gptj", rotary_dim=16, finished=finished)
    tool = [x.copy() for x in (kq, ks, vq, vs)]
    mlakit.gqa_cache_append(k_new, v_new, tool[0], tool[2], table, lengths, k_scale=tool[1], v_scale=tool[3],
                            rope_style="gptj", rotary_dim=16, finished=finished)
    for a, b in zip(fused, tool):
        np.testing.assert_array_equal(a, b)
    changed = (tool[0] != kq).any(axis=-1)
    assert changed.sum() > 0 and not changed[table[1, 2], 40 % 16 - 1].any()  # entry 1 finished: untouched


def test_finished_entries_are_skipped():
    rng = np.random.default_rng(15)
    q, k, v, table, lengths = paged_case(rng, (10, 20, 30))
    out = np.full(q.shape, 7, np.uint16)
    got = mlakit.gqa_decode(q, k, v, table, lengths, finished=np.array([0, 1, 0], np.uint8), out=out)
    assert got is out
    assert np.all(out[1] == 7)
    ref = gqa_reference(q, as_float(k), as_float(v), table, lengths, skip=(1,))
    check_out(as_float(out[[0, 2]]), ref[0][[0, 2]])


def test_float32_out_holds_the_unrounded_reference():
    rng = np.random.default_rng(16)
    q, k, v, table, lengths = paged_case(rng, (50, 9))
    out = np.empty(q.shape, np.float32)
    mlakit.gqa_decode(q, k, v, table, lengths, out=out)
    ref, _ = gqa_reference(q, as_float(k), as_float(v), table, lengths)
    np.testing.assert_allclose(out, ref, rtol=1e-6, atol=1e-7)


def test_ml_dtypes_arrays():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(17)
    q, k, v, table, lengths = paged_case(rng, (12, 30))
    bf16 = ml_dtypes.bfloat16
    out = mlakit.gqa_decode(q.view(bf16), k.view(bf16), v.view(bf16), table, lengths)
    assert out.dtype == bf16
    check(out.view(np.uint16), gqa_reference(q, as_float(k), as_float(v), table, lengths))
    k0 = cast(np.nan_to_num(as_float(k)), np.uint16).view(bf16)
    values, scale = mlakit.quantize_gqa_cache(k0, "fp8")
    assert values.dtype == ml_dtypes.float8_e4m3fn
    np.testing.assert_array_equal(E4M3[values.view(np.uint8)], values.astype(np.float64))  # our decoder = ml_dtypes'
    a = mlakit.gqa_decode(q.view(bf16), values, values, table, lengths, k_scale=scale, v_scale=scale)
    b = mlakit.gqa_decode(q.view(bf16), values.view(np.uint8), values.view(np.uint8), table, lengths, k_scale=scale,
                          v_scale=scale)
    np.testing.assert_array_equal(a.view(np.uint16), b.view(np.uint16))
    assert mlakit.dequantize_gqa_cache(values, scale).dtype == bf16


def test_host_plan_holds_the_problem():
    lengths = np.array([3, 4], np.int32)
    workspace, plan = mlakit.gqa_decode_plan(lengths, 2, 8, 2, 128, causal=True, window=16)
    assert workspace.size == 0
    assert (plan.b, plan.s_q, plan.h_q, plan.h_kv, plan.d, plan.causal, plan.window) == (2, 2, 8, 2, 128, True, 16)
    assert plan.kernel == "reference" and plan.device == -1
    rng = np.random.default_rng(18)
    q, k, v, table, lengths = paged_case(rng, (3, 4), s_q=2)
    plan = mlakit.gqa_decode_plan(lengths, 2, 8, 2, 64, causal=True)
    check(mlakit.gqa_decode(q, k, v, table, lengths, causal=True, plan=plan),
          gqa_reference(q, as_float(k), as_float(v), table, lengths, causal=True))


# ----------------------------------------------------------------------------------------
# Errors.


def _args():
    q, k, v, table, lengths = paged_case(np.random.default_rng(20), (9, 20))
    return dict(q=q, k_cache=k, v_cache=v, block_table=table, cache_seqlens=lengths)


def test_library_errors_name_the_argument():
    a = _args()
    with pytest.raises(ValueError, match=r"gqa_decode: q\.shape\[3\] \(d\): expected 64, 128 or 256, got 96"):
        mlakit.gqa_decode(**dict(a, q=np.zeros((2, 1, 8, 96), np.uint16)))
    with pytest.raises(ValueError, match=r"h_q % h_kv: expected 0.*h_q = 5, h_kv = 2"):
        mlakit.gqa_decode(**dict(a, q=a["q"][:, :, :5].copy()))
    with pytest.raises(ValueError, match=r"k_cache\.scale: expected a float32 tensor \(a int8 cache|k_cache\.scale"):
        mlakit.gqa_decode(**dict(a, k_cache=np.zeros(a["k_cache"].shape, np.int8), v_cache=np.zeros(a["k_cache"].shape, np.int8)))
    with pytest.raises(ValueError, match=r"cache_seqlens\[1\]: expected <= max_blocks_per_seq \* page_size"):
        mlakit.gqa_decode(**dict(a, cache_seqlens=np.array([9, 1000], np.int32)))
    with pytest.raises(ValueError, match=r"rope\.rotary_dim: expected 0 \(the head dim\) or an even value"):
        mlakit.gqa_decode(**a, rope_style="neox", rotary_dim=3)
    with pytest.raises(ValueError, match=r"softmax_scale: expected a finite value"):
        mlakit.gqa_decode(**a, softmax_scale=math.nan)
    with pytest.raises(ValueError, match=r"window: expected >= 0"):
        mlakit.gqa_decode(**a, window=-1)
    k_new = np.zeros((2, 1, 2, 64), np.uint16)
    with pytest.raises(ValueError, match=r"v_new: expected a tensor \(k_new is given"):
        mlakit.gqa_decode(**a, k_new=k_new)
    table = a["block_table"].copy()
    table[1, 0] = table[0, 0]  # entry 1's new token lands on entry 0's slot
    with pytest.raises(ValueError, match=r"expected distinct cache slots"):
        mlakit.gqa_decode(**dict(a, block_table=table, cache_seqlens=np.array([1, 1], np.int32)), k_new=k_new,
                          v_new=k_new)


def test_python_checks_name_the_argument():
    a = _args()
    with pytest.raises(TypeError, match=r"^gqa_decode: k_cache: expected an array .*got None"):
        mlakit.gqa_decode(**dict(a, k_cache=None))
    with pytest.raises(ValueError, match=r"^gqa_decode: q: expected a 4-d array \[b, s_q, h_q, d\], got shape \(2, 1, 8\)"):
        mlakit.gqa_decode(**dict(a, q=a["q"][..., 0]))
    with pytest.raises(ValueError, match=r"^gqa_decode: rope_style: expected 'neox' or 'gptj' or 'none', got 'rope'"):
        mlakit.gqa_decode(**a, rope_style="rope")
    with pytest.raises(TypeError, match=r"^gqa_decode: rope_theta: expected a float, got str"):
        mlakit.gqa_decode(**a, rope_style="neox", rope_theta="1e4")
    with pytest.raises(TypeError, match=r"^gqa_decode: softcap: expected a float, got None"):
        mlakit.gqa_decode(**a, softcap=None)
    with pytest.raises(TypeError, match=r"^gqa_decode: rotary_dim: expected an int, got float"):
        mlakit.gqa_decode(**a, rotary_dim=64.0)
    with pytest.raises(TypeError, match=r"^gqa_decode: return_lse: expected a bool, got int"):
        mlakit.gqa_decode(**a, return_lse=1)
    with pytest.raises(TypeError, match=r"^gqa_decode: k_scale: expected None, a float or a float32 array"):
        mlakit.gqa_decode(**a, k_scale="0.1")
    with pytest.raises(ValueError, match=r"^gqa_decode: k_scale: expected a float32 array .* got shape \(2, 2\)"):
        mlakit.gqa_decode(**a, k_scale=np.ones((2, 2), np.float32))
    with pytest.raises(TypeError, match=r"^gqa_decode: plan: expected None or the \(workspace, plan\) pair"):
        mlakit.gqa_decode(**a, plan=mlakit.gqa_decode_plan(a["cache_seqlens"], 1, 8, 2, 64)[1])
    with pytest.raises(TypeError, match=r"^gqa_decode: plan: expected None or the \(workspace, plan\) pair"):
        mlakit.gqa_decode(**a, plan=mlakit.mla_decode_plan(a["cache_seqlens"], 1, 8, 2))
    with pytest.raises(ValueError, match=r"^gqa_decode: out: expected a 4-d array"):
        mlakit.gqa_decode(**a, out=np.zeros((2, 8, 64), np.uint16))
    read_only = a["k_cache"].copy()
    read_only.setflags(write=False)
    mlakit.gqa_decode(**dict(a, k_cache=read_only))  # read only: fine without an append
    k_new = np.zeros((2, 1, 2, 64), np.uint16)
    with pytest.raises(ValueError, match=r"^gqa_decode: k_cache: expected a writable array"):
        mlakit.gqa_decode(**dict(a, k_cache=read_only), k_new=k_new, v_new=k_new)
    with pytest.raises(TypeError, match=r"^gqa_decode_plan: d: expected an int, got str"):
        mlakit.gqa_decode_plan(a["cache_seqlens"], 1, 8, 2, "64")
    with pytest.raises(TypeError, match=r"^gqa_decode_plan: causal: expected a bool"):
        mlakit.gqa_decode_plan(a["cache_seqlens"], 1, 8, 2, 64, causal="no")


def test_dtypes_the_extension_cannot_read_name_the_function_and_argument():
    a = _args()
    with pytest.raises(TypeError, match=r"^gqa_decode: q: unsupported dtype"):
        mlakit.gqa_decode(**dict(a, q=a["q"].astype(np.float64)))
    with pytest.raises(TypeError, match=r"^quantize_gqa_cache: src: unsupported dtype"):
        mlakit.quantize_gqa_cache(np.zeros((1, 16, 2, 64)), "int8")
    with pytest.raises(ValueError, match=r"q\.dtype: expected"):
        mlakit.gqa_decode(**dict(a, q=a["q"].astype(np.float32)))


def test_float8_flavours_other_than_e4m3fn_are_refused():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    a = _args()
    k = np.zeros(a["k_cache"].shape, ml_dtypes.float8_e5m2)
    with pytest.raises(TypeError, match=r"^gqa_decode: k_cache: expected .*float8_e4m3fn.*got float8_e5m2"):
        mlakit.gqa_decode(**dict(a, k_cache=k, v_cache=k))


def test_cache_tools_name_their_arguments():
    a = _args()
    k = np.nan_to_num(as_float(a["k_cache"]))
    k16 = cast(k, np.uint16)
    with pytest.raises(ValueError, match=r"^quantize_gqa_cache: dtype: expected 'int8' or 'fp8', got 'int4'"):
        mlakit.quantize_gqa_cache(k16, "int4")
    with pytest.raises(ValueError, match=r"^quantize_gqa_cache: scale: expected None for int8"):
        mlakit.quantize_gqa_cache(k16, "int8", scale=0.1)
    with pytest.raises(ValueError, match=r"^quantize_gqa_cache: src: expected a 4-d array"):
        mlakit.quantize_gqa_cache(k16[0], "int8")
    with pytest.raises(TypeError, match=r"^dequantize_gqa_cache: scale: expected a float or a float32 array"):
        mlakit.dequantize_gqa_cache(np.zeros(k.shape, np.int8), None)
    with pytest.raises(ValueError, match=r"^dequantize_gqa_cache: dtype: expected 'bfloat16' or 'float16'"):
        mlakit.dequantize_gqa_cache(np.zeros(k.shape, np.int8), np.ones(k.shape[:3], np.float32), dtype="float32")
    values, scale = mlakit.quantize_gqa_cache(k16, "int8")
    read_only = values.copy()
    read_only.setflags(write=False)
    new = np.zeros((2, 1, 2, 64), np.uint16)
    with pytest.raises(ValueError, match=r"^gqa_cache_append: k_cache: expected a writable array"):
        mlakit.gqa_cache_append(new, new, read_only, values, a["block_table"], a["cache_seqlens"], k_scale=scale,
                                v_scale=scale.copy())
    with pytest.raises(TypeError, match=r"^gqa_cache_append: finished: expected an array .*got list"):
        mlakit.gqa_cache_append(new, new, values, values.copy(), a["block_table"], a["cache_seqlens"], k_scale=scale,
                                v_scale=scale.copy(), finished=[0, 1])


# ----------------------------------------------------------------------------------------
# Empty inputs.


@pytest.mark.parametrize("b, s_q, h_q", [(0, 1, 8), (2, 0, 8), (2, 1, 0)])
def test_no_query_rows(b, s_q, h_q):
    _, k, v, table, lengths = paged_case(np.random.default_rng(30), (7, 12))
    q = np.zeros((b, s_q, h_q, 64), np.uint16)
    plan = mlakit.gqa_decode_plan(lengths[:b], s_q, h_q, 2, 64)
    out, lse = mlakit.gqa_decode(q, k, v, table[:b], lengths[:b], return_lse=True, plan=plan)
    assert out.shape == (b, s_q, h_q, 64) and lse.shape == (b, h_q, s_q) and out.size == lse.size == 0


def test_no_cache_blocks():
    q = to_bf16(np.random.default_rng(31).standard_normal((2, 1, 4, 64)))
    k = np.zeros((0, 16, 2, 64), np.uint16)
    out, lse = mlakit.gqa_decode(q, k, k.copy(), np.zeros((2, 0), np.int32), np.zeros(2, np.int32), return_lse=True)
    assert out.size > 0 and np.all(out == 0) and np.all(np.isposinf(lse))


def test_converting_no_rows():
    src = np.zeros((0, 16, 2, 64), np.uint16)
    values, scale = mlakit.quantize_gqa_cache(src, "int8")
    assert values.shape == src.shape and scale.shape == (0, 16, 2)
    assert mlakit.dequantize_gqa_cache(values, scale).shape == src.shape


# ----------------------------------------------------------------------------------------
# docs/python.md's example, on CPU tensors (the same calls run the CPU reference).


def test_the_docs_example_runs_on_host_tensors():
    torch = pytest.importorskip("torch")
    import os

    path = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "python.md")
    with open(path) as f:
        text = f.read()
    code = text.split("\n## GQA decode\n", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    assert 'device = "cuda"' in code
    scope = {}
    exec(code.replace('device = "cuda"', 'device = "cpu"'), scope)
    out, lse, q = scope["out"], scope["lse"], scope["q"]
    assert out.shape == (4, 1, 32, 128) and out.dtype == torch.bfloat16 and lse.shape == (4, 32, 1)
    # The last layer against the NumPy implementation, over the caches as the appends left them.
    k = dequantized(scope["k_int8"].numpy(), scope["k_scale"].numpy())
    v = dequantized(scope["v_int8"].numpy(), scope["v_scale"].numpy())
    ref = gqa_reference(q.float().numpy(), k, v, scope["block_table"].numpy(), scope["cache_seqlens"].numpy(),
                        rope_style="neox", q_dtype=np.uint16)
    check((out.float().numpy(), lse.numpy()), ref)
