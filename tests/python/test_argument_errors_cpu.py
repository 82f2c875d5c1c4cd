"""Wrong arguments get an error naming them, before anything is allocated (issue 23, item 4):
None, lists, wrong ranks, strings, big-endian and non-numeric arrays, read-only outputs,
NaN / infinite scales, sizes the library would have narrowed. Never a generic TypeError of
the extension, an IndexError, an AttributeError or a MemoryError."""

import math

import numpy as np
import pytest

import mlakit
from mlakit import flash_mla
from numpy_cases import D_QK, activations, fp8_cache_case, paged_case, sparse_indices, to_bf16


def _decode_args():
    q, kv, table, lengths = paged_case(np.random.default_rng(20), (20, 5), h_q=4)
    return {"q": q, "kv_cache": kv, "block_table": table, "cache_seqlens": lengths}


def _sparse_args():
    rng = np.random.default_rng(21)
    _, cache = fp8_cache_case(rng)
    q = to_bf16(activations(rng, (2, 1, 4, D_QK)))
    indices = sparse_indices(rng, 2, 1, 16, cache.shape[0] * cache.shape[1])
    return {"q": q, "kv_cache": cache, "indices": indices}


def _prefill_args():
    rng = np.random.default_rng(22)
    q = to_bf16(activations(rng, (2, 16, D_QK)))
    kv = to_bf16(activations(rng, (8, 1, D_QK)) / 10)
    return {"q": q, "kv": kv, "indices": rng.integers(-1, 8, size=(2, 1, 64)).astype(np.int32)}


def _gqa_args():
    rng = np.random.default_rng(24)
    q = to_bf16(activations(rng, (2, 1, 8, 64)))
    k = to_bf16(activations(rng, (4, 16, 2, 64)) / 10)
    table = np.array([[0, 1], [2, 3]], np.int32)
    return {"q": q, "k_cache": k, "v_cache": k.copy(), "block_table": table, "cache_seqlens": np.array([5, 20], np.int32)}


def _flash_decode(**args):
    meta, _ = flash_mla.get_mla_metadata()
    k = dict(args)
    return flash_mla.flash_mla_with_kvcache(
        k["q"], k["kv_cache"], k["block_table"], k["cache_seqlens"], 512, meta
    )


def _flash_prefill(**args):
    return flash_mla.flash_mla_sparse_fwd(args["q"], args["kv"], args["indices"], 0.1)


# (function name, call, valid arguments, the name each argument has in messages)
CALLS = [
    ("mla_decode", lambda **a: mlakit.mla_decode(**a), _decode_args, {}),
    ("mla_sparse_decode", lambda **a: mlakit.mla_sparse_decode(**a), _sparse_args, {}),
    ("mla_sparse_prefill", lambda **a: mlakit.mla_sparse_prefill(**a), _prefill_args, {}),
    ("gqa_decode", lambda **a: mlakit.gqa_decode(**a), _gqa_args, {}),
    ("flash_mla_with_kvcache", _flash_decode, _decode_args, {"kv_cache": "k_cache"}),
    ("flash_mla_sparse_fwd", _flash_prefill, _prefill_args, {}),
]

# What a caller may pass by mistake, and the error it must get.
WRONG = [
    ("None", lambda x: None, TypeError, r"expected an array \(NumPy.*got None"),
    ("list", lambda x: x.tolist(), TypeError, "expected an array .*got list"),
    ("string", lambda x: "q", TypeError, "expected an array .*got str"),
    ("rank_0", lambda x: x.reshape(-1)[0:1].reshape(()), ValueError, r"expected a \d-d array \[.*\], got shape \(\)"),
    ("one_more_dim", lambda x: x[None], ValueError, r"expected a \d-d array \[.*\], got shape \(1, "),
    ("big_endian", lambda x: x.astype(x.dtype.newbyteorder(">")), TypeError, "expected an array in the machine's byte order, got dtype >"),
    ("objects", lambda x: x.astype(object), TypeError, "expected a numeric array, got dtype object"),
]


@pytest.mark.parametrize("wrong", WRONG, ids=[w[0] for w in WRONG])
@pytest.mark.parametrize("call", CALLS, ids=[c[0] for c in CALLS])
def test_every_array_argument_names_itself_in_its_error(call, wrong):
    op, run, make_args, renamed = call
    kind, transform, error, pattern = wrong
    for name in make_args():
        args = make_args()
        if kind == "big_endian" and args[name].dtype.itemsize == 1:
            continue  # bytes have no byte order
        args[name] = transform(args[name])
        shown = renamed.get(name, name)
        with pytest.raises(error, match=rf"^{op}: {shown}: {pattern}"):
            run(**args)


def test_a_rank_3_q_is_a_rank_error_not_a_144_gib_allocation():
    args = _decode_args()
    args["q"] = np.broadcast_to(np.zeros(1, np.float16), (64, 4096, 576))  # no memory behind it
    with pytest.raises(ValueError) as e:
        mlakit.mla_decode(**args)
    assert str(e.value) == "mla_decode: q: expected a 4-d array [b, s_q, h_q, d_qk], got shape (64, 4096, 576)"


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_nan_or_infinite_scale_is_an_error_naming_it(bad):
    with pytest.raises(ValueError, match=r"mla_decode: softmax_scale: expected a finite value"):
        mlakit.mla_decode(**_decode_args(), softmax_scale=bad)
    with pytest.raises(ValueError, match=r"mla_sparse_decode_fp8: softmax_scale: expected a finite value"):
        mlakit.mla_sparse_decode(**_sparse_args(), softmax_scale=bad)
    with pytest.raises(ValueError, match=r"mla_sparse_prefill: sm_scale: expected a finite value"):
        mlakit.mla_sparse_prefill(**_prefill_args(), sm_scale=bad)
    p = _prefill_args()
    with pytest.raises(ValueError, match=r"sm_scale: expected a finite value"):
        flash_mla.flash_mla_sparse_fwd(p["q"], p["kv"], p["indices"], bad)


@pytest.mark.parametrize("bad", ["0.1", b"0.1", True, [0.1]])
def test_a_scale_of_another_type_is_a_type_error_naming_it(bad):
    with pytest.raises(TypeError, match=r"^mla_decode: softmax_scale: expected a float or None, got "):
        mlakit.mla_decode(**_decode_args(), softmax_scale=bad)
    with pytest.raises(TypeError, match=r"^mla_sparse_prefill: sm_scale: expected a float or None"):
        mlakit.mla_sparse_prefill(**_prefill_args(), sm_scale=bad)
    with pytest.raises(TypeError, match=r"^flash_mla_with_kvcache: softmax_scale: expected a float or None"):
        a = _decode_args()
        flash_mla.flash_mla_with_kvcache(
            a["q"], a["kv_cache"], a["block_table"], a["cache_seqlens"], 512, flash_mla.get_mla_metadata()[0],
            softmax_scale=bad,
        )


def test_numbers_of_other_types_are_scales():
    _, lse_float = mlakit.mla_decode(**_decode_args(), softmax_scale=0.25)
    _, lse_numpy = mlakit.mla_decode(**_decode_args(), softmax_scale=np.float32(0.25))
    np.testing.assert_array_equal(lse_float, lse_numpy)


def test_scalars_of_the_wrong_type_name_themselves():
    lengths = np.array([3, 4], np.int32)
    with pytest.raises(TypeError, match=r"^mla_decode_plan: s_q: expected an int, got str"):
        mlakit.mla_decode_plan(lengths, "1", 16)
    with pytest.raises(TypeError, match=r"^mla_decode_plan: h_q: expected an int, got float"):
        mlakit.mla_decode_plan(lengths, 1, 16.0)
    with pytest.raises(ValueError, match=r"^mla_decode_plan: h_kv: expected an int in \[-2\^31, 2\^31 - 1\]"):
        mlakit.mla_decode_plan(lengths, 1, 16, 2**40)
    with pytest.raises(TypeError, match=r"^mla_decode_plan: kernel: expected 'auto' or 'portable' or 'sm90', got int"):
        mlakit.mla_decode_plan(lengths, 1, 16, 1, 90)
    with pytest.raises(TypeError, match=r"^mla_decode: causal: expected a bool, got str"):
        mlakit.mla_decode(**_decode_args(), causal="yes")
    with pytest.raises(TypeError, match=r"^mla_decode: plan: expected None or the \(workspace, plan\) pair"):
        mlakit.mla_decode(**_decode_args(), plan=mlakit.mla_decode_plan(lengths, 1, 4)[1])
    with pytest.raises(TypeError, match=r"^mla_sparse_prefill: d_v: expected an int, got str"):
        mlakit.mla_sparse_prefill(**_prefill_args(), d_v="512")
    with pytest.raises(ValueError, match=r"^mla_sparse_prefill: d_v: expected <= d_qk = 576 .*got 4096"):
        mlakit.mla_sparse_prefill(**_prefill_args(), d_v=4096)  # out would be 8x q: refused before allocating
    with pytest.raises(TypeError, match=r"^mla_sparse_prefill: lse_base: expected '2' or 'e', got int"):
        mlakit.mla_sparse_prefill(**_prefill_args(), lse_base=2)
    with pytest.raises(TypeError, match=r"^flash_mla_with_kvcache: head_dim_v: expected an int, got NoneType"):
        a = _decode_args()
        flash_mla.flash_mla_with_kvcache(a["q"], a["kv_cache"], a["block_table"], a["cache_seqlens"], None, None)
    with pytest.raises(TypeError, match=r"^get_mla_metadata: num_heads_k: expected an int, got str"):
        flash_mla.get_mla_metadata(lengths, 16, "1")


def test_the_fp8_tools_name_their_arguments():
    rng = np.random.default_rng(23)
    kv, cache = fp8_cache_case(rng)
    tokens = kv.reshape(-1, D_QK)[:3].copy()
    slots = np.array([0, 5, -1], np.int32)
    with pytest.raises(TypeError, match=r"^quantize_fp8_cache: kv: expected an array .*got None"):
        mlakit.quantize_fp8_cache(None)
    with pytest.raises(ValueError, match=r"^dequantize_fp8_cache: cache: expected an array \[\.\.\., 656\] of rank >= 1"):
        mlakit.dequantize_fp8_cache(cache.reshape(-1)[0:1].reshape(()))
    with pytest.raises(TypeError, match=r"^append_fp8_cache: slots: expected an array .*got list"):
        mlakit.append_fp8_cache(tokens, [0, 5, -1], cache)
    read_only = cache.copy()
    read_only.setflags(write=False)
    with pytest.raises(ValueError, match=r"^append_fp8_cache: cache: expected a writable array"):
        mlakit.append_fp8_cache(tokens, slots, read_only)
    # The cache written over the tokens it receives (a view of the same bytes).
    shared = cache.copy()
    overlapping_tokens = shared.reshape(-1)[: 3 * D_QK * 2].view(np.uint16).reshape(3, D_QK)
    with pytest.raises(ValueError, match=r"cache: expected memory disjoint from tokens"):
        mlakit.append_fp8_cache(overlapping_tokens, slots, shared)


def test_sizes_beyond_int_are_refused_not_narrowed():
    """Zero-size arrays may have any sizes: the library once read q.shape[2] = 2^32 + 576 of
    the sparse prefill as d_qk 576 and q.shape[1] = 2^32 + 1 of the sparse decode as s_q 1."""
    p = _prefill_args()
    p["q"] = np.zeros((0, 16, 2**32 + 576), np.uint16)
    with pytest.raises(ValueError, match=r"q\.shape\[2\] \(d_qk\): dimension too large: expected <= 2\^31 - 1"):
        mlakit.mla_sparse_prefill(**p)
    s = _sparse_args()
    s["q"] = np.zeros((0, 2**32 + 1, 4, D_QK), np.uint16)
    with pytest.raises(ValueError, match=r"q\.shape\[1\] \(s_q\): dimension too large"):
        mlakit.mla_sparse_decode(**s)
