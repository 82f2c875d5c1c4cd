"""Dense MHA prefill forward on CUDA tensors: mlakit.mha_prefill, FlashMLA's
flash_attn_varlen_func and its packed forms (mlakit.flash_mla) and torch.ops.mlakit.mha_prefill,
against a float64 PyTorch formula written here and the CPU reference: every (d_qk, d_v) pair,
causal (bottom-right) and not, GQA, varlen batches with empty sequences and Lq != Lk on
either side, bfloat16 and float16, strided views read in place, each kernel (sm90 on compute
capability 9.0 only), rows outside every sequence neither written nor read, torch.compile
(fullgraph=True) and a CUDA graph replayed with new lengths. The backward
(mlakit.mha_prefill_backward, torch.ops.mlakit.mha_prefill_backward, and the gradients of
flash_attn_varlen_func and its packed forms) against the library's CPU reference on the same
inputs (the GPU forward's out and lse), every pair, causal and not, GQA, float16, long
sequences; the deterministic mode bitwise reproducible (whatever the workspace held); rows in
no sequence neither read nor written; the kernel choice; errors; a CUDA graph; opcheck.
Skipped without PyTorch, CUDA, or an mlakit built with CUDA."""

import itertools
import math

import pytest

torch = pytest.importorskip("torch")

import mlakit  # noqa: E402
from mlakit import _mha_prefill  # noqa: E402
from mlakit import _mlakit as _C  # noqa: E402
from mlakit import flash_mla  # noqa: E402
from torch.library import opcheck  # noqa: E402
from torch_cases import capture, generator, require_gpu  # noqa: E402
from torch_cases import check as check_all  # noqa: E402
from torch_ops_cases import (  # noqa: E402
    DOUT_STD,
    V_STD,
    WITH_GRAD,
    backward_of,
    check_grad,
    check_packed_form_gradients,
    leaves,
)

require_gpu()
DEVICE = "cuda"
OPS = torch.ops.mlakit
PAIRS = [(64, 64), (128, 128), (192, 128), (256, 256)]
HOPPER = torch.cuda.get_device_capability() == (9, 0)
KERNELS = ["auto", "portable"] + (["sm90"] if HOPPER else [])
# Lq < Lk, an empty query side, an empty key side, Lq == Lk over several tiles, Lq > Lk (under
# causal the first Lq - Lk queries see no key), a short one.
LQ = [130, 0, 1, 77, 257, 40]
LK = [200, 5, 0, 77, 129, 3]
# Rows after the last sequence: none of q by default (mlakit.mha_prefill leaves those output
# rows unwritten on the device, so whole-tensor comparisons hold only without them).
PAD_Q, PAD_K = 0, 2


def prefix_sums(lengths):
    return torch.tensor([0] + list(itertools.accumulate(lengths)), dtype=torch.int32, device=DEVICE)


def rand(gen, shape, dtype=torch.bfloat16):
    return torch.randn(shape, generator=gen).to(dtype).to(DEVICE)


def problem(seed, d_qk, d_v, h_q=8, h_kv=2, lq=LQ, lk=LK, dtype=torch.bfloat16, pad_q=PAD_Q, pad_k=PAD_K):
    """(q, k, v, cu_seqlens_q, cu_seqlens_k), with `pad_q` / `pad_k` rows after the last sequence."""
    gen = generator(seed)
    q = rand(gen, (sum(lq) + pad_q, h_q, d_qk), dtype)
    k = rand(gen, (sum(lk) + pad_k, h_kv, d_qk), dtype)
    # Values N(0, 1) / 10, the scale of the accuracy rule's absolute term (docs/contract.md,
    # Accuracy; the C++ suites' convention): with N(0, 1) values the bf16 rounding of P alone
    # moves outputs by ~1e-2 in any flash kernel.
    v = (rand(gen, (sum(lk) + pad_k, h_kv, d_v), torch.float32) / 10).to(dtype)
    return q, k, v, prefix_sums(lq), prefix_sums(lk)


def check(out, lse, ref_out, ref_lse):
    """The rows of the sequences (the reference's): on the device, rows past
    cu_seqlens_q[-1] are not written."""
    rows = ref_out.shape[0]
    check_all(out[:rows], lse[:, :rows], ref_out, ref_lse)


def reference(q, k, v, cu_q, cu_k, scale=None, causal=False):
    """Float64 formula on the sequences' rows: (out [cu_q[-1], h_q, d_v], lse [h_q,
    cu_q[-1]]), natural log; a query that sees no key: 0 and +inf."""
    total_q, h_q, d_qk = q.shape
    group = h_q // k.shape[1]
    scale = d_qk**-0.5 if scale is None else scale
    out = torch.zeros(total_q, h_q, v.shape[2], dtype=torch.float64, device=q.device)
    lse = torch.zeros(h_q, total_q, dtype=torch.float64, device=q.device)
    cu_q, cu_k = cu_q.tolist(), cu_k.tolist()
    for q0, q1, k0, k1 in zip(cu_q[:-1], cu_q[1:], cu_k[:-1], cu_k[1:]):
        n_q, n_k = q1 - q0, k1 - k0
        if n_q == 0:
            continue
        keys = k[k0:k1].double().repeat_interleave(group, dim=1)  # [n_k, h_q, d_qk]
        values = v[k0:k1].double().repeat_interleave(group, dim=1)
        z = torch.einsum("thd,jhd->htj", q[q0:q1].double(), keys) * scale  # [h_q, n_q, n_k]
        if causal:
            t = torch.arange(n_q, device=q.device).view(n_q, 1)
            visible = torch.arange(n_k, device=q.device).view(1, n_k) <= t + n_k - n_q
            z = z.masked_fill(~visible, -math.inf)
        row_lse = torch.logsumexp(z, dim=-1)  # -inf where no key is visible
        weights = torch.exp(z - row_lse.unsqueeze(-1)).nan_to_num(0.0)
        out[q0:q1] = torch.einsum("htj,jhd->thd", weights, values)
        lse[:, q0:q1] = row_lse.masked_fill(row_lse == -math.inf, math.inf)
    return out[: cu_q[-1]], lse[:, : cu_q[-1]]


def cpu_reference(q, k, v, cu_q, cu_k, max_q, max_k, scale=None, causal=False):
    """The library's float64 CPU reference, unrounded (float32 out)."""
    out = torch.zeros(q.shape[0], q.shape[1], v.shape[2], dtype=torch.float32)
    lse = torch.zeros(q.shape[1], q.shape[0], dtype=torch.float32)
    _C.mha_prefill_reference(q.cpu(), k.cpu(), v.cpu(), cu_q.cpu(), cu_k.cpu(), max_q, max_k, out, lse, scale, causal)
    rows = int(cu_q[-1])
    return out[:rows], lse[:, :rows]


def raw_call(q, k, v, cu_q, cu_k, max_q, max_k, out, lse, scale=None, causal=False, kernel="auto"):
    """The extension's device entry on caller-made outputs (what mlakit.mha_prefill does after
    allocating them), on the current stream."""
    size = _C.mha_prefill_workspace_size(q, k, v, cu_q, cu_k, max_q, max_k, out, lse, scale, causal, kernel)
    workspace = torch.empty(size, dtype=torch.uint8, device=DEVICE) if size else None
    _C.mha_prefill(q, k, v, cu_q, cu_k, max_q, max_k, out, lse, workspace, scale, causal, kernel,
                   torch.cuda.current_stream().cuda_stream)


# ---- accuracy ------------------------------------------------------------------------------


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d_qk,d_v", PAIRS)
def test_mha_prefill_matches_the_formula(d_qk, d_v, causal, kernel):
    q, k, v, cu_q, cu_k = problem(d_qk + d_v + causal, d_qk, d_v)
    out, lse = mlakit.mha_prefill(q, k, v, cu_q, cu_k, max(LQ), max(LK), causal=causal, kernel=kernel)
    assert out.dtype == q.dtype and out.shape == (q.shape[0], 8, d_v) and out.is_cuda
    assert lse.dtype == torch.float32 and lse.shape == (8, q.shape[0]) and lse.is_contiguous()
    check(out, lse, *reference(q, k, v, cu_q, cu_k, causal=causal))


@pytest.mark.parametrize("d_qk,d_v", PAIRS)
def test_mha_prefill_matches_the_cpu_reference(d_qk, d_v):
    q, k, v, cu_q, cu_k = problem(40 + d_qk, d_qk, d_v)
    out, lse = mlakit.mha_prefill(q, k, v, cu_q, cu_k, max(LQ), max(LK), softmax_scale=0.07, causal=True)
    check(out, lse, *cpu_reference(q, k, v, cu_q, cu_k, max(LQ), max(LK), 0.07, True))


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("h_q,h_kv,dtype", [(8, 8, torch.float16), (8, 1, torch.bfloat16), (16, 4, torch.float16)])
def test_gqa_ratios_float16_and_a_given_scale(h_q, h_kv, dtype, kernel):
    q, k, v, cu_q, cu_k = problem(h_q + h_kv, 128, 128, h_q=h_q, h_kv=h_kv, dtype=dtype)
    out, lse = mlakit.mha_prefill(q, k, v, cu_q, cu_k, max(LQ) + 5, max(LK) + 9, softmax_scale=0.05, causal=True,
                                  kernel=kernel)
    assert out.dtype == dtype
    check(out, lse, *reference(q, k, v, cu_q, cu_k, 0.05, True))


@pytest.mark.parametrize("kernel", KERNELS)
def test_long_sequences(kernel):
    lq, lk = [1000, 1, 513], [1000, 1500, 300]
    q, k, v, cu_q, cu_k = problem(50, 128, 128, lq=lq, lk=lk)
    for causal in (False, True):
        out, lse = mlakit.mha_prefill(q, k, v, cu_q, cu_k, max(lq), max(lk), causal=causal, kernel=kernel)
        check(out, lse, *reference(q, k, v, cu_q, cu_k, causal=causal))


def test_empty_problems():
    q, k, v, cu_q, cu_k = problem(60, 64, 64, lq=[0, 0], lk=[3, 0], pad_q=0)
    out, lse = mlakit.mha_prefill(q, k, v, cu_q, cu_k, 0, 3, causal=True)
    assert out.shape == (0, 8, 64) and lse.shape == (8, 0)
    q, k, v, cu_q, cu_k = problem(61, 64, 64, lq=[], lk=[], pad_q=4)  # b = 0: every row in no sequence
    out, lse = mlakit.mha_prefill(q, k, v, cu_q, cu_k, 0, 0)
    torch.cuda.synchronize()
    assert out.shape == (4, 8, 64) and lse.shape == (8, 4)  # allocated, not written


# ---- layouts -------------------------------------------------------------------------------


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("d_qk,d_v", [(128, 128), (192, 128)])
def test_strided_views_equal_contiguous_copies(d_qk, d_v, kernel):
    q, k, v, cu_q, cu_k = problem(70 + d_qk, d_qk, d_v)
    # q in the second half of a buffer twice its length (FlashMLA's test layout), k and v
    # interleaved in one [total_k, h_kv, d_qk + d_v] tensor, each with NaN beside it.
    q_buffer = torch.full((2 * q.shape[0],) + q.shape[1:], float("nan"), dtype=q.dtype, device=DEVICE)
    q_buffer[q.shape[0]:] = q
    kv = torch.cat([k, v], dim=-1)
    views = (q_buffer[q.shape[0]:], kv[:, :, :d_qk], kv[:, :, d_qk:])
    assert not views[1].is_contiguous() and views[2].data_ptr() == kv.data_ptr() + 2 * d_qk
    want = mlakit.mha_prefill(q, k, v, cu_q, cu_k, max(LQ), max(LK), causal=True, kernel=kernel)
    got = mlakit.mha_prefill(*views, cu_q, cu_k, max(LQ), max(LK), causal=True, kernel=kernel)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.parametrize("kernel", KERNELS)
def test_rows_outside_every_sequence_are_not_written(kernel):
    q, k, v, cu_q, cu_k = problem(80, 128, 128, pad_q=11)
    end = int(cu_q[-1])
    out = torch.full((q.shape[0], 8, 128), float("nan"), dtype=q.dtype, device=DEVICE)
    lse = torch.full((8, q.shape[0]), float("nan"), dtype=torch.float32, device=DEVICE)
    raw_call(q, k, v, cu_q, cu_k, max(LQ), max(LK), out, lse, causal=True, kernel=kernel)
    torch.cuda.synchronize()
    assert torch.isnan(out[end:]).all() and torch.isnan(lse[:, end:]).all()
    ref_out, ref_lse = reference(q, k, v, cu_q, cu_k, causal=True)
    check(out[:end], lse[:, :end], ref_out[:end], ref_lse[:, :end])


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("d_qk,d_v", PAIRS)
def test_rows_outside_every_sequence_are_not_read(d_qk, d_v, kernel):
    """NaN in the q, k and v rows after the last sequence: a kernel that reads a whole tile
    past a sequence's end there and masks only the logits gets NaN (0 * NaN in P V)."""
    q, k, v, cu_q, cu_k = problem(90 + d_qk, d_qk, d_v, pad_q=70, pad_k=70)
    q[int(cu_q[-1]):] = float("nan")
    k[int(cu_k[-1]):] = float("nan")
    v[int(cu_k[-1]):] = float("nan")
    for causal in (False, True):
        out, lse = mlakit.mha_prefill(q, k, v, cu_q, cu_k, max(LQ), max(LK), causal=causal, kernel=kernel)
        check(out, lse, *reference(q, k, v, cu_q, cu_k, causal=causal))


# ---- kernels and errors ----------------------------------------------------------------------


def test_the_kernels_agree_and_the_op_takes_the_choice():
    q, k, v, cu_q, cu_k = problem(100, 128, 128)
    results = {name: mlakit.mha_prefill(q, k, v, cu_q, cu_k, max(LQ), max(LK), causal=True, kernel=name)
               for name in KERNELS}
    ref = reference(q, k, v, cu_q, cu_k, causal=True)
    for name, (out, lse) in results.items():
        check(out, lse, *ref)
        op_out, op_lse = OPS.mha_prefill(q, k, v, cu_q, cu_k, max(LQ), max(LK), None, True, kernel_name=name)
        assert torch.equal(op_out, out) and torch.equal(op_lse, lse), name
    auto = "sm90" if HOPPER else "portable"
    assert torch.equal(results["auto"][0], results[auto][0])


@pytest.mark.skipif(HOPPER, reason="the sm90 kernel runs here")
def test_sm90_elsewhere_is_an_error_naming_the_kernel():
    q, k, v, cu_q, cu_k = problem(110, 64, 64)
    with pytest.raises(RuntimeError, match="kernel"):
        mlakit.mha_prefill(q, k, v, cu_q, cu_k, max(LQ), max(LK), kernel="sm90")


def test_argument_errors_on_the_device():
    q, k, v, cu_q, cu_k = problem(120, 128, 128)
    with pytest.raises(ValueError, match="cu_seqlens_k: expected device memory"):
        mlakit.mha_prefill(q, k, v, cu_q, cu_k.cpu(), max(LQ), max(LK))
    with pytest.raises(ValueError, match="cu_seqlens_kv: expected device memory"):
        flash_mla.flash_attn_varlen_func(q, k, v, cu_q, cu_k.cpu(), max(LQ), max(LK))
    with pytest.raises(ValueError, match="d_qk, d_v"):
        mlakit.mha_prefill(q, k, v[:, :, :64], cu_q, cu_k, max(LQ), max(LK))
    with pytest.raises(ValueError, match="h_kv"):
        mlakit.mha_prefill(q[:, :6], k[:, :1].expand(-1, 4, -1), v[:, :1].expand(-1, 4, -1), cu_q, cu_k, max(LQ),
                           max(LK))
    with pytest.raises(ValueError, match="kernel"):
        mlakit.mha_prefill(q, k, v, cu_q, cu_k, max(LQ), max(LK), kernel="hopper")


def test_opcheck_on_the_gpu():
    q, k, v, cu_q, cu_k = problem(130, 64, 64, lq=[5, 0, 9], lk=[7, 2, 9])
    opcheck(OPS.mha_prefill.default, (q, k, v, cu_q, cu_k, 9, 9, None, True))
    opcheck(OPS.mha_prefill.default, (q, k, v, cu_q, cu_k, 9, 9, 0.1, False, "portable"))


# ---- the FlashMLA drop-in --------------------------------------------------------------------


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d_qk,d_v", PAIRS)
def test_flash_attn_varlen_func_matches_the_formula(d_qk, d_v, causal):
    q, k, v, cu_q, cu_k = problem(140 + d_qk + causal, d_qk, d_v)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        out, lse = flash_mla.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(LQ), max(LK), causal=causal,
                                                    deterministic=True)
    assert not any(e.name == "mlakit::mha_prefill" for e in prof.events())  # eager: the extension directly
    # FlashMLA's lse: [total_q, h_q], the transposed view of an [h_q, total_q] buffer.
    assert lse.shape == (q.shape[0], 8) and lse.stride() == (1, q.shape[0]) and lse.dtype == torch.float32
    check(out, lse.T, *reference(q, k, v, cu_q, cu_k, causal=causal))
    want_out, want_lse = mlakit.mha_prefill(q, k, v, cu_q, cu_k, max(LQ), max(LK), causal=causal)
    assert torch.equal(out, want_out) and torch.equal(lse.T, want_lse)


@pytest.fixture
def spy(monkeypatch):
    """The q, k, v the package receives through the op, as (data_ptr, stride) pairs."""
    seen = []
    run = _mha_prefill.run

    def record(q, k, v, *args):
        seen.append([(x.data_ptr(), x.stride()) for x in (q, k, v)])
        return run(q, k, v, *args)

    monkeypatch.setattr(_mha_prefill, "run", record)
    return seen


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d_qk,d_v", PAIRS)
def test_qkvpacked_reads_its_views(d_qk, d_v, causal, spy):
    lengths = [130, 0, 1, 77, 40]
    q, k, v, cu, _ = problem(150 + d_qk, d_qk, d_v, h_q=4, h_kv=4, lq=lengths, lk=lengths, pad_k=PAD_Q)
    qkv = torch.cat([q, k, v], dim=-1)  # [total, h, 2 * d_qk + d_v]
    out, lse = flash_mla.flash_attn_varlen_qkvpacked_func(qkv, cu, max(lengths), d_qk, causal=causal)
    base, item = qkv.data_ptr(), qkv.element_size()
    assert spy[-1] == [(base, qkv.stride()), (base + d_qk * item, qkv.stride()), (base + 2 * d_qk * item, qkv.stride())]
    check(out, lse.T, *reference(q, k, v, cu, cu, causal=causal))
    want_out, want_lse = flash_mla.flash_attn_varlen_func(q, k, v, cu, cu, max(lengths), max(lengths), causal=causal)
    assert torch.equal(out, want_out) and torch.equal(lse, want_lse)


@pytest.mark.parametrize("d_qk,d_v", PAIRS)
def test_kvpacked_reads_its_views(d_qk, d_v, spy):
    q, k, v, cu_q, cu_k = problem(160 + d_qk, d_qk, d_v)
    kv = torch.cat([k, v], dim=-1)  # [total_k, h_kv, d_qk + d_v]
    out, lse = flash_mla.flash_attn_varlen_kvpacked_func(q, kv, cu_q, cu_k, max(LQ), max(LK), d_qk, softmax_scale=0.06,
                                                         causal=True)
    base, item = kv.data_ptr(), kv.element_size()
    assert spy[-1][1:] == [(base, kv.stride()), (base + d_qk * item, kv.stride())]
    check(out, lse.T, *reference(q, k, v, cu_q, cu_k, 0.06, True))
    want = flash_mla.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(LQ), max(LK), softmax_scale=0.06, causal=True)
    assert torch.equal(out, want[0]) and torch.equal(lse, want[1])


def test_flash_attn_varlen_options():
    q, k, v, cu_q, cu_k = problem(170, 64, 64)
    with pytest.raises(NotImplementedError, match="dropout_p"):
        flash_mla.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(LQ), max(LK), dropout_p=0.1)
    with pytest.raises(NotImplementedError, match="is_varlen"):
        flash_mla.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(LQ), max(LK), is_varlen=False)
    a = flash_mla.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(LQ), max(LK), deterministic=True)
    b = flash_mla.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(LQ), max(LK), deterministic=False)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


# ---- torch.compile and CUDA graphs -------------------------------------------------------------


def test_compiled_flash_attn_varlen_has_no_graph_break_and_matches_eager():
    q, k, v, cu_q, cu_k = problem(180, 128, 128)
    kv = torch.cat([k, v], dim=-1)
    qkv = torch.cat([q[: k.shape[0], :2], k, v], dim=-1)  # h = 2; its rows: the key sequences
    max_q, max_k = max(LQ), max(LK)

    def step(q, kv, qkv):
        out, lse = flash_mla.flash_attn_varlen_func(q, kv[:, :, :128], kv[:, :, 128:], cu_q, cu_k, max_q, max_k,
                                                    causal=True)
        out2, lse2 = flash_mla.flash_attn_varlen_kvpacked_func(out * 0.5, kv, cu_q, cu_k, max_q, max_k, 128)
        out3, lse3 = flash_mla.flash_attn_varlen_qkvpacked_func(qkv, cu_k, max_k, 128, causal=True)
        return out2, lse + lse2, out3, lse3

    eager = step(q, kv, qkv)
    explained = torch._dynamo.explain(step)(q, kv, qkv)
    assert explained.graph_break_count == 0, explained.break_reasons
    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True)(q, kv, qkv)
    torch.cuda.synchronize()
    rows = [int(cu_q[-1])] * 2 + [int(cu_k[-1])] * 2  # rows past the last sequence are not written
    for a, b, n in zip(eager, compiled, rows):
        assert a.shape == b.shape and torch.equal(a[:n], b[:n])


def test_a_cuda_graph_replayed_with_new_lengths_matches_eager():
    gen = generator(190)
    b, max_len, h_q, h_kv = 4, 300, 8, 2
    total = b * max_len
    q = rand(gen, (total, h_q, 128))
    k = rand(gen, (total, h_kv, 128))
    v = (rand(gen, (total, h_kv, 128), torch.float32) / 10).to(torch.bfloat16)  # the accuracy rule's scale
    cu_q = prefix_sums([max_len] * b)
    cu_k = prefix_sums([max_len] * b)

    def step():
        return flash_mla.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_len, max_len, causal=True)

    graph, outs = capture(step)
    for replay in range(20):
        lq = torch.randint(0, max_len + 1, (b,), generator=gen).tolist()
        lk = [max(n, int(m)) for n, m in zip(lq, torch.randint(0, max_len + 1, (b,), generator=gen))]
        lk[replay % b] = 0 if replay % 3 == 0 else lk[replay % b]  # now and then a sequence without keys
        cu_q.copy_(prefix_sums(lq))
        cu_k.copy_(prefix_sums(lk))
        q.copy_(rand(gen, q.shape))
        graph.replay()
        want_out, want_lse = step()
        torch.cuda.synchronize()
        end = sum(lq)  # rows past the last sequence are not written
        assert torch.equal(outs[0][:end], want_out[:end]) and torch.equal(outs[1][:end], want_lse[:end]), replay
    check(outs[0], outs[1].T, *reference(q, k, v, cu_q, cu_k, causal=True))


# ---- the backward ------------------------------------------------------------------------------

# 'sm90': the Hopper main kernel (d (64, 64), (128, 128), (192, 128); other head dims are
# refused, naming the kernel); 'auto' runs it where it serves the problem.
BACKWARD_KERNELS = ["auto", "portable"] + (["sm90"] if HOPPER else [])


def backward_problem(seed, d_qk, d_v, **kw):
    """(q, k, v, cu_q, cu_k, dout): problem()'s with v ~ N(0, 1) * V_STD and dout ~ N(0, 1) *
    DOUT_STD, the backward tests' scales (torch_ops_cases.DOUT_STD says why)."""
    q, k, v, cu_q, cu_k = problem(seed, d_qk, d_v, **kw)
    v = v * round(V_STD * 10)  # problem()'s v is N(0, 1) / 10; times a power of two: exact
    dout = (rand(generator(seed + 1), (q.shape[0], q.shape[1], d_v), torch.float32) * DOUT_STD).to(q.dtype)
    return q, k, v, cu_q, cu_k, dout


def forward_and_dout(seed, d_qk, d_v, causal=False, scale=None, **kw):
    """(q, k, v, cu_q, cu_k, out, lse, dout): backward_problem()'s and its GPU forward."""
    q, k, v, cu_q, cu_k, dout = backward_problem(seed, d_qk, d_v, **kw)
    lq, lk = kw.get("lq", LQ), kw.get("lk", LK)
    out, lse = mlakit.mha_prefill(q, k, v, cu_q, cu_k, max(lq), max(lk), softmax_scale=scale, causal=causal)
    return q, k, v, cu_q, cu_k, out, lse, dout


def sequence_rows(grads, cu_q, cu_k):
    """dq, dk, dv cut to the rows of the sequences (the device leaves the others unwritten)."""
    end_q, end_k = int(cu_q[-1]), int(cu_k[-1])
    return grads[0][:end_q], grads[1][:end_k], grads[2][:end_k]


def cpu_backward(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, scale=None, causal=False):
    """The library's float64 CPU reference of the backward on the same inputs, unrounded
    (float32 gradients), rows in no sequence 0."""
    grads = [torch.zeros(x.shape, dtype=torch.float32) for x in (q, k, v)]
    inputs = [x.cpu() for x in (dout, q, k, v, out, lse, cu_q, cu_k)]
    _C.mha_prefill_backward_reference(*inputs, max_q, max_k, *grads, scale, causal)
    return grads


def check_grads(grads, want, cu_q, cu_k):
    """The rows of the sequences: on the device, rows in no sequence are not written."""
    for name, got, expected in zip(("dq", "dk", "dv"), sequence_rows(grads, cu_q, cu_k),
                                   sequence_rows(want, cu_q, cu_k)):
        check_grad(got, expected, name)


def raw_backward(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, dq, dk, dv, scale=None, causal=False,
                 deterministic=False, kernel="auto"):
    """The extension's device entry on caller-made gradients, on the current stream."""
    args = (dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, dq, dk, dv)
    size = _C.mha_prefill_backward_workspace_size(*args, scale, causal, deterministic, kernel)
    workspace = torch.empty(size, dtype=torch.uint8, device=DEVICE) if size else None
    _C.mha_prefill_backward(*args, workspace, scale, causal, deterministic, kernel,
                            torch.cuda.current_stream().cuda_stream)


@pytest.mark.parametrize("kernel", BACKWARD_KERNELS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d_qk,d_v", PAIRS)
def test_backward_matches_the_cpu_reference(d_qk, d_v, causal, kernel):
    q, k, v, cu_q, cu_k, out, lse, dout = forward_and_dout(400 + d_qk + d_v + causal, d_qk, d_v, causal)
    if kernel == "sm90" and (d_qk, d_v) not in ((64, 64), (128, 128), (192, 128)):
        with pytest.raises(ValueError,
                           match=r"^mha_prefill_backward: kernel: kSm90 serves \(d_qk, d_v\) = \(64, 64\), \(128, 128\)"):
            mlakit.mha_prefill_backward(dout, q, k, v, out, lse, cu_q, cu_k, max(LQ), max(LK), causal=causal,
                                        kernel=kernel)
        return
    dq, dk, dv = mlakit.mha_prefill_backward(dout, q, k, v, out, lse, cu_q, cu_k, max(LQ), max(LK), causal=causal,
                                             kernel=kernel)
    for x, grad in zip((q, k, v), (dq, dk, dv)):
        assert grad.is_cuda and grad.dtype == x.dtype and grad.shape == x.shape
    check_grads((dq, dk, dv), cpu_backward(dout, q, k, v, out, lse, cu_q, cu_k, max(LQ), max(LK), None, causal),
                cu_q, cu_k)


@pytest.mark.parametrize("h_q,h_kv,dtype", [(8, 8, torch.float16), (8, 1, torch.bfloat16), (16, 4, torch.float16)])
def test_backward_gqa_ratios_float16_and_a_given_scale(h_q, h_kv, dtype):
    q, k, v, cu_q, cu_k, out, lse, dout = forward_and_dout(410 + h_q + h_kv, 128, 128, True, 0.05, h_q=h_q,
                                                           h_kv=h_kv, dtype=dtype)
    grads = mlakit.mha_prefill_backward(dout, q, k, v, out, lse, cu_q, cu_k, max(LQ) + 5, max(LK) + 9,
                                        softmax_scale=0.05, causal=True, deterministic=True)
    check_grads(grads, cpu_backward(dout, q, k, v, out, lse, cu_q, cu_k, max(LQ), max(LK), 0.05, True), cu_q, cu_k)


@pytest.mark.parametrize("causal", [False, True])
def test_backward_long_sequences(causal):
    lq, lk = [700, 1, 300], [700, 900, 200]
    q, k, v, cu_q, cu_k, out, lse, dout = forward_and_dout(420 + causal, 128, 128, causal, h_q=4, h_kv=2, lq=lq,
                                                           lk=lk)
    grads = mlakit.mha_prefill_backward(dout, q, k, v, out, lse, cu_q, cu_k, max(lq), max(lk), causal=causal)
    check_grads(grads, cpu_backward(dout, q, k, v, out, lse, cu_q, cu_k, max(lq), max(lk), None, causal), cu_q, cu_k)


def test_backward_deterministic_mode_is_bitwise_reproducible():
    """Many key tiles add into each query tile's dq and 8 query heads into each kv head's dk /
    dv: the order of those float32 sums is what the mode fixes. Between runs a block of the
    workspace's size is filled with 0xFF and freed, so the next workspace (PyTorch's caching
    allocator reuses the block) starts from garbage: the kernels must not read what it held."""
    lq, lk = [600, 300, 0, 129], [900, 300, 7, 64]
    q, k, v, cu_q, cu_k, out, lse, dout = forward_and_dout(430, 128, 128, True, h_q=8, h_kv=1, lq=lq, lk=lk)
    args = (dout, q, k, v, out, lse, cu_q, cu_k, max(lq), max(lk))
    first = mlakit.mha_prefill_backward(*args, causal=True, deterministic=True)
    size = _C.mha_prefill_backward_workspace_size(*args, *first, None, True, True, "auto")
    for _ in range(5):
        garbage = torch.full((size,), 0xFF, dtype=torch.uint8, device=DEVICE)
        del garbage
        again = mlakit.mha_prefill_backward(*args, causal=True, deterministic=True)
        for a, b in zip(sequence_rows(first, cu_q, cu_k), sequence_rows(again, cu_q, cu_k)):
            assert torch.equal(a, b)
    check_grads(first, cpu_backward(*args, None, True), cu_q, cu_k)


def test_backward_rows_outside_every_sequence_are_neither_read_nor_written():
    """NaN in every input row after the last sequence (q, k, v, dout, out, lse) and in the
    gradients before the call: those gradient rows stay NaN, the others are NaN-free and right."""
    q, k, v, cu_q, cu_k, out, lse, dout = forward_and_dout(440, 128, 128, True, pad_q=70, pad_k=70)
    end_q, end_k = int(cu_q[-1]), int(cu_k[-1])
    for x, end in ((q, end_q), (dout, end_q), (out, end_q), (k, end_k), (v, end_k)):
        x[end:] = float("nan")
    lse[:, end_q:] = float("nan")
    for kernel in BACKWARD_KERNELS:
        grads = [torch.full(x.shape, float("nan"), dtype=x.dtype, device=DEVICE) for x in (q, k, v)]
        raw_backward(dout, q, k, v, out, lse, cu_q, cu_k, max(LQ), max(LK), *grads, causal=True, kernel=kernel)
        torch.cuda.synchronize()
        assert torch.isnan(grads[0][end_q:]).all() and torch.isnan(grads[1][end_k:]).all()
        assert torch.isnan(grads[2][end_k:]).all()
        check_grads(grads, cpu_backward(dout, q, k, v, out, lse, cu_q, cu_k, max(LQ), max(LK), None, True), cu_q,
                    cu_k)


def test_backward_auto_runs_the_kernel_that_serves_the_problem():
    """Deterministic mode, bitwise: 'auto' equals 'sm90' at d 64 and 128 on a Hopper GPU
    ('portable' elsewhere); at d 256 'sm90' is refused (no Hopper kernel there)."""
    def rows_of(d, kernel, seed):
        q, k, v, cu_q, cu_k, out, lse, dout = forward_and_dout(seed, d, d, True)
        args = (dout, q, k, v, out, lse, cu_q, cu_k, max(LQ), max(LK))
        return sequence_rows(mlakit.mha_prefill_backward(*args, causal=True, deterministic=True, kernel=kernel),
                             cu_q, cu_k)

    hopper = "sm90" if HOPPER else "portable"
    for d, chosen in ((64, hopper), (128, hopper)):
        assert all(torch.equal(a, b) for a, b in zip(rows_of(d, "auto", 450 + d), rows_of(d, chosen, 450 + d))), d
    q, k, v, cu_q, cu_k, out, lse, dout = forward_and_dout(450, 256, 256, True)
    args = (dout, q, k, v, out, lse, cu_q, cu_k, max(LQ), max(LK))
    with pytest.raises(ValueError, match="kernel"):  # the Hopper backward serves d (64, 64), (128, 128), (192, 128)
        mlakit.mha_prefill_backward(*args, causal=True, kernel="sm90")
    with pytest.raises(ValueError, match="^mha_prefill_backward: kernel: expected"):
        mlakit.mha_prefill_backward(*args, kernel="hopper")


def test_backward_argument_errors_on_the_device():
    q, k, v, cu_q, cu_k, out, lse, dout = forward_and_dout(460, 128, 128)
    bwd = mlakit.mha_prefill_backward
    with pytest.raises(ValueError, match="mha_prefill_backward: lse: expected device memory"):
        bwd(dout, q, k, v, out, lse.cpu(), cu_q, cu_k, max(LQ), max(LK))
    with pytest.raises(ValueError, match="mha_prefill_backward: dout: expected device memory"):
        bwd(dout.cpu(), q, k, v, out, lse, cu_q, cu_k, max(LQ), max(LK))
    with pytest.raises(ValueError, match="mha_prefill_backward: cu_seqlens_k: expected device memory"):
        bwd(dout, q, k, v, out, lse, cu_q, cu_k.cpu(), max(LQ), max(LK))
    with pytest.raises(ValueError, match="lse"):  # FlashMLA's [total_q, h_q] layout
        bwd(dout, q, k, v, out, lse.T.contiguous(), cu_q, cu_k, max(LQ), max(LK))
    with pytest.raises(ValueError, match="dout"):
        bwd(dout[:, :, :64], q, k, v, out, lse, cu_q, cu_k, max(LQ), max(LK))
    with pytest.raises(TypeError, match="^mha_prefill_backward: deterministic: expected a bool"):
        bwd(dout, q, k, v, out, lse, cu_q, cu_k, max(LQ), max(LK), deterministic="yes")


def test_backward_empty_problems():
    # No query: dk and dv of the keys inside sequences are written 0 (the first key sequence).
    q, k, v, cu_q, cu_k = problem(470, 64, 64, lq=[0, 0], lk=[3, 0], pad_k=0)
    out, lse = mlakit.mha_prefill(q, k, v, cu_q, cu_k, 0, 3)
    dout = torch.empty_like(out)
    dq, dk, dv = mlakit.mha_prefill_backward(dout, q, k, v, out, lse, cu_q, cu_k, 0, 3, causal=True)
    torch.cuda.synchronize()
    assert dq.shape == (0, 8, 64) and torch.all(dk == 0) and torch.all(dv == 0)
    # b = 0: nothing to write, nothing launched.
    q, k, v, cu_q, cu_k = problem(471, 64, 64, lq=[], lk=[], pad_q=4, pad_k=3)
    out, lse = mlakit.mha_prefill(q, k, v, cu_q, cu_k, 0, 0)
    dq, dk, dv = mlakit.mha_prefill_backward(torch.zeros_like(out), q, k, v, out, lse, cu_q, cu_k, 0, 0)
    torch.cuda.synchronize()
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape


def test_backward_in_a_cuda_graph_replayed_with_new_gradients():
    q, k, v, cu_q, cu_k, out, lse, dout = forward_and_dout(480, 128, 128, True)
    args = (q, k, v, out, lse, cu_q, cu_k, max(LQ), max(LK), None, True, True)

    def step():
        return OPS.mha_prefill_backward(dout, *args)

    graph, grads = capture(step)
    gen = generator(481)
    for replay in range(5):
        dout.copy_(rand(gen, dout.shape, torch.float32) * DOUT_STD)
        graph.replay()
        want = step()
        torch.cuda.synchronize()
        for a, b in zip(sequence_rows(grads, cu_q, cu_k), sequence_rows(want, cu_q, cu_k)):
            assert torch.equal(a, b), replay


def test_backward_opcheck_on_the_gpu():
    q, k, v, cu_q, cu_k, out, lse, dout = forward_and_dout(490, 64, 64, True, lq=[5, 0, 9], lk=[7, 2, 9], pad_k=0)
    opcheck(OPS.mha_prefill_backward.default, (dout, q, k, v, out, lse, cu_q, cu_k, 9, 9, None, True, True))
    opcheck(OPS.mha_prefill_backward.default, (dout, q, k, v, out, lse, cu_q, cu_k, 9, 9, 0.1, False, True,
                                               "portable"))
    opcheck(OPS.mha_prefill.default, leaves(q, k, v) + (cu_q, cu_k, 9, 9, None, True), test_utils=WITH_GRAD)


# ---- gradients through the FlashMLA drop-in ----------------------------------------------------


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d_qk,d_v", PAIRS)
def test_flash_attn_varlen_func_gradients_match_the_cpu_reference(d_qk, d_v, causal):
    q, k, v, cu_q, cu_k, dout = backward_problem(500 + d_qk + causal, d_qk, d_v)
    tq, tk, tv = leaves(q, k, v)
    out, lse = flash_mla.flash_attn_varlen_func(tq, tk, tv, cu_q, cu_k, max(LQ), max(LK), causal=causal)
    backward_of((out, lse), dout)
    want = cpu_backward(dout, q, k, v, out.detach(), lse.detach().T, cu_q, cu_k, max(LQ), max(LK), None, causal)
    check_grads((tq.grad, tk.grad, tv.grad), want, cu_q, cu_k)


def test_packed_forms_give_gradients_to_qkv_and_kv_on_the_gpu():
    lengths = [130, 0, 1, 77, 40]
    q, k, v, cu, _, dout = backward_problem(510, 128, 128, h_q=4, h_kv=4, lq=lengths, lk=lengths, pad_k=0)
    check_packed_form_gradients(q, k, v, cu, max(lengths), dout, causal=True, deterministic=True)
