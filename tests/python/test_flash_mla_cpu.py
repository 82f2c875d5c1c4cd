"""mlakit.flash_mla on host (NumPy) arrays: FlashMLA's API (names, defaults, shapes, both
metadata forms), its checks and the arguments mlakit does not honour. Host arrays run the
CPU reference, so results are compared with the NumPy reference."""

import importlib.util
import pathlib

import numpy as np
import pytest

import mlakit
from accuracy import check_out, check_stat
from mlakit import flash_mla
from numpy_cases import (
    D_QK,
    activations,
    as_float,
    cache_values,
    dense_reference,
    fp8_cache_case,
    paged_case,
    sparse_decode_reference,
    sparse_prefill_reference,
    sparse_indices,
    to_bf16,
)


def test_zero_argument_metadata_is_an_unfilled_object():
    meta, none = flash_mla.get_mla_metadata()
    assert none is None
    assert isinstance(meta, flash_mla.FlashMLASchedMeta) and not meta.have_initialized


def test_metadata_arrays_on_the_host_have_flash_mla_shapes():
    tile_scheduler_metadata, num_splits = flash_mla.get_mla_metadata(np.array([5, 9, 0], dtype=np.int32), 128, 1)
    assert tile_scheduler_metadata.dtype == np.int32 and tile_scheduler_metadata.shape[1] == 8
    assert num_splits.dtype == np.int32 and num_splits.shape == (4,)


@pytest.mark.parametrize("form", ["object", "arrays"])
@pytest.mark.parametrize("causal", [False, True])
def test_dense_decode_matches_the_reference(form, causal):
    rng = np.random.default_rng(10)
    q, kv, table, lengths = paged_case(rng, (30, 3, 0), s_q=2, h_q=8, dtype=np.uint16)
    if form == "object":
        meta, num_splits = flash_mla.get_mla_metadata()
    else:
        meta, num_splits = flash_mla.get_mla_metadata(lengths, 2 * 8, 1)
    out, lse = flash_mla.flash_mla_with_kvcache(q, kv, table, lengths, 512, meta, num_splits, causal=causal)
    assert out.shape == (3, 2, 8, 512) and out.dtype == q.dtype and lse.shape == (3, 8, 2)
    ref_out, ref_lse = dense_reference(q, kv, table, lengths, causal=causal)
    check_out(as_float(out), ref_out)
    check_stat(lse, ref_lse)
    if form == "object":
        assert meta.have_initialized and meta.config.h_q == 8 and meta.config.causal == causal


def test_sparse_fp8_decode_matches_the_reference():
    rng = np.random.default_rng(11)
    b, s_q, h_q, topk = 2, 2, 16, 32
    kv, cache = fp8_cache_case(rng)
    q = to_bf16(activations(rng, (b, s_q, h_q, D_QK)))
    indices = sparse_indices(rng, b, s_q, topk, kv.shape[0] * kv.shape[1])
    lengths = np.zeros(b, dtype=np.int32)  # not used by the sparse decode
    meta, _ = flash_mla.get_mla_metadata()
    out, lse = flash_mla.flash_mla_with_kvcache(
        q, cache, None, lengths, 512, meta, softmax_scale=0.05, is_fp8_kvcache=True, indices=indices
    )
    ref_out, ref_lse = sparse_decode_reference(q, mlakit.dequantize_fp8_cache(cache), indices, 0.05)
    check_out(as_float(out), ref_out)
    check_stat(lse, ref_lse)
    assert meta.config.topk == topk and meta.config.is_fp8_kvcache


def _prefill_case(rng):
    q = to_bf16(activations(rng, (4, 16, D_QK)))
    kv = to_bf16(cache_values(rng, (12, 1, D_QK)))
    indices = rng.integers(-1, 12, size=(4, 1, 64)).astype(np.int32)
    indices[2] = -1  # a token with no valid index: 0, -inf, +inf
    return q, kv, indices


def test_sparse_prefill_returns_natural_log_statistics_like_flash_mla():
    """docs/contract.md, drop-in: the FlashMLA that engines run on Hopper returns natural-log max_logits and lse."""
    q, kv, indices = _prefill_case(np.random.default_rng(12))
    out, max_logits, lse = flash_mla.flash_mla_sparse_fwd(q, kv, indices, 0.04)
    ref_out, ref_max, ref_lse = sparse_prefill_reference(q, kv, indices, 0.04, natural=True)
    check_out(as_float(out), ref_out)
    check_stat(max_logits, ref_max, "max_logits")
    check_stat(lse, ref_lse)
    assert np.all(max_logits[2] == -np.inf) and np.all(lse[2] == np.inf) and np.all(out[2] == 0)
    # The same computation as mlakit's own prefill with natural-log statistics.
    for a, b in zip((out, max_logits, lse), mlakit.mla_sparse_prefill(q, kv, indices, 0.04, lse_base="e")):
        np.testing.assert_array_equal(a, b)


def test_sparse_prefill_base2_is_one_explicit_keyword():
    q, kv, indices = _prefill_case(np.random.default_rng(16))
    ours = flash_mla.flash_mla_sparse_fwd(q, kv, indices, 0.04, lse_base="2")
    for a, b in zip(ours, mlakit.mla_sparse_prefill(q, kv, indices, 0.04, lse_base="2")):
        np.testing.assert_array_equal(a, b)
    ref_max, ref_lse = sparse_prefill_reference(q, kv, indices, 0.04)[1:]
    check_stat(ours[1], ref_max, "max_logits")
    check_stat(ours[2], ref_lse)
    with pytest.raises(TypeError):  # keyword only: no FlashMLA call passes it by position
        flash_mla.flash_mla_sparse_fwd(q, kv, indices, 0.04, 512, None, None, 0, "2")
    with pytest.raises(ValueError, match=r"flash_mla_sparse_fwd: lse_base: expected '2' or 'e', got '10'"):
        flash_mla.flash_mla_sparse_fwd(q, kv, indices, 0.04, lse_base="10")


def test_a_flash_mla_decoding_loop_matches_the_reference():
    """Metadata once per step, flash_mla_with_kvcache per layer; each step appends s_q new
    tokens to every sequence (the cache of every layer), as a serving engine does."""
    rng = np.random.default_rng(13)
    layers, s_q, h_q, page = 3, 2, 8, 16
    q0, kv, table, lengths = paged_case(rng, (40, 17), s_q=s_q, h_q=h_q, page=page, dtype=np.uint16)
    caches = [kv.copy() for _ in range(layers)]
    for step in range(3):
        lengths = lengths + s_q
        for cache in caches:
            for i, n in enumerate(lengths):
                for pos in range(n - s_q, n):
                    cache[table[i, pos // page], pos % page] = to_bf16(cache_values(rng, (1, D_QK)))
        # Both metadata forms, alternately.
        if step % 2:
            meta, num_splits = flash_mla.get_mla_metadata(lengths, s_q * h_q, 1)
        else:
            meta, num_splits = flash_mla.get_mla_metadata()
        for cache in caches:
            q = to_bf16(activations(rng, q0.shape))
            out, lse = flash_mla.flash_mla_with_kvcache(q, cache, table, lengths, 512, meta, num_splits, causal=True)
            ref_out, ref_lse = dense_reference(q, cache, table, lengths, causal=True)
            check_out(as_float(out), ref_out)
            check_stat(lse, ref_lse)


def test_a_scheduler_object_rejects_another_configuration():
    rng = np.random.default_rng(14)
    q, kv, table, lengths = paged_case(rng, (10,), h_q=8)
    meta, _ = flash_mla.get_mla_metadata()
    flash_mla.flash_mla_with_kvcache(q, kv, table, lengths, 512, meta)
    with pytest.raises(ValueError, match=r"config\.h_q: expected 8 \(the first call's\), got 4"):
        flash_mla.flash_mla_with_kvcache(q[:, :, :4].copy(), kv, table, lengths, 512, meta)
    with pytest.raises(ValueError, match=r"config\.causal"):
        flash_mla.flash_mla_with_kvcache(q, kv, table, lengths, 512, meta, causal=True)
    with pytest.raises(ValueError, match="num_splits: expected None"):
        flash_mla.flash_mla_with_kvcache(q, kv, table, lengths, 512, meta, np.zeros(2, np.int32))


def test_what_mlakit_does_not_honour_raises_clearly():
    rng = np.random.default_rng(15)
    q, kv, table, lengths = paged_case(rng, (10,), h_q=8)
    meta, _ = flash_mla.get_mla_metadata()
    call = flash_mla.flash_mla_with_kvcache
    with pytest.raises(ValueError, match=r"extra_k_cache: expected None for dense attention \(no indices\)"):
        call(q, kv, table, lengths, 512, meta, extra_k_cache=kv)
    with pytest.raises(NotImplementedError, match="dense decode over an FP8 cache"):
        call(q, kv, table, lengths, 512, meta, is_fp8_kvcache=True)
    with pytest.raises(NotImplementedError, match="sparse decode over a bf16 cache"):
        call(q, kv, table, lengths, 512, meta, indices=np.zeros((1, 1, 4), np.int32))
    with pytest.raises(NotImplementedError, match="dense decode over an FP8 cache"):
        flash_mla.get_mla_metadata(lengths, 8, 1, 8, is_fp8_kvcache=True)
    with pytest.raises(ValueError, match="head_dim_v: expected 512, got 576"):
        call(q, kv, table, lengths, 576, meta)
    with pytest.raises(ValueError, match="causal: expected False with indices"):
        call(q, kv, table, lengths, 512, meta, causal=True, is_fp8_kvcache=True, indices=np.zeros((1, 1, 4), np.int32))
    with pytest.raises(NotImplementedError, match="indexer_topk"):
        flash_mla.flash_mla_sparse_fwd(q[0], kv[0], np.zeros((1, 1, 64), np.int32), 0.1, indexer_topk=512)


def test_the_flash_mla_alias_package_re_exports_mlakit_flash_mla():
    """The alias is installed only on request; its source is loaded here under its name."""
    source = pathlib.Path(__file__).resolve().parents[2] / "python" / "flash_mla_alias" / "__init__.py"
    spec = importlib.util.spec_from_file_location("flash_mla", source)
    alias = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(alias)
    assert alias.MLAKIT_ALIAS
    for name in flash_mla.__all__:
        assert getattr(alias, name) is getattr(flash_mla, name)
