"""The sparse decode of DeepSeek V4 tokens (q d_qk 512 over the 584-byte cache) and with a
second cache, on host arrays (NumPy, PyTorch CPU tensors: the float64 CPU reference): against
the NumPy float64 decode of sparse_v4_cases.py over caches written byte by byte, the union
identity (a second cache holding part of one list gives the one-list result), the argument
errors, mlakit.flash_mla's extra_* arguments with FlashMLASchedMeta's configuration checks,
the schedules' second-cache rules, and torch.ops.mlakit.mla_sparse_decode with a second
cache (opcheck)."""

import numpy as np
import pytest

import mlakit
from accuracy import check_out, check_stat
from mlakit import _flash_mla_schedule as schedules
from mlakit import flash_mla
from numpy_cases import as_float
from sparse_v4_cases import (
    E4M3,
    V4_D_QK,
    V32_D_QK,
    indices_into,
    lengths,
    queries,
    reference,
    split_case,
    v4_block_stride,
    v4_cache,
    v32_cache,
)

LAYOUTS = {"v4": (v4_cache, V4_D_QK), "v32": (v32_cache, V32_D_QK)}


def check(out, lse, ref_out, ref_lse):
    check_out(as_float(np.asarray(out)), ref_out)
    check_stat(np.asarray(lse), ref_lse)


def test_the_e4m3_table_is_the_format():
    """The tests' own e4m3 decoding: spot values of the format, and ml_dtypes' where installed."""
    assert E4M3[0x00] == 0 and E4M3[0x01] == 2.0**-9 and E4M3[0x08] == 2.0**-6 and E4M3[0x38] == 1
    assert E4M3[0x7E] == 448 and E4M3[0xFE] == -448 and np.isnan(E4M3[0x7F]) and np.isnan(E4M3[0xFF])
    try:
        import ml_dtypes
    except ImportError:
        return
    theirs = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    np.testing.assert_array_equal(E4M3, theirs)


def test_the_v4_cases_read_like_mlakit_dequantize():
    """The byte layout written by sparse_v4_cases is the library's: its dequantizer gives the
    same keys (bf16-rounded) for every unpoisoned token."""
    rng = np.random.default_rng(40)
    cache = v4_cache(rng, 3, 6)
    back = as_float(mlakit.dequantize_fp8_v4_cache(cache.view)).reshape(-1, V4_D_QK)[: cache.valid_tokens]
    keys = cache.keys[: cache.valid_tokens]
    assert np.all(np.abs(back - keys) <= 2**-8 * np.abs(keys))  # one bf16 rounding


@pytest.mark.parametrize("layout", ["v4", "v32"])
@pytest.mark.parametrize("second", [False, True], ids=["one_cache", "two_caches"])
@pytest.mark.parametrize("options", [False, True], ids=["plain", "lengths+sink"])
def test_sparse_decode_matches_the_numpy_decode(layout, second, options):
    make, d_qk = LAYOUTS[layout]
    rng = np.random.default_rng(41 + 2 * second + options)
    b, s_q, h_q, topk, extra_topk = 3, 2, 8, 24, 10
    cache = make(rng, 5, 16)
    q = queries(rng, b, s_q, h_q, d_qk)
    idx = indices_into(rng, b, s_q, topk, cache)
    n = lengths(rng, b, topk) if options else None
    sink = rng.standard_normal(h_q).astype(np.float32) if options else None
    lists = [(cache, idx, n)]
    kwargs = {}
    if second:
        extra = make(rng, 4, 8)  # another page size
        extra_idx = indices_into(rng, b, s_q, extra_topk, extra)
        extra_n = lengths(rng, b, extra_topk) if options else None
        lists.append((extra, extra_idx, extra_n))
        kwargs = dict(extra_kv_cache=extra.view, extra_indices=extra_idx, extra_topk_length=extra_n)
    out, lse = mlakit.mla_sparse_decode(q, cache.view, idx, n, sink, **kwargs)
    assert out.shape == (b, s_q, h_q, 512) and out.dtype == np.uint16 and lse.shape == (b, h_q, s_q)
    ref_out, ref_lse = reference(q, lists, sink=sink)
    check(out, lse, ref_out, ref_lse)
    assert np.all(np.isposinf(lse[0, :, -1])) and np.all(out[0, -1] == 0)  # no valid index in any list
    # softmax_scale defaults to 1/sqrt(d_qk): 1/sqrt(512) for V4
    out2, lse2 = mlakit.mla_sparse_decode(q, cache.view, idx, n, sink, softmax_scale=0.03, **kwargs)
    check(out2, lse2, *reference(q, lists, scale=0.03, sink=sink))


def test_the_unpadded_v4_view_decodes_too():
    rng = np.random.default_rng(42)
    cache = v4_cache(rng, 4, 8, pad=False)
    assert cache.view.strides[0] == 8 * 584
    q = queries(rng, 2, 1, 4, V4_D_QK)
    idx = indices_into(rng, 2, 1, 16, cache)
    check(*mlakit.mla_sparse_decode(q, cache.view, idx), *reference(q, [(cache, idx, None)]))


@pytest.mark.parametrize("layout", ["v4", "v32"])
@pytest.mark.parametrize("with_lengths", [False, True])
def test_a_second_cache_holding_part_of_a_list_gives_the_one_list_result(layout, with_lengths):
    """Union under one softmax: the entries [cut:] of each row moved to a second cache of
    another page size (the tokens copied there, the slots remapped) give the same out and
    lse as the one list; so does the same cache passed twice with the list cut in two."""
    make, d_qk = LAYOUTS[layout]
    rng = np.random.default_rng(43 + with_lengths)
    b, s_q, h_q, topk, cut = 3, 2, 16, 32, 20
    cache = make(rng, 6, 16)
    q = queries(rng, b, s_q, h_q, d_qk)
    idx = indices_into(rng, b, s_q, topk, cache)
    n = np.array([topk, 25, 7], dtype=np.int32) if with_lengths else None
    sink = rng.standard_normal(h_q).astype(np.float32)
    one = mlakit.mla_sparse_decode(q, cache.view, idx, n, sink)
    first, first_n, other, second, second_n = split_case(rng, cache, idx, n, cut)
    two = mlakit.mla_sparse_decode(q, cache.view, first, first_n, sink, extra_kv_cache=other.view,
                                   extra_indices=second, extra_topk_length=second_n)
    same = mlakit.mla_sparse_decode(q, cache.view, first, first_n, sink, extra_kv_cache=cache.view,
                                    extra_indices=np.ascontiguousarray(idx[..., cut:]), extra_topk_length=second_n)
    for result in (two, same):
        # The float64 reference walks the first list, then the second: the same keys in the
        # same order as the one list, so the same sums and the same rounded results.
        np.testing.assert_array_equal(result[0], one[0])
        np.testing.assert_array_equal(result[1], one[1])
    check(*one, *reference(q, [(cache, idx, n)], sink=sink))


def _v4_args(rng, b=2, s_q=1, h_q=4, topk=8, extra_topk=4):
    cache = v4_cache(rng, 3, 8)
    extra = v4_cache(rng, 2, 16)
    return dict(
        q=queries(rng, b, s_q, h_q, V4_D_QK),
        kv_cache=cache.view,
        indices=indices_into(rng, b, s_q, topk, cache),
        extra_kv_cache=extra.view,
        extra_indices=indices_into(rng, b, s_q, extra_topk, extra),
        extra_topk_length=np.array([1, 4][:b], dtype=np.int32),
    )


def test_errors_name_the_second_cache_arguments():
    rng = np.random.default_rng(44)
    args = _v4_args(rng)
    run = mlakit.mla_sparse_decode

    def without(*names):
        return {k: v for k, v in args.items() if k not in names}

    with pytest.raises(ValueError, match=r"^mla_sparse_decode: extra_kv_cache: expected an array with extra_indices"):
        run(**without("extra_kv_cache"))
    with pytest.raises(ValueError, match=r"^mla_sparse_decode: extra_indices: expected an array with extra_kv_cache"):
        run(**without("extra_indices"))
    with pytest.raises(ValueError, match=r"^mla_sparse_decode: extra_topk_length: expected None without"):
        run(**without("extra_indices", "extra_kv_cache"))
    with pytest.raises(TypeError, match=r"^mla_sparse_decode: extra_indices: expected an array .*got list"):
        run(**dict(args, extra_indices=args["extra_indices"].tolist()))
    # Layouts: the second cache must be the first's (q's d_qk says which).
    v32 = v32_cache(rng, 2, 16)
    with pytest.raises(ValueError, match=r"extra_kv_cache\.shape\[3\] \(bytes per token\): expected 584.*got 656"):
        run(**dict(args, extra_kv_cache=v32.view))
    with pytest.raises(ValueError, match=r"kv_cache\.shape\[3\] \(bytes per token\): expected 656.*got 584"):
        run(**dict(args, q=queries(rng, 2, 1, 4, V32_D_QK)))
    with pytest.raises(ValueError, match=r"q\.shape\[3\] \(d_qk\): expected 576 .* or 512 .*got 448"):
        run(**dict(args, q=args["q"][..., :448].copy()))
    with pytest.raises(ValueError, match=r"extra_kv_cache\.stride\[1\]: expected 584"):
        run(**dict(args, extra_kv_cache=args["extra_kv_cache"][:, ::2]))
    with pytest.raises(ValueError, match=r"extra_indices\.shape\[0\] \(b\): expected 2"):
        run(**dict(args, extra_indices=args["extra_indices"][:1].copy()))
    with pytest.raises(ValueError, match=r"extra_indices\.dtype: expected int32"):
        run(**dict(args, extra_indices=args["extra_indices"].astype(np.float32)))
    with pytest.raises(ValueError, match=r"extra_topk_length\.shape\[0\] \(b\): expected 2"):
        run(**dict(args, extra_topk_length=np.zeros(3, np.int32)))


def test_host_plans_record_the_index_lists():
    like = np.zeros(1, np.int32)
    workspace, plan = mlakit.mla_sparse_decode_plan(2, 3, 8, 64, like, like, extra_topk=16)
    assert workspace.size == 0 and plan.kernel == "reference" and plan.b == 6 and plan.h_q == 8
    assert mlakit._mlakit.mla_sparse_decode_plan_lists(plan) == {
        "topk": 64, "topk_length": True, "extra_topk": 16, "extra_topk_length": False}
    again = mlakit.MlaDecodePlan.from_fields(plan.fields(), workspace)
    assert again.fields() == plan.fields()
    _, plan = mlakit.mla_sparse_decode_plan(2, 3, 8, 64, like, extra_topk_length=like)
    assert mlakit._mlakit.mla_sparse_decode_plan_lists(plan)["extra_topk_length"]
    with pytest.raises(TypeError, match="mla_sparse_decode_plan: extra_topk: expected an int"):
        mlakit.mla_sparse_decode_plan(2, 3, 8, 64, like, extra_topk=1.5)
    # Host arrays run the reference, which needs no plan: a plan is accepted and ignored.
    rng = np.random.default_rng(45)
    args = _v4_args(rng)
    with_plan = mlakit.mla_sparse_decode(**args, plan=mlakit.mla_sparse_decode_plan(2, 1, 4, 8, like, extra_topk=4))
    for a, b in zip(with_plan, mlakit.mla_sparse_decode(**args)):
        np.testing.assert_array_equal(a, b)


# ---- mlakit.flash_mla ------------------------------------------------------------------------


def _flash_case(rng, layout, b=2, s_q=2, h_q=16, topk=24, extra_topk=8):
    make, d_qk = LAYOUTS[layout]
    cache, extra = make(rng, 5, 16), make(rng, 3, 32)
    q = queries(rng, b, s_q, h_q, d_qk)
    idx = indices_into(rng, b, s_q, topk, cache)
    extra_idx = indices_into(rng, b, s_q, extra_topk, extra)
    return q, cache, idx, extra, extra_idx


@pytest.mark.parametrize("layout", ["v4", "v32"])
def test_flash_mla_with_kvcache_attends_to_both_caches(layout):
    rng = np.random.default_rng(46)
    q, cache, idx, extra, extra_idx = _flash_case(rng, layout)
    topk_length = np.array([24, 9], dtype=np.int32)
    extra_topk_length = np.array([3, 8], dtype=np.int32)
    sink = rng.standard_normal(16).astype(np.float32)
    meta, _ = flash_mla.get_mla_metadata()
    out, lse = flash_mla.flash_mla_with_kvcache(
        q, cache.view, None, None, 512, meta, is_fp8_kvcache=True, indices=idx, attn_sink=sink,
        extra_k_cache=extra.view, extra_indices_in_kvcache=extra_idx, topk_length=topk_length,
        extra_topk_length=extra_topk_length,
    )
    check(out, lse, *reference(q, [(cache, idx, topk_length), (extra, extra_idx, extra_topk_length)], sink=sink))
    c = meta.config
    assert (c.page_block_size, c.topk, c.extra_page_block_size, c.extra_topk) == (16, 24, 32, 8)
    # FlashMLA's default scale, q.shape[-1] ** -0.5, given explicitly: the same numbers.
    meta2, _ = flash_mla.get_mla_metadata()
    again = flash_mla.flash_mla_with_kvcache(
        q, cache.view, None, None, 512, meta2, None, q.shape[-1] ** -0.5, False, True, idx, sink, extra.view, extra_idx,
        topk_length, extra_topk_length,
    )
    for a, b in zip((out, lse), again):
        np.testing.assert_array_equal(a, b)


def test_flash_mla_without_a_second_cache_records_none():
    rng = np.random.default_rng(47)
    q, cache, idx, _, _ = _flash_case(rng, "v4")
    meta, _ = flash_mla.get_mla_metadata()
    out, lse = flash_mla.flash_mla_with_kvcache(q, cache.view, None, None, 512, meta, is_fp8_kvcache=True, indices=idx)
    check(out, lse, *reference(q, [(cache, idx, None)]))
    assert meta.config.extra_page_block_size is None and meta.config.extra_topk is None


def test_a_scheduler_object_rejects_another_second_cache():
    """FlashMLA's checks of later calls, in its order: extra_page_block_size, then extra_topk."""
    rng = np.random.default_rng(48)
    q, cache, idx, extra, extra_idx = _flash_case(rng, "v4")
    meta, _ = flash_mla.get_mla_metadata()

    def call(**kw):
        return flash_mla.flash_mla_with_kvcache(q, cache.view, None, None, 512, meta, is_fp8_kvcache=True,
                                                indices=idx, **kw)

    call(extra_k_cache=extra.view, extra_indices_in_kvcache=extra_idx)
    call(extra_k_cache=extra.view, extra_indices_in_kvcache=extra_idx)  # the same configuration: fine
    wider = np.concatenate([extra_idx, extra_idx], axis=-1)
    with pytest.raises(ValueError, match=r"config\.extra_topk: expected 8 \(the first call's\), got 16 "
                                         r"\(extra_indices_in_kvcache\.shape\[-1\]"):
        call(extra_k_cache=extra.view, extra_indices_in_kvcache=wider)
    with pytest.raises(ValueError, match=r"config\.extra_page_block_size: expected 32 \(the first call's\), got None"):
        call()
    other_page = v4_cache(rng, 2, 64)
    with pytest.raises(ValueError, match=r"config\.extra_page_block_size: expected 32 .*got 64"):
        call(extra_k_cache=other_page.view, extra_indices_in_kvcache=extra_idx)


def test_flash_mla_extra_argument_errors():
    rng = np.random.default_rng(49)
    q, cache, idx, extra, extra_idx = _flash_case(rng, "v4")
    meta, _ = flash_mla.get_mla_metadata()
    op = "flash_mla_with_kvcache"

    def call(**kw):
        return flash_mla.flash_mla_with_kvcache(q, cache.view, None, None, 512, meta, **kw)

    sparse = dict(is_fp8_kvcache=True, indices=idx)
    with pytest.raises(ValueError, match=rf"^{op}: extra_k_cache: expected an array with extra_indices_in_kvcache"):
        call(**sparse, extra_indices_in_kvcache=extra_idx)
    with pytest.raises(ValueError, match=rf"^{op}: extra_indices_in_kvcache: expected an array with extra_k_cache"):
        call(**sparse, extra_k_cache=extra.view)
    with pytest.raises(ValueError, match=rf"^{op}: extra_topk_length: expected None without extra_k_cache"):
        call(**sparse, extra_topk_length=np.ones(2, np.int32))
    with pytest.raises(ValueError, match=rf"^{op}: extra_k_cache, extra_indices_in_kvcache: expected None for dense"):
        call(extra_k_cache=extra.view, extra_indices_in_kvcache=extra_idx)
    assert not meta.have_initialized  # no call got as far as the configuration
    # The library's checks name its own arguments (extra_kv_cache for extra_k_cache).
    with pytest.raises(ValueError, match=r"extra_kv_cache\.shape\[3\] \(bytes per token\): expected 584, got 656"):
        call(**sparse, extra_k_cache=v32_cache(rng, 2, 16).view, extra_indices_in_kvcache=extra_idx)


def _sparse_schedule(topk=64, extra_topk=0, from_args=False, **lengths):
    like = np.zeros(1, np.int32)
    workspace, plan = mlakit.mla_sparse_decode_plan(2, 1, 8, topk, like, extra_topk=extra_topk)
    return schedules.Schedule(workspace, plan, schedules.KeyLists(topk, extra_topk=extra_topk, **lengths), from_args)


def test_schedules_serve_only_their_second_cache():
    """The schedule behind the metadata (device arrays make one; here a host plan stands in)
    checks a call's index lists as the library's plan would: extra_topk, extra_topk_length."""
    q = np.zeros((2, 1, 8, 512), np.uint16)
    lists = schedules.KeyLists
    made = _sparse_schedule(extra_topk=16, has_extra_topk_length=True)
    assert made.plan_for(q, lists(64, extra_topk=16, has_extra_topk_length=True)) is made.plan
    with pytest.raises(ValueError, match=r"extra_indices_in_kvcache\.shape\[-1\] \(extra_topk\): expected 16 "
                                         r"\(the schedule's\), got 8"):
        made.plan_for(q, lists(64, extra_topk=8, has_extra_topk_length=True))
    with pytest.raises(ValueError, match=r"expected 16 \(the schedule's\), got no second cache"):
        made.plan_for(q, lists(64))
    with pytest.raises(ValueError, match=r"extra_topk_length: the schedule was made with extra_topk_length"):
        made.plan_for(q, lists(64, extra_topk=16))
    # get_mla_metadata(*args) has no extra arguments: its schedules serve calls without a second cache.
    from_args = _sparse_schedule(from_args=True)
    assert from_args.plan_for(q, lists(64)) is from_args.plan
    with pytest.raises(ValueError, match=r"extra_indices_in_kvcache: the schedule was made without a second cache.*"
                                         r"get_mla_metadata\(\*args\) has no extra arguments"):
        from_args.plan_for(q, lists(64, extra_topk=4))
    with pytest.raises(ValueError, match=r"topk_length: the schedule was made without topk_length.*"
                                         r"get_mla_metadata\(\*args\) cannot know it"):
        from_args.plan_for(q, lists(64, has_topk_length=True))
    with pytest.raises(ValueError, match=r"made for sparse attention, used for dense"):
        from_args.plan_for(q, lists(None))


def test_pytorch_cpu_tensors_match_the_numpy_decode():
    """PyTorch CPU tensors (the caches keep their padded block stride; FlashMLA's float8 view
    of them too) through mlakit.mla_sparse_decode and flash_mla_with_kvcache."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(50)
    b, s_q, h_q = 2, 2, 8
    cache, extra = v4_cache(rng, 4, 16), v4_cache(rng, 3, 8)
    q = queries(rng, b, s_q, h_q, V4_D_QK)
    idx, extra_idx = indices_into(rng, b, s_q, 16, cache), indices_into(rng, b, s_q, 6, extra)
    n, extra_n = lengths(rng, b, 16), lengths(rng, b, 6)
    sink = rng.standard_normal(h_q).astype(np.float32)
    ref = reference(q, [(cache, idx, n), (extra, extra_idx, extra_n)], sink=sink)
    t = torch.from_numpy
    k_cache, extra_k_cache = cache.torch(), extra.torch()
    assert k_cache.stride()[:2] == (v4_block_stride(16), 584) and v4_block_stride(16) == 9792
    out, lse = mlakit.mla_sparse_decode(t(q).view(torch.bfloat16), k_cache, t(idx), t(n), t(sink),
                                        extra_kv_cache=extra_k_cache, extra_indices=t(extra_idx),
                                        extra_topk_length=t(extra_n))
    assert out.dtype == torch.bfloat16
    check(out.view(torch.uint16).numpy(), lse.numpy(), *ref)
    meta, _ = flash_mla.get_mla_metadata()
    out, lse = flash_mla.flash_mla_with_kvcache(
        t(q).view(torch.bfloat16), k_cache.view(torch.float8_e4m3fn), None, None, 512, meta, is_fp8_kvcache=True,
        indices=t(idx), attn_sink=t(sink), extra_k_cache=extra_k_cache.view(torch.float8_e4m3fn),
        extra_indices_in_kvcache=t(extra_idx), topk_length=t(n), extra_topk_length=t(extra_n),
    )
    check(out.view(torch.uint16).numpy(), lse.numpy(), *ref)


def test_the_docs_snippet_decodes_over_two_caches():
    """docs/python.md, Sparse decode: its snippet, run on CPU tensors, against the NumPy
    decode over the caches it quantized."""
    torch = pytest.importorskip("torch")
    import os
    import types

    path = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "python.md")
    with open(path) as f:
        text = f.read().split("\n### Sparse decode: DeepSeek V3.2 and V4 tokens, a second cache\n", 1)[1]
    code = text.split("```python\n", 1)[1].split("```", 1)[0]
    rng = np.random.default_rng(51)
    b, s_q, h_q, topk, extra_topk = 2, 2, 8, 32, 12
    g = torch.Generator().manual_seed(51)
    kv = (torch.randn((3, 64, 1, 512), generator=g) / 10).to(torch.bfloat16)
    extra_kv = (torch.randn((2, 16, 1, 512), generator=g) / 10).to(torch.bfloat16)
    indices = torch.randint(-1, 3 * 64, (b, s_q, topk), generator=g, dtype=torch.int32)
    extra_indices = torch.randint(-1, 2 * 16, (b, s_q, extra_topk), generator=g, dtype=torch.int32)
    scope = dict(mlakit=mlakit, kv=kv, extra_kv=extra_kv, b=b, s_q=s_q, h_q=h_q, topk=topk, layers=range(2),
                 q=torch.from_numpy(queries(rng, b, s_q, h_q, V4_D_QK)).view(torch.bfloat16), indices=indices,
                 topk_length=torch.tensor([topk, 9], dtype=torch.int32), extra_indices=extra_indices,
                 extra_topk_length=torch.tensor([3, extra_topk], dtype=torch.int32),
                 attn_sink=torch.from_numpy(rng.standard_normal(h_q).astype(np.float32)))
    exec(code, scope)

    def keys(cache):
        return types.SimpleNamespace(keys=mlakit.dequantize_fp8_v4_cache(cache).float().double().numpy().reshape(-1, 512))

    lists = [(keys(scope["kv_cache"]), indices.numpy(), scope["topk_length"].numpy()),
             (keys(scope["extra_cache"]), extra_indices.numpy(), scope["extra_topk_length"].numpy())]
    ref = reference(scope["q"].view(torch.uint16).numpy(), lists, sink=scope["attn_sink"].numpy())
    check(scope["out"].view(torch.uint16).numpy(), scope["lse"].numpy(), *ref)
