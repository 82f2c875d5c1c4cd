"""torch.ops.mlakit.* on CPU tensors (the float64 CPU reference behind every op): each op
against the package function it wraps, torch.library.opcheck (schema, fake tensors,
functionalization, and for mha_prefill its autograd formula), fake shapes against real ones, a
two-layer model compiled with fullgraph=True without graph breaks, and the plan-fields round
trip with its errors. The dense prefill's gradients: flash_attn_varlen_func and its packed
forms (and mlakit.mha_prefill) on tensors that require grad against PyTorch autograd of a
float64 formula, the eager fast path kept for the others, `deterministic` and the kernel
choice passed to the backward, the gradient of lse refused, and a compiled forward + backward
without graph breaks. Skipped without PyTorch."""

import pytest

torch = pytest.importorskip("torch")

import mlakit  # noqa: E402
import mlakit.torch_ops as ops  # noqa: E402
from torch.library import opcheck  # noqa: E402
from mlakit import _mha_prefill, flash_mla  # noqa: E402
from torch_ops_cases import (  # noqa: E402
    PAGE,
    WITH_GRAD,
    attention_grads,
    backward_of,
    check_grad,
    check_packed_form_gradients,
    eager_and_compiled_grads,
    fake_args,
    gen,
    gqa_args,
    gqa_problem,
    leaves,
    merge_states_args,
    mla_problem,
    v4_sparse_args,
    varlen_problem,
)

OPS = torch.ops.mlakit
# For float8 tensors: opcheck's schema test multiplies them, which float8 cannot on the CPU.
NO_SCHEMA_TEST = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")


def assert_same(a, b):
    assert a.shape == b.shape and a.dtype == b.dtype
    assert torch.equal(a.view(torch.uint8) if a.element_size() == 1 else a, b.view(torch.uint8) if b.element_size() == 1
                       else b) or torch.allclose(a.float(), b.float(), equal_nan=True, rtol=0, atol=0)



def assert_compiles_to_one_graph(fn, *args):
    """fn traces to one graph without a break, and torch.compile(fullgraph=True) of it returns
    exactly the eager outputs."""
    eager = fn(*args)
    explained = torch._dynamo.explain(fn)(*args)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")(*args)
    for a, b in zip(eager, compiled):
        assert torch.equal(a, b)

def test_mla_decode_op_is_the_package_function_and_passes_opcheck():
    q, kv, table, lengths = mla_problem(1)
    plan = ops.mla_decode_plan(lengths, 1, 4, 1)
    out, lse = OPS.mla_decode(q, kv, table, lengths, plan[0], plan[1], 0.07, False)
    ref_out, ref_lse = mlakit.mla_decode(q, kv, table, lengths, 0.07, False)
    assert_same(out, ref_out)
    assert_same(lse, ref_lse)
    opcheck(OPS.mla_decode.default, (q, kv, table, lengths, plan[0], plan[1], None, False))
    opcheck(OPS.mla_decode_schedule.default, (lengths, plan[0], plan[1]))


def test_mla_sparse_ops_pass_opcheck():
    g = gen(2)
    b, s_q, h_q, topk = 2, 2, 4, 8
    q = torch.randn((b, s_q, h_q, 576), generator=g).to(torch.bfloat16)
    cache = OPS.quantize_fp8_cache(torch.randn((3, PAGE, 1, 576), generator=g).to(torch.bfloat16))
    indices = torch.randint(-1, 3 * PAGE, (b, s_q, topk), generator=g, dtype=torch.int32)
    plan = ops.mla_sparse_decode_plan(b, s_q, h_q, topk, q)
    out, lse = OPS.mla_sparse_decode(q, cache, indices, None, None, plan[0], plan[1], None)
    ref_out, ref_lse = mlakit.mla_sparse_decode(q, cache, indices)
    assert_same(out, ref_out)
    assert_same(lse, ref_lse)
    opcheck(OPS.mla_sparse_decode.default, (q, cache, indices, None, None, plan[0], plan[1], None))
    opcheck(OPS.mla_sparse_decode_schedule.default, (None, plan[0], plan[1], s_q))
    qp = torch.randn((5, h_q, 576), generator=g).to(torch.bfloat16)
    kv = torch.randn((30, 1, 576), generator=g).to(torch.bfloat16)
    ip = torch.randint(-1, 30, (5, 1, topk), generator=g, dtype=torch.int32)
    for base in ("e", "2"):
        got = OPS.mla_sparse_prefill(qp, kv, ip, 0.05, 512, None, None, base)
        for a, b_ in zip(got, mlakit.mla_sparse_prefill(qp, kv, ip, 0.05, 512, None, None, base)):
            assert_same(a, b_)
        opcheck(OPS.mla_sparse_prefill.default, (qp, kv, ip, 0.05, 512, None, None, base))


def test_mla_sparse_decode_op_with_v4_tokens_and_a_second_cache_passes_opcheck():
    a = v4_sparse_args(18)
    b, s_q, h_q, _ = a["q"].shape
    plan = ops.mla_sparse_decode_plan(b, s_q, h_q, 8, a["q"], None, 4, a["extra_topk_length"])
    args = (a["q"], a["kv_cache"], a["indices"], None, None, plan[0], plan[1], None, a["extra_kv_cache"],
            a["extra_indices"], a["extra_topk_length"])
    out, lse = OPS.mla_sparse_decode(*args)
    ref_out, ref_lse = mlakit.mla_sparse_decode(**a)
    assert_same(out, ref_out)
    assert_same(lse, ref_lse)
    opcheck(OPS.mla_sparse_decode.default, args)
    opcheck(OPS.mla_sparse_decode_schedule.default, (None, plan[0], plan[1], s_q, a["extra_topk_length"]))
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake = OPS.mla_sparse_decode(*fake_args(mode, args))
    assert [(f.shape, f.dtype) for f in fake] == [(out.shape, out.dtype), (lse.shape, lse.dtype)]
    # The schedule op re-plans the lists its plan was made for: the length tensors as then.
    with pytest.raises(ValueError, match=r"mla_sparse_decode_schedule: extra_topk_length: expected a tensor"):
        OPS.mla_sparse_decode_schedule(None, plan[0], plan[1], s_q)


@pytest.mark.parametrize("cache", ["bf16", "int8", "fp8"])
def test_gqa_ops_pass_opcheck_and_append_in_place(cache):
    q, k, v, table, lengths, (k_new, v_new) = gqa_problem(3)
    scales = {}
    if cache != "bf16":
        k, ks = OPS.quantize_gqa_cache(k, cache, None)
        v, vs = OPS.quantize_gqa_cache(v, cache, None)
        scales = dict(k_scale=ks, v_scale=vs)
        if cache == "fp8":  # as bytes: opcheck's schema test multiplies tensors, which float8 cannot on the CPU
            k, v = k.view(torch.uint8), v.view(torch.uint8)
    plan = ops.gqa_decode_plan(lengths, 1, 8, 2, 64)
    args = gqa_args(q, k, v, table, lengths, plan, **scales)
    out, lse = OPS.gqa_decode(*args)
    ref_out, ref_lse = mlakit.gqa_decode(q, k, v, table, lengths, return_lse=True, **scales)
    assert_same(out, ref_out)
    assert_same(lse, ref_lse)
    opcheck(OPS.gqa_decode.default, args)
    opcheck(OPS.gqa_decode_schedule.default, (lengths, plan[0], plan[1]))
    # The append variant writes the caches (and per-token scales) as the package function does.
    mine = [x.clone() for x in (k, v)] + [s.clone() for s in scales.values()]
    theirs = [x.clone() for x in mine]
    named = lambda xs: dict(k_scale=xs[2], v_scale=xs[3]) if scales else {}  # noqa: E731
    a = list(gqa_args(q, mine[0], mine[1], table, lengths, plan, rope_style="neox", **named(mine)))
    out, _ = OPS.gqa_decode_append(*a[:9], k_new, v_new, *a[9:])
    ref = mlakit.gqa_decode(q, theirs[0], theirs[1], table, lengths, k_new=k_new, v_new=v_new, rope_style="neox",
                            **named(theirs))
    assert_same(out, ref)
    for x, y in zip(mine, theirs):
        assert_same(x, y)
    opcheck(OPS.gqa_decode_append.default, tuple(a[:9]) + (k_new, v_new) + tuple(a[9:]))


def test_cache_tool_ops_match_the_package_functions():
    g = gen(4)
    kv = torch.randn((2, PAGE, 1, 576), generator=g).to(torch.bfloat16)
    packed = OPS.quantize_fp8_cache(kv)
    assert_same(packed, mlakit.quantize_fp8_cache(kv))
    assert_same(OPS.dequantize_fp8_cache(packed), mlakit.dequantize_fp8_cache(packed))
    tokens = torch.randn((3, 576), generator=g).to(torch.bfloat16)
    slots = torch.tensor([0, 17, -1], dtype=torch.int32)
    mine, theirs = packed.clone(), packed.clone()
    OPS.append_fp8_cache(tokens, slots, mine)
    mlakit.append_fp8_cache(tokens, slots, theirs)
    assert torch.equal(mine, theirs) and not torch.equal(mine, packed)
    for args in ((kv,), (packed,)):
        opcheck((OPS.quantize_fp8_cache if args[0] is kv else OPS.dequantize_fp8_cache).default, args)
    opcheck(OPS.append_fp8_cache.default, (tokens, slots, packed.clone()))
    # The DeepSeek V4 cache: the padded-block view (fake and real alike), its tools as ops.
    kv4 = (torch.randn((2, 69, 1, 512), generator=g) / 10).to(torch.bfloat16)
    cache4 = OPS.quantize_fp8_v4_cache(kv4)
    assert_same(cache4, mlakit.quantize_fp8_v4_cache(kv4))
    assert cache4.shape == (2, 69, 1, 584) and cache4.stride() == (40320, 584, 584, 1)  # 69 * 584 = 40296 -> 70 * 576
    assert_same(OPS.dequantize_fp8_v4_cache(cache4), mlakit.dequantize_fp8_v4_cache(cache4))
    tokens4 = torch.randn((3, 512), generator=g).to(torch.bfloat16)
    mine4 = OPS.quantize_fp8_v4_cache(kv4)
    theirs4 = OPS.quantize_fp8_v4_cache(kv4)
    OPS.append_fp8_v4_cache(tokens4, slots, mine4)
    mlakit.append_fp8_v4_cache(tokens4, slots, theirs4)
    assert torch.equal(mine4, theirs4) and not torch.equal(mine4, cache4)
    # opcheck also runs the ops on contiguous copies of the inputs: a page of 64 keeps such a
    # copy's blocks 16-byte aligned (64 * 584 bytes), as the kernels need.
    kv64 = (torch.randn((2, 64, 1, 512), generator=g) / 10).to(torch.bfloat16)
    opcheck(OPS.quantize_fp8_v4_cache.default, (kv64,))
    opcheck(OPS.dequantize_fp8_v4_cache.default, (OPS.quantize_fp8_v4_cache(kv64),))
    opcheck(OPS.append_fp8_v4_cache.default, (tokens4, slots, OPS.quantize_fp8_v4_cache(kv64)))
    _, k, _, table, lengths, (k_new, v_new) = gqa_problem(5)
    values, scale = OPS.quantize_gqa_cache(k, "fp8", torch.tensor([0.02]))
    assert scale.shape == (1,)
    opcheck(OPS.quantize_gqa_cache.default, (k, "fp8", torch.tensor([0.02])), test_utils=NO_SCHEMA_TEST)
    opcheck(OPS.dequantize_gqa_cache.default, (values, scale, "float16"), test_utils=NO_SCHEMA_TEST)
    values, scale = OPS.quantize_gqa_cache(k, "int8", None)
    opcheck(OPS.gqa_cache_append.default,
            (k_new, v_new, values.clone(), values.clone(), table, lengths, scale.clone(), scale.clone(), "gptj",
             10000.0, 0, None))


def test_fake_implementations_give_the_real_shapes_and_dtypes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    cases = []
    for s_q, h_q in ((1, 4), (2, 8)):
        q, kv, table, lengths = mla_problem(6, s_q=s_q, h_q=h_q)
        plan = ops.mla_decode_plan(lengths, s_q, h_q, 1)
        cases.append((OPS.mla_decode, (q, kv, table, lengths, plan[0], plan[1], None, s_q > 1)))
    for d, h_q, h_kv, s_q in ((64, 8, 2, 1), (128, 4, 4, 3), (256, 2, 1, 2)):
        q, k, v, table, lengths, _ = gqa_problem(7, s_q=s_q, h_q=h_q, h_kv=h_kv, d=d, lengths=(9, 30))
        plan = ops.gqa_decode_plan(lengths, s_q, h_q, h_kv, d)
        cases.append((OPS.gqa_decode, gqa_args(q, k, v, table, lengths, plan, causal=True)))
    k = gqa_problem(8)[1]
    cases += [(OPS.quantize_gqa_cache, (k, "int8", None)), (OPS.quantize_fp8_cache, (mla_problem(9)[1],))]
    cases += [(OPS.merge_states, merge_states_args(9, n, rows, d)) for n, rows, d in ((1, (3,), 8), (4, (2, 1, 5), 24))]
    q, k, v, cu_q, cu_k, dout = varlen_problem(9, [3, 0, 5], [4, 2, 5], 4, 2, 192, 128, pad_q=1, pad_k=2)
    out, lse = OPS.mha_prefill(q, k, v, cu_q, cu_k, 5, 5, None, True)
    cases += [(OPS.mha_prefill, (q, k, v, cu_q, cu_k, 5, 5, None, True)),
              (OPS.mha_prefill_backward, (dout, q, k, v, out, lse, cu_q, cu_k, 5, 5, None, True))]
    for op, args in cases:
        real = op(*args)
        with FakeTensorMode(allow_non_fake_inputs=True) as mode:
            fake = op(*fake_args(mode, args))
        real = real if isinstance(real, tuple) else (real,)
        fake = fake if isinstance(fake, tuple) else (fake,)
        assert [(r.shape, r.dtype) for r in real] == [(f.shape, f.dtype) for f in fake], op


def test_a_compiled_two_layer_decode_has_no_graph_break_and_matches_eager():
    q, k, v, table, lengths, _ = gqa_problem(10)
    plan = ops.gqa_decode_plan(lengths, 1, 8, 2, 64)
    mq, kv, mtable, mlengths = mla_problem(11)
    mplan = ops.mla_decode_plan(mlengths, 1, 4, 1)
    w = torch.randn((64, 64), generator=gen(12)).to(torch.bfloat16)

    def step(q, mq):
        torch.ops.mlakit.gqa_decode_schedule(lengths, plan[0], plan[1])
        h = q
        for _ in range(2):  # two layers sharing the step's plan
            h = torch.ops.mlakit.gqa_decode(*gqa_args(h, k, v, table, lengths, plan))[0]
            h = (h.float() @ w.float()).to(torch.bfloat16)
        out, lse = torch.ops.mlakit.mla_decode(mq, kv, mtable, mlengths, mplan[0], mplan[1], None, False)
        return h, out, lse

    assert_compiles_to_one_graph(step, q, mq)


def test_plan_fields_round_trip_and_errors():
    # (A plan of another problem is rejected by the GPU decode, test_gpu_torch_ops.py; host
    # arrays need no plan.)
    lengths = torch.tensor([5, 9], dtype=torch.int32)
    workspace, plan = mlakit.gqa_decode_plan(lengths, 1, 8, 2, 64)
    fields = plan.fields()
    again = mlakit.GqaDecodePlan.from_fields(fields, workspace)
    assert again.fields() == fields and repr(again) == repr(plan)
    with pytest.raises(ValueError, match="expected the fields\\(\\) of a MlaDecodePlan"):
        mlakit.MlaDecodePlan.from_fields(fields, workspace)
    with pytest.raises(ValueError, match="expected the fields\\(\\) of a GqaDecodePlan"):
        mlakit.GqaDecodePlan.from_fields(fields[:-1], workspace)
    wrong_device = list(fields)
    wrong_device[2 + 7] = 0  # the device field: a CUDA plan against a host workspace
    with pytest.raises(ValueError, match="workspace: expected"):
        mlakit.GqaDecodePlan.from_fields(wrong_device, workspace)


def test_mha_prefill_op_is_the_package_function_and_passes_opcheck():
    g = gen(14)
    q = torch.randn((9, 4, 128), generator=g).to(torch.bfloat16)
    k = torch.randn((12, 2, 128), generator=g).to(torch.bfloat16)
    v = torch.randn((12, 2, 128), generator=g).to(torch.bfloat16)
    cu_q, cu_k = torch.tensor([0, 4, 4, 9], dtype=torch.int32), torch.tensor([0, 2, 7, 12], dtype=torch.int32)
    args = (q, k, v, cu_q, cu_k, 5, 5, None, True)
    out, lse = OPS.mha_prefill(*args)
    want_out, want_lse = mlakit.mha_prefill(q, k, v, cu_q, cu_k, 5, 5, None, True)
    assert_same(out, want_out)
    assert_same(lse, want_lse)
    opcheck(OPS.mha_prefill.default, args)
    # With q, k, v requiring grad: the autograd formula's registration. (opcheck's AOTAutograd
    # test backpropagates random gradients into every output, lse's too, which the backward
    # refuses: the compiled backward is tested below.)
    opcheck(OPS.mha_prefill.default, leaves(q, k, v) + args[3:] + ("auto", True), test_utils=WITH_GRAD)


def test_mha_prefill_backward_op_is_the_package_function_and_passes_opcheck():
    q, k, v, cu_q, cu_k, dout = varlen_problem(19, [4, 0, 5], [2, 5, 5], 4, 2, 128, 128, pad_q=2)
    out, lse = OPS.mha_prefill(q, k, v, cu_q, cu_k, 5, 5, 0.1, True)
    args = (dout, q, k, v, out, lse, cu_q, cu_k, 5, 5, 0.1, True)
    got = OPS.mha_prefill_backward(*args)
    for a, b in zip(got, mlakit.mha_prefill_backward(*args)):
        assert_same(a, b)
    opcheck(OPS.mha_prefill_backward.default, args)
    opcheck(OPS.mha_prefill_backward.default, args + (True, "portable"))


# ---- the dense prefill's gradients -----------------------------------------------------------

# Lq < Lk, an empty query side, an empty key side, Lq == Lk, Lq > Lk (under causal its first
# queries see no key), a short one.
LQ, LK = [5, 0, 2, 9, 7, 1], [9, 3, 0, 9, 4, 1]
PAIRS = [(64, 64), (128, 128), (192, 128), (256, 256)]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d_qk,d_v", PAIRS)
def test_flash_attn_varlen_func_gradients_match_autograd_of_a_float64_formula(d_qk, d_v, causal):
    """Through the op's autograd formula, on bf16 tensors (the backward takes D = rowsum(dout *
    out) from the bf16 out, as FlashAttention's: torch_ops_cases.DOUT_STD says why the rule
    holds at these scales)."""
    q, k, v, cu_q, cu_k, dout = varlen_problem(300 + d_qk + causal, LQ, LK, 6, 2, d_qk, d_v, pad_q=2, pad_k=1)
    tq, tk, tv = leaves(q, k, v)
    out, lse = flash_mla.flash_attn_varlen_func(tq, tk, tv, cu_q, cu_k, max(LQ), max(LK), causal=causal)
    assert out.requires_grad and lse.requires_grad
    backward_of((out, lse), dout)
    want = attention_grads(dout, q, k, v, cu_q, cu_k, None, causal)
    for name, leaf, expected in zip(("dq", "dk", "dv"), (tq, tk, tv), want):
        assert leaf.grad.dtype == leaf.dtype and leaf.grad.shape == leaf.shape
        check_grad(leaf.grad, expected, name)  # rows in no sequence included: 0 on the host


@pytest.mark.parametrize("h_kv,scale", [(1, 0.05), (3, None), (6, 0.2)])
def test_gradients_of_gqa_ratios_float16_and_a_given_scale(h_kv, scale):
    q, k, v, cu_q, cu_k, dout = varlen_problem(310 + h_kv, LQ, LK, 6, h_kv, 128, 128, dtype=torch.float16)
    tq, tk, tv = leaves(q, k, v)
    backward_of(flash_mla.flash_attn_varlen_func(tq, tk, tv, cu_q, cu_k, 9, 9, softmax_scale=scale, causal=True),
                dout)
    want = attention_grads(dout, q, k, v, cu_q, cu_k, scale, True)
    for name, leaf, expected in zip(("dq", "dk", "dv"), (tq, tk, tv), want):
        check_grad(leaf.grad, expected, name)


def test_packed_forms_give_gradients_to_qkv_and_kv():
    """The packed tensors' gradients are those of their views, put together by autograd."""
    lengths = [5, 0, 9, 3]
    q, k, v, cu, _, dout = varlen_problem(320, lengths, lengths, 4, 4, 128, 128)
    check_packed_form_gradients(q, k, v, cu, 9, dout, causal=True)


def test_mha_prefill_on_tensors_that_require_grad_is_differentiable_too():
    q, k, v, cu_q, cu_k, dout = varlen_problem(330, LQ, LK, 4, 2, 64, 64)
    a, b = leaves(q, k, v), leaves(q, k, v)
    backward_of(mlakit.mha_prefill(*a, cu_q, cu_k, 9, 9, causal=True), dout)
    backward_of(flash_mla.flash_attn_varlen_func(*b, cu_q, cu_k, 9, 9, causal=True), dout)
    for x, y in zip(a, b):
        assert torch.equal(x.grad, y.grad)


def test_only_calls_that_autograd_records_go_through_the_op():
    """Eager calls on tensors that need no gradient keep the direct path (no op dispatch):
    tensors without requires_grad, and any tensors under torch.no_grad()."""
    q, k, v, cu_q, cu_k, _ = varlen_problem(340, LQ, LK, 4, 2, 64, 64)
    tq, tk, tv = leaves(q, k, v)

    def op_calls(*args):
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            out, _ = flash_mla.flash_attn_varlen_func(*args, cu_q, cu_k, 9, 9, causal=True)
        return sum(e.name == "mlakit::mha_prefill" for e in prof.events()), out

    calls, out = op_calls(q, k, v)
    assert calls == 0 and not out.requires_grad
    with torch.no_grad():
        calls, out = op_calls(tq, tk, tv)
    assert calls == 0 and not out.requires_grad
    calls, out = op_calls(q, k, tv)  # one input requiring grad is enough
    assert calls == 1 and out.requires_grad


def test_deterministic_and_the_kernel_choice_reach_the_backward(monkeypatch):
    seen = []
    backward = _mha_prefill.mha_prefill_backward

    def record(*args):
        seen.append(args[-2:])  # (deterministic, kernel)
        return backward(*args)

    monkeypatch.setattr(_mha_prefill, "mha_prefill_backward", record)
    q, k, v, cu_q, cu_k, dout = varlen_problem(350, LQ, LK, 4, 2, 64, 64)
    for deterministic in (False, True):
        backward_of(flash_mla.flash_attn_varlen_func(*leaves(q, k, v), cu_q, cu_k, 9, 9, causal=True,
                                                     deterministic=deterministic), dout)
    # The forward's kernel choice: 'portable' carries over, 'sm90' asks for 'auto' (the Hopper
    # backward serves fewer head dims than the Hopper forward).
    for kernel in ("portable", "sm90", "auto"):
        backward_of(OPS.mha_prefill(*leaves(q, k, v), cu_q, cu_k, 9, 9, None, True, kernel), dout)
    assert seen == [(False, "auto"), (True, "auto"), (False, "portable"), (False, "auto"), (False, "auto")]


def test_a_gradient_of_lse_is_refused_naming_lse():
    q, k, v, cu_q, cu_k, dout = varlen_problem(360, LQ, LK, 4, 2, 64, 64)
    tq, tk, tv = leaves(q, k, v)
    out, lse = flash_mla.flash_attn_varlen_func(tq, tk, tv, cu_q, cu_k, 9, 9)
    finite = lse.detach().isfinite()
    with pytest.raises(NotImplementedError, match=r"^mha_prefill: lse: .*no gradient of lse"):
        (out.float().sum() + lse[finite].sum()).backward()
    # A zero gradient (lse in the loss with weight 0) is no gradient: out's alone, as without lse.
    out, lse = flash_mla.flash_attn_varlen_func(tq, tk, tv, cu_q, cu_k, 9, 9)
    backward_of((out,), dout)
    want = tq.grad.clone()
    tq.grad = None
    out, lse = flash_mla.flash_attn_varlen_func(tq, tk, tv, cu_q, cu_k, 9, 9)
    ((out.float() * dout.float()).sum() + 0 * lse[finite].sum()).backward()
    assert torch.equal(tq.grad, want)
    # lse alone in the loss: no gradient of out, so q, k, v get none (zero), lse's refused.
    out, lse = flash_mla.flash_attn_varlen_func(tq, tk, tv, cu_q, cu_k, 9, 9)
    with pytest.raises(NotImplementedError, match="lse"):
        lse[finite].sum().backward()


def test_a_compiled_forward_and_backward_has_no_graph_break_and_matches_eager():
    q, k, v, cu_q, cu_k, dout = varlen_problem(370, LQ, LK, 4, 2, 128, 128)
    kv = torch.cat([k, v], dim=-1)

    def loss(q, kv):
        out, lse = flash_mla.flash_attn_varlen_kvpacked_func(q, kv, cu_q, cu_k, 9, 9, 128, causal=True,
                                                             deterministic=True)
        out2, _ = flash_mla.flash_attn_varlen_func(out, kv[:, :, :128], kv[:, :, 128:], cu_q, cu_k, 9, 9)
        return (out2.float() * dout.float()).sum()

    eager, compiled = eager_and_compiled_grads(loss, (q, kv), backend="aot_eager")
    for a, b in zip(eager, compiled):
        assert torch.equal(a, b)


@pytest.mark.parametrize("lse_base,out_lse_base", [("e", "e"), ("2", "e"), ("e", "2")])
def test_merge_states_op_is_the_package_function_and_passes_opcheck(lse_base, out_lse_base):
    o, lse, _, _ = merge_states_args(15)
    out, out_lse = OPS.merge_states(o, lse, lse_base, out_lse_base)
    want_out, want_lse = mlakit.merge_states(o, lse, lse_base=lse_base, out_lse_base=out_lse_base)
    assert_same(out, want_out)
    assert_same(out_lse, want_lse)
    opcheck(OPS.merge_states.default, (o, lse, lse_base, out_lse_base))


def test_merge_states_out_writes_the_callers_buffers_and_passes_opcheck():
    o, lse, lse_base, out_lse_base = merge_states_args(17, 4, (3, 2), 32)
    want_out, want_lse = OPS.merge_states(o, lse, lse_base, out_lse_base)
    out = torch.full(want_out.shape, float("nan"), dtype=torch.float32)  # float32 out of bf16 states
    out_lse = torch.full(want_lse.shape, float("nan"))
    assert OPS.merge_states_out(o, lse, out, out_lse, lse_base, out_lse_base) is None
    assert_same(out.to(torch.bfloat16), want_out)
    assert_same(out_lse, want_lse)
    opcheck(OPS.merge_states_out.default, (o, lse, out, out_lse, lse_base, out_lse_base))


def test_a_compiled_merge_of_gathered_decode_states_has_no_graph_break():
    """The states of W shards gathered as [W, b, s_q, h_q, d] and their LSEs in the decode's
    [W, b, h_q, s_q] layout, merged through views (as examples/context_parallel_decode.py)."""
    g = gen(16)
    o = torch.randn((3, 2, 1, 4, 64), generator=g).to(torch.bfloat16)
    lse = torch.randn((3, 2, 4, 1), generator=g) * 3

    def merge(o, lse):
        out, out_lse = torch.ops.mlakit.merge_states(list(o), list(lse.transpose(2, 3)), "e", "e")
        return out, out_lse.transpose(1, 2)

    assert_compiles_to_one_graph(merge, o, lse)
