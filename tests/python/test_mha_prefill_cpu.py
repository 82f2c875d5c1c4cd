"""Dense MHA prefill forward on host (NumPy) arrays against a NumPy float64 formula written
here: varlen batches with empty sequences, causal bottom-right alignment, GQA, every head-dim
pair, bfloat16 bit patterns and float16, strided views, the given scale, errors; FlashMLA's
flash_attn_varlen_* (mlakit.flash_mla): the lse layout, the packed forms' splitting into views,
their argument errors, and on CPU tensors the op and torch.compile without graph breaks.
The backward (mlakit.mha_prefill_backward) on host arrays against PyTorch autograd of a float64
formula (torch_ops_cases.attention): every head-dim pair, causal with Lq != Lk, GQA ratios,
length-0 sequences, the given scale, rows in no sequence neither read nor written, empty
problems, kernel / deterministic ignored on the host, argument errors naming the argument."""

import math

import numpy as np
import pytest

import mlakit
from mlakit import _mha_prefill, flash_mla
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


def test_the_kernel_choice_is_checked_and_host_arrays_ignore_it():
    rng = np.random.default_rng(40)
    q, k, v, cu_q, cu_k = case(rng, [3, 2], [4, 2], 4, 2, 64, 64, bf16=False)
    want_out, want_lse = mlakit.mha_prefill(q, k, v, cu_q, cu_k, 3, 4, causal=True)
    for kernel in ("portable", "sm90"):
        out, lse = mlakit.mha_prefill(q, k, v, cu_q, cu_k, 3, 4, causal=True, kernel=kernel)
        assert np.array_equal(out, want_out) and np.array_equal(lse, want_lse)
    with pytest.raises(ValueError, match=r"^mha_prefill: kernel: expected 'auto' or 'portable' or 'sm90', got 'x'"):
        mlakit.mha_prefill(q, k, v, cu_q, cu_k, 3, 4, kernel="x")
    with pytest.raises(TypeError, match=r"^mha_prefill: kernel: expected .*, got int"):
        mlakit.mha_prefill(q, k, v, cu_q, cu_k, 3, 4, kernel=1)


# ---- FlashMLA's flash_attn_varlen_* (mlakit.flash_mla) on host arrays ------------------------


def test_flash_attn_varlen_func_returns_flash_mla_lse_layout():
    rng = np.random.default_rng(50)
    lq, lk = [5, 0, 17, 3], [9, 4, 17, 0]
    q, k, v, cu_q, cu_k = case(rng, lq, lk, 4, 2, 128, 128, bf16=True)
    out, lse = flash_mla.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 17, 17, causal=True, deterministic=True)
    want_out, want_lse = formula(q, k, v, cu_q, cu_k, 1 / math.sqrt(128), True)
    check_out(as_float(out), want_out)
    # FlashMLA returns lse [total_q, h_q], the transposed view of an [h_q, total_q] buffer.
    assert lse.shape == (q.shape[0], 4) and lse.T.flags.c_contiguous
    check_stat(lse.T, want_lse)


def packed_views_spy(monkeypatch):
    """The q, k, v mlakit.mha_prefill's run receives."""
    seen = []
    run = _mha_prefill.run

    def record(q, k, v, *args):
        seen.append((q, k, v))
        return run(q, k, v, *args)

    monkeypatch.setattr(_mha_prefill, "run", record)
    return seen


@pytest.mark.parametrize("d_qk,d_v", PAIRS)
def test_qkvpacked_splits_q_k_v_along_the_last_dimension_as_views(d_qk, d_v, monkeypatch):
    rng = np.random.default_rng(60 + d_qk)
    lengths = [6, 0, 11, 2]
    q, k, v, cu, _ = case(rng, lengths, lengths, 2, 2, d_qk, d_v, bf16=False)
    qkv = np.concatenate([q, k, v], axis=-1)
    seen = packed_views_spy(monkeypatch)
    out, lse = flash_mla.flash_attn_varlen_qkvpacked_func(qkv, cu, 11, d_qk, softmax_scale=0.1, causal=True)
    assert all(np.shares_memory(x, qkv) for x in seen[-1])
    assert [x.shape[2] for x in seen[-1]] == [d_qk, d_qk, d_v]
    want_out, want_lse = mlakit.mha_prefill(q, k, v, cu, cu, 11, 11, softmax_scale=0.1, causal=True)
    assert np.array_equal(out, want_out) and np.array_equal(lse, want_lse.T)


@pytest.mark.parametrize("d_qk,d_v", PAIRS)
def test_kvpacked_splits_k_v_along_the_last_dimension_as_views(d_qk, d_v, monkeypatch):
    rng = np.random.default_rng(70 + d_qk)
    q, k, v, cu_q, cu_k = case(rng, [4, 9], [9, 1], 4, 1, d_qk, d_v, bf16=True)
    kv = np.concatenate([k, v], axis=-1)
    seen = packed_views_spy(monkeypatch)
    out, lse = flash_mla.flash_attn_varlen_kvpacked_func(q, kv, cu_q, cu_k, 9, 9, d_qk)
    assert np.shares_memory(seen[-1][1], kv) and np.shares_memory(seen[-1][2], kv)
    want_out, want_lse = mlakit.mha_prefill(q, k, v, cu_q, cu_k, 9, 9)
    assert np.array_equal(out, want_out) and np.array_equal(lse, want_lse.T)


def test_flash_attn_varlen_errors_name_the_function_and_argument():
    rng = np.random.default_rng(80)
    q, k, v, cu_q, cu_k = case(rng, [3, 2], [4, 2], 4, 2, 128, 128, bf16=False)
    fn, qkvp, kvp = (flash_mla.flash_attn_varlen_func, flash_mla.flash_attn_varlen_qkvpacked_func,
                     flash_mla.flash_attn_varlen_kvpacked_func)
    name = "flash_attn_varlen_func"
    with pytest.raises(NotImplementedError, match=rf"^{name}: dropout_p: .*expected 0.0, got 0.1"):
        fn(q, k, v, cu_q, cu_k, 3, 4, dropout_p=0.1)
    with pytest.raises(TypeError, match=rf"^{name}: dropout_p: expected a float"):
        fn(q, k, v, cu_q, cu_k, 3, 4, dropout_p="0")
    with pytest.raises(NotImplementedError, match=rf"^{name}: is_varlen: expected True"):
        fn(q, k, v, cu_q, cu_k, 3, 4, is_varlen=False)
    with pytest.raises(TypeError, match=rf"^{name}: deterministic: expected a bool"):
        fn(q, k, v, cu_q, cu_k, 3, 4, deterministic=None)
    with pytest.raises(TypeError, match=rf"^{name}: cu_seqlens_qo: expected an array"):
        fn(q, k, v, [0, 3, 5], cu_k, 3, 4)
    with pytest.raises(TypeError, match=rf"^{name}: max_seqlen_kv: expected an int, got float"):
        fn(q, k, v, cu_q, cu_k, 3, 4.0)
    with pytest.raises(ValueError, match=rf"^{name}: k: expected a 3-d array"):
        fn(q, k[0], v, cu_q, cu_k, 3, 4)
    with pytest.raises(ValueError, match="max_seqlen_k"):  # the library's check of the lengths
        fn(q, k, v, cu_q, cu_k, 3, 3)
    with pytest.raises(TypeError, match=r"^mha_prefill: q: unsupported dtype"):  # the extension's conversion
        fn(q.astype(np.float64), k, v, cu_q, cu_k, 3, 4)

    qkv = np.concatenate([q, q, q], axis=-1)  # [5, 4, 384]
    name = "flash_attn_varlen_qkvpacked_func"
    with pytest.raises(ValueError, match=rf"^{name}: qkv: expected a 3-d array"):
        qkvp(qkv[0], cu_q, 3, 128)
    with pytest.raises(ValueError, match=rf"^{name}: head_dim_qk: expected 2 \* head_dim_qk < qkv.shape\[2\] = 384"):
        qkvp(qkv, cu_q, 3, 192)
    with pytest.raises(ValueError, match=rf"^{name}: head_dim_qk: expected >= 1, got 0"):
        qkvp(qkv, cu_q, 3, 0)
    with pytest.raises(TypeError, match=rf"^{name}: head_dim_qk: expected an int"):
        qkvp(qkv, cu_q, 3, None)
    with pytest.raises(TypeError, match=rf"^{name}: cu_seqlens: expected an array"):
        qkvp(qkv, None, 3, 128)
    with pytest.raises(TypeError, match=rf"^{name}: max_seqlen: expected an int"):
        qkvp(qkv, cu_q, "3", 128)
    with pytest.raises(NotImplementedError, match=rf"^{name}: dropout_p"):
        qkvp(qkv, cu_q, 3, 128, dropout_p=0.5)

    kv = np.concatenate([k, v], axis=-1)  # [6, 2, 256]
    name = "flash_attn_varlen_kvpacked_func"
    with pytest.raises(ValueError, match=rf"^{name}: head_dim_qk: expected q.shape\[2\] = 128, got 64"):
        kvp(q, kv, cu_q, cu_k, 3, 4, 64)
    with pytest.raises(ValueError, match=rf"^{name}: head_dim_qk: expected < kv.shape\[2\] = 128"):
        kvp(q, kv[:, :, :128], cu_q, cu_k, 3, 4, 128)
    with pytest.raises(ValueError, match=rf"^{name}: kv: expected a 3-d array"):
        kvp(q, kv[0], cu_q, cu_k, 3, 4, 128)
    with pytest.raises(NotImplementedError, match=rf"^{name}: is_varlen"):
        kvp(q, kv, cu_q, cu_k, 3, 4, 128, is_varlen=False)


def test_flash_attn_varlen_on_cpu_tensors_eager_without_the_op_compiled_through_it():
    torch = pytest.importorskip("torch")
    import mlakit.torch_ops  # noqa: F401

    g = torch.Generator().manual_seed(90)
    q = torch.randn((9, 4, 64), generator=g).to(torch.bfloat16)
    kv = torch.randn((12, 2, 128), generator=g).to(torch.bfloat16)
    qkv = torch.randn((12, 2, 192), generator=g).to(torch.bfloat16)
    cu_q, cu_k = torch.tensor([0, 4, 4, 9], dtype=torch.int32), torch.tensor([0, 2, 7, 12], dtype=torch.int32)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        out, lse = flash_mla.flash_attn_varlen_func(q, kv[:, :, :64], kv[:, :, 64:], cu_q, cu_k, 5, 5, causal=True)
    # Eager calls skip the op's dispatch (mlakit._arrays.traced); the compiled step below uses it.
    assert not any(e.name == "mlakit::mha_prefill" for e in prof.events())
    assert lse.shape == (9, 4) and lse.stride() == (1, 9)

    def step(q, kv, qkv):
        out, lse = flash_mla.flash_attn_varlen_kvpacked_func(q, kv, cu_q, cu_k, 5, 5, 64, causal=True)
        out2, lse2 = flash_mla.flash_attn_varlen_func(out * 0.5, kv[:, :, :64], kv[:, :, 64:], cu_q, cu_k, 5, 5)
        out3, lse3 = flash_mla.flash_attn_varlen_qkvpacked_func(qkv, cu_k, 5, 64, causal=True)
        return out2, lse + lse2, out3, lse3

    eager = step(q, kv, qkv)
    assert torch.equal(eager[2], mlakit.mha_prefill(qkv[:, :, :64], qkv[:, :, 64:128], qkv[:, :, 128:], cu_k, cu_k,
                                                    5, 5, causal=True)[0])
    explained = torch._dynamo.explain(step)(q, kv, qkv)
    assert explained.graph_break_count == 0, explained.break_reasons
    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")(q, kv, qkv)
    for a, b in zip(eager, compiled):
        assert torch.equal(a, b)


# ---- the backward (mlakit.mha_prefill_backward) on host arrays --------------------------------


def exact_forward(torch, q, k, v, cu_q, cu_k, scale, causal):
    """(out, lse) for the backward: out from the float64 formula as float32 (unrounded: the
    backward then sees the float64 reference's inputs, docs/contract.md Accuracy), lse from
    mlakit's forward (float32). NumPy arrays in and out."""
    from torch_ops_cases import attention

    t = [torch.from_numpy(as_float(x)) for x in (q, k, v)]
    out = attention(*t, torch.from_numpy(cu_q), torch.from_numpy(cu_k), scale, causal).float().numpy()
    _, lse = mlakit.mha_prefill(q, k, v, cu_q, cu_k, int(np.diff(cu_q).max(initial=0)),
                                int(np.diff(cu_k).max(initial=0)), softmax_scale=scale, causal=causal)
    return out, lse


def expected_grads(torch, dout, q, k, v, cu_q, cu_k, scale, causal):
    from torch_ops_cases import attention_grads

    t = [torch.from_numpy(as_float(x)) for x in (dout, q, k, v)]
    return attention_grads(*t, torch.from_numpy(cu_q), torch.from_numpy(cu_k), scale, causal)


def with_nan_rows(x, rows):
    """`x` with `rows` NaN rows appended (rows in no sequence: the backward must not read them)."""
    pad = np.full((rows,) + x.shape[1:], np.nan)
    return np.concatenate([x, to_bf16(pad) if x.dtype == np.uint16 else pad.astype(x.dtype)])


@pytest.mark.parametrize("d_qk,d_v", PAIRS)
@pytest.mark.parametrize("causal", [False, True])
def test_backward_matches_autograd_of_a_float64_formula(d_qk, d_v, causal):
    torch = pytest.importorskip("torch")
    from torch_ops_cases import check_grad

    rng = np.random.default_rng(200 + d_qk + d_v + causal)
    lq, lk = [5, 0, 17, 3, 1, 6], [9, 4, 17, 0, 1, 2]  # Lq < Lk, 0 on either side, Lq == Lk, Lq > Lk
    q, k, v, cu_q, cu_k = case(rng, lq, lk, 4, 2, d_qk, d_v, bf16=d_qk != 64)
    dout = (to_bf16 if d_qk != 64 else np.float16)(rng.standard_normal((q.shape[0], 4, d_v)))
    out, lse = exact_forward(torch, q, k, v, cu_q, cu_k, None, causal)
    want = expected_grads(torch, dout, q, k, v, cu_q, cu_k, None, causal)
    # Three rows of q (and dout, out, lse) and two of k and v in no sequence, NaN: not read.
    q, dout, k, v = with_nan_rows(q, 3), with_nan_rows(dout, 3), with_nan_rows(k, 2), with_nan_rows(v, 2)
    out = np.concatenate([out, np.full((3, 4, d_v), np.nan, np.float32)])
    lse = np.concatenate([lse, np.full((4, 3), np.nan, np.float32)], axis=1)
    dq, dk, dv = mlakit.mha_prefill_backward(dout, q, k, v, out, lse, cu_q, cu_k, 17, 17, causal=causal)
    for name, got, x in (("dq", dq, q), ("dk", dk, k), ("dv", dv, v)):
        assert got.dtype == x.dtype and got.shape == x.shape, name
    end_q, end_k = int(cu_q[-1]), int(cu_k[-1])
    assert np.all(as_float(dq[end_q:]) == 0) and np.all(as_float(dk[end_k:]) == 0) and np.all(as_float(dv[end_k:]) == 0)
    for name, got, expected in (("dq", dq[:end_q], want[0]), ("dk", dk[:end_k], want[1]), ("dv", dv[:end_k], want[2])):
        check_grad(torch.from_numpy(as_float(got)), expected, name)
    # The sequence without keys (index 3) gets dq 0, the one without queries (index 1) dk = dv = 0.
    assert np.all(as_float(dq[cu_q[3]:cu_q[4]]) == 0)
    assert np.all(as_float(dk[cu_k[1]:cu_k[2]]) == 0) and np.all(as_float(dv[cu_k[1]:cu_k[2]]) == 0)


@pytest.mark.parametrize("h_kv", [1, 2, 8])
def test_backward_gqa_ratios_and_a_given_scale_on_cpu_tensors(h_kv):
    """dk and dv of a kv head sum over its query heads; CPU tensors (bfloat16) work as NumPy
    arrays do; q a strided view."""
    torch = pytest.importorskip("torch")
    from torch_ops_cases import check_grad, varlen_problem

    lq, lk = [6, 11, 4], [11, 6, 0]
    q, k, v, cu_q, cu_k, dout = varlen_problem(210 + h_kv, lq, lk, 8, h_kv, 128, 128)
    wide = torch.full((q.shape[0], 8, 256), float("nan"), dtype=q.dtype)  # NaN beside the view
    wide[:, :, :128] = q
    out, lse = exact_forward(torch, *(x.view(torch.uint16).numpy() for x in (q, k, v)), cu_q.numpy(),
                             cu_k.numpy(), 0.05, True)
    dq, dk, dv = mlakit.mha_prefill_backward(dout, wide[:, :, :128], k, v, torch.from_numpy(out),
                                             torch.from_numpy(lse), cu_q, cu_k, 11, 11, softmax_scale=0.05,
                                             causal=True)
    assert isinstance(dq, torch.Tensor) and dq.dtype == torch.bfloat16 and dk.shape == k.shape
    from torch_ops_cases import attention_grads

    want = attention_grads(dout, q, k, v, cu_q, cu_k, 0.05, True)
    for name, got, expected in zip(("dq", "dk", "dv"), (dq, dk, dv), want):
        check_grad(got, expected, name)


def test_backward_of_empty_problems():
    rng = np.random.default_rng(220)
    q, k, v, cu_q, cu_k = case(rng, [0, 0], [3, 2], 2, 1, 64, 64, bf16=False)
    dout = np.zeros((0, 2, 64), np.float16)
    out, lse = mlakit.mha_prefill(q, k, v, cu_q, cu_k, 0, 3)
    # No query at all: dk and dv of the keys inside sequences are 0 (written), dq is empty.
    dq, dk, dv = mlakit.mha_prefill_backward(dout, q, k, v, out, lse, cu_q, cu_k, 0, 3, causal=True)
    assert dq.shape == (0, 2, 64) and dk.shape == (5, 1, 64) and np.all(dk == 0) and np.all(dv == 0)
    # b = 0: every row in no sequence, nothing written (zeros from the host allocation).
    q, k, v, _, _ = case(rng, [4], [3], 2, 1, 64, 64, bf16=False)
    none = np.zeros(1, np.int32)
    out, lse = mlakit.mha_prefill(q, k, v, none, none, 0, 0)
    dq, dk, dv = mlakit.mha_prefill_backward(np.ones_like(out), q, k, v, out, lse, none, none, 0, 0)
    assert dq.shape == q.shape and np.all(dq == 0) and np.all(dk == 0) and np.all(dv == 0)


def test_backward_on_the_host_ignores_kernel_and_deterministic():
    rng = np.random.default_rng(230)
    q, k, v, cu_q, cu_k = case(rng, [3, 5], [4, 5], 4, 2, 64, 64, bf16=True)
    out, lse = mlakit.mha_prefill(q, k, v, cu_q, cu_k, 5, 5, causal=True)
    dout = to_bf16(rng.standard_normal(out.shape))
    want = mlakit.mha_prefill_backward(dout, q, k, v, out, lse, cu_q, cu_k, 5, 5, causal=True)
    assert all(x.dtype == np.uint16 for x in want)
    for kernel in ("auto", "portable", "sm90"):
        for deterministic in (False, True):
            got = mlakit.mha_prefill_backward(dout, q, k, v, out, lse, cu_q, cu_k, 5, 5, causal=True,
                                              deterministic=deterministic, kernel=kernel)
            assert all(np.array_equal(a, b) for a, b in zip(got, want)), (kernel, deterministic)


def test_backward_errors_name_the_argument():
    rng = np.random.default_rng(240)
    q, k, v, cu_q, cu_k = case(rng, [3, 2], [4, 2], 4, 2, 128, 128, bf16=False)
    out, lse = mlakit.mha_prefill(q, k, v, cu_q, cu_k, 3, 4)
    dout = np.ones_like(out)
    bwd = mlakit.mha_prefill_backward
    name = "mha_prefill_backward"
    args = (dout, q, k, v, out, lse, cu_q, cu_k, 3, 4)
    with pytest.raises(TypeError, match=rf"^{name}: lse: expected an array .*\[h_q, total_q\], got None"):
        bwd(dout, q, k, v, out, None, cu_q, cu_k, 3, 4)
    with pytest.raises(ValueError, match=rf"^{name}: lse: expected a 2-d array"):
        bwd(dout, q, k, v, out, lse[0], cu_q, cu_k, 3, 4)
    # The library's checks (its messages name the reference or GPU entry: reference::mha_prefill_backward).
    with pytest.raises(ValueError, match=rf"{name}: lse.shape\[0\] \(h_q\): expected 4, got 5"):  # FlashMLA's layout
        bwd(dout, q, k, v, out, np.ascontiguousarray(lse.T), cu_q, cu_k, 3, 4)
    with pytest.raises(ValueError, match=rf"{name}: lse"):
        bwd(dout, q, k, v, out, lse.astype(np.float16), cu_q, cu_k, 3, 4)
    with pytest.raises(ValueError, match=rf"^{name}: dout: expected a 3-d array"):
        bwd(dout[0], q, k, v, out, lse, cu_q, cu_k, 3, 4)
    with pytest.raises(ValueError, match=rf"{name}: dout"):
        bwd(dout[:, :, :64], q, k, v, out, lse, cu_q, cu_k, 3, 4)
    with pytest.raises(ValueError, match=rf"{name}: out"):
        bwd(dout, q, k, v, out[:4], lse, cu_q, cu_k, 3, 4)
    with pytest.raises(TypeError, match=rf"^{name}: out: expected an array"):
        bwd(dout, q, k, v, [0.0], lse, cu_q, cu_k, 3, 4)
    with pytest.raises(TypeError, match=rf"^{name}: dout: unsupported dtype"):  # the extension's conversion
        bwd(dout.astype(np.float64), q, k, v, out, lse, cu_q, cu_k, 3, 4)
    with pytest.raises(ValueError, match=rf"^{name}: kernel: expected 'auto' or 'portable' or 'sm90', got 'bad'"):
        bwd(*args, kernel="bad")
    with pytest.raises(TypeError, match=rf"^{name}: deterministic: expected a bool, got NoneType"):
        bwd(*args, deterministic=None)
    with pytest.raises(TypeError, match=rf"^{name}: deterministic: expected a bool, got int"):
        bwd(*args, deterministic=1)
    with pytest.raises(TypeError, match=rf"^{name}: causal: expected a bool"):
        bwd(*args, causal="yes")
    with pytest.raises(ValueError, match=rf"{name}: softmax_scale: expected a finite value"):
        bwd(*args, softmax_scale=float("inf"))
    with pytest.raises(ValueError, match="max_seqlen_k"):  # the library's check of the lengths
        bwd(dout, q, k, v, out, lse, cu_q, cu_k, 3, 3)
    with pytest.raises(ValueError, match=r"cu_seqlens_q\[2\]"):
        bwd(dout, q, k, v, out, lse, np.array([0, 4, 3], np.int32), cu_k, 4, 4)
    with pytest.raises(ValueError, match="h_kv"):
        bwd(dout, q, k[:, :1].repeat(3, axis=1), v[:, :1].repeat(3, axis=1), out, lse, cu_q, cu_k, 3, 4)
