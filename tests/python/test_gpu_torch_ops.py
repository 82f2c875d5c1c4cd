"""torch.ops.mlakit.* on CUDA tensors as a serving engine runs them: two-layer decode models
(dense MLA, sparse FP8 MLA, GQA with the fused append) compiled with torch.compile(fullgraph=
True) give the eager results with no graph break; a CUDA graph of schedule + decode replayed
1,000 times with new lengths gives the eager results every time; torch.library.opcheck on
every op; fake shapes against real ones; a plan of another problem is an error; the
mlakit.flash_mla drop-in goes through the ops. Training through flash_attn_varlen_func: a
few SGD steps of a one-layer attention model in bf16 lower its loss, a compiled forward +
backward (fullgraph=True) gives the eager gradients bit for bit in the deterministic mode,
opcheck of the backward op and of the forward op's autograd formula. Skipped without PyTorch,
CUDA, or an mlakit built with CUDA."""

import pytest

torch = pytest.importorskip("torch")

import mlakit  # noqa: E402
import mlakit.torch_ops as ops  # noqa: E402
from mlakit import flash_mla  # noqa: E402
from torch.library import opcheck  # noqa: E402
from torch_cases import capture, require_gpu  # noqa: E402
from torch_ops_cases import (  # noqa: E402
    WITH_GRAD,
    eager_and_compiled_grads,
    fake_args,
    gen,
    gqa_args,
    gqa_problem,
    leaves,
    merge_states_args,
    mla_problem,
    prefix_sums,
    varlen_problem,
)

require_gpu()
OPS = torch.ops.mlakit
CUDA = "cuda"


def sparse_problem(seed, b=2, s_q=2, h_q=64, topk=128, blocks=6):
    g = gen(seed)
    q = torch.randn((b, s_q, h_q, 576), generator=g).to(torch.bfloat16).to(CUDA)
    kv = (torch.randn((blocks, 64, 1, 576), generator=g) / 10).to(torch.bfloat16).to(CUDA)
    cache = OPS.quantize_fp8_cache(kv)
    indices = torch.randint(-1, blocks * 64, (b, s_q, topk), generator=g, dtype=torch.int32).to(CUDA)
    return q, cache, indices


def two_layer_models():
    """(name, step function, its inputs): each step re-schedules for the step's lengths and
    runs two layers sharing the plan, with an exact elementwise op between them."""
    models = []
    q, kv, table, lengths = mla_problem(1, lengths=(300, 77, 1), h_q=16, device=CUDA)
    plan = ops.mla_decode_plan(lengths, 1, 16, 1)

    def mla_step(q):
        OPS.mla_decode_schedule(lengths, plan[0], plan[1])
        out, lse = OPS.mla_decode(q, kv, table, lengths, plan[0], plan[1], None, False)
        out2, lse2 = OPS.mla_decode(torch.cat([out, out[..., :64]], -1) * 0.5, kv, table, lengths, plan[0], plan[1],
                                    None, False)
        return out2, lse + lse2

    models.append(("mla", mla_step, (q,)))
    sq, cache, indices = sparse_problem(2)
    splan = ops.mla_sparse_decode_plan(2, 2, 64, 128, sq)

    def sparse_step(q):
        OPS.mla_sparse_decode_schedule(None, splan[0], splan[1], 2)
        out, lse = OPS.mla_sparse_decode(q, cache, indices, None, None, splan[0], splan[1], None)
        q2 = torch.cat([out, out[..., :64]], -1) * 0.5
        return OPS.mla_sparse_decode(q2, cache, indices, None, None, splan[0], splan[1], None)

    models.append(("sparse", sparse_step, (sq,)))
    gq, k, v, gtable, glengths, (k_new, v_new) = gqa_problem(3, lengths=(700, 64, 5), h_q=16, h_kv=4, d=128,
                                                            device=CUDA)
    k, ks = OPS.quantize_gqa_cache(k, "int8", None)
    v, vs = OPS.quantize_gqa_cache(v, "int8", None)
    gplan = ops.gqa_decode_plan(glengths, 1, 16, 4, 128)

    def gqa_step(q, k_cache, v_cache, k_scale, v_scale):
        OPS.gqa_decode_schedule(glengths, gplan[0], gplan[1])
        a = gqa_args(q, k_cache, v_cache, gtable, glengths, gplan, k_scale=k_scale, v_scale=v_scale,
                     rope_style="neox")
        out, lse = OPS.gqa_decode_append(*a[:9], k_new, v_new, *a[9:])
        out2, lse2 = OPS.gqa_decode(*gqa_args(out * 0.5, k_cache, v_cache, gtable, glengths, gplan, k_scale=k_scale,
                                              v_scale=v_scale))
        return out2, lse + lse2

    models.append(("gqa", gqa_step, (gq, k, v, ks, vs)))
    return models


@pytest.mark.parametrize("index", range(3))
def test_compiled_two_layer_models_have_no_graph_break_and_match_eager(index):
    name, step, inputs = two_layer_models()[index]
    fresh = lambda: [x.clone() for x in inputs]  # noqa: E731  (the GQA step appends to its caches)
    eager = step(*fresh())
    explained = torch._dynamo.explain(step)(*fresh())
    assert explained.graph_break_count == 0, (name, explained.break_reasons)
    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True)(*fresh())
    torch.cuda.synchronize()
    for a, b in zip(eager, compiled):
        assert torch.equal(a, b), name


def test_a_cuda_graph_replayed_1000_times_with_new_lengths_matches_eager():
    g = gen(4)
    b, max_len = 4, 900
    q, kv, table, lengths = mla_problem(5, lengths=(max_len,) * b, h_q=16, device=CUDA)
    gq, k, v, gtable, glengths, _ = gqa_problem(6, lengths=(max_len,) * b, h_q=16, h_kv=2, d=128, device=CUDA)
    plan = ops.mla_decode_plan(lengths, 1, 16, 1)
    gplan = ops.gqa_decode_plan(glengths, 1, 16, 2, 128)

    def step():
        OPS.mla_decode_schedule(lengths, plan[0], plan[1])
        OPS.gqa_decode_schedule(glengths, gplan[0], gplan[1])
        return (OPS.mla_decode(q, kv, table, lengths, plan[0], plan[1], None, False)[0],
                OPS.gqa_decode(*gqa_args(gq, k, v, gtable, glengths, gplan))[0])

    graph, outs = capture(step)
    for replay in range(1000):
        new = torch.randint(0, max_len + 1, (b,), generator=g, dtype=torch.int32)
        lengths.copy_(new)
        glengths.copy_(new)
        graph.replay()
        want_mla = mlakit.mla_decode(q, kv, table, lengths)[0]
        want_gqa = mlakit.gqa_decode(gq, k, v, gtable, glengths)
        assert torch.equal(outs[0], want_mla), replay
        assert torch.equal(outs[1], want_gqa), replay


def test_opcheck_passes_for_every_op_on_the_gpu():
    q, kv, table, lengths = mla_problem(7, device=CUDA)
    plan = ops.mla_decode_plan(lengths, 1, 4, 1)
    opcheck(OPS.mla_decode.default, (q, kv, table, lengths, plan[0], plan[1], None, False))
    opcheck(OPS.mla_decode_schedule.default, (lengths, plan[0], plan[1]))
    sq, cache, indices = sparse_problem(8)
    splan = ops.mla_sparse_decode_plan(2, 2, 64, 128, sq)
    opcheck(OPS.mla_sparse_decode.default, (sq, cache, indices, None, None, splan[0], splan[1], None))
    opcheck(OPS.mla_sparse_decode_schedule.default, (None, splan[0], splan[1], 2))
    qp = sq[0]
    kvp = OPS.dequantize_fp8_cache(cache).view(-1, 1, 576)
    opcheck(OPS.mla_sparse_prefill.default, (qp, kvp, indices[0].unsqueeze(1), 0.05, 512, None, None, "e"))
    gq, k, v, gtable, glengths, (k_new, v_new) = gqa_problem(9, device=CUDA)
    gplan = ops.gqa_decode_plan(glengths, 1, 8, 2, 64)
    opcheck(OPS.gqa_decode.default, gqa_args(gq, k, v, gtable, glengths, gplan))
    a = gqa_args(gq, k.clone(), v.clone(), gtable, glengths, gplan, rope_style="gptj")
    opcheck(OPS.gqa_decode_append.default, a[:9] + (k_new, v_new) + a[9:])
    opcheck(OPS.gqa_decode_schedule.default, (glengths, gplan[0], gplan[1]))
    values, scale = OPS.quantize_gqa_cache(k, "int8", None)
    opcheck(OPS.quantize_gqa_cache.default, (k, "int8", None))
    opcheck(OPS.dequantize_gqa_cache.default, (values, scale, "bfloat16"))
    opcheck(OPS.gqa_cache_append.default, (k_new, v_new, values.clone(), values.clone(), gtable, glengths,
                                           scale.clone(), scale.clone(), "neox", 10000.0, 0, None))
    tokens = torch.randn((3, 576), device=CUDA).to(torch.bfloat16)
    opcheck(OPS.quantize_fp8_cache.default, (tokens,))
    opcheck(OPS.dequantize_fp8_cache.default, (cache,))
    opcheck(OPS.append_fp8_cache.default, (tokens, torch.tensor([0, 70, -1], dtype=torch.int32, device=CUDA),
                                           cache.clone()))
    opcheck(OPS.merge_states.default, merge_states_args(15, 4, (3, 1, 16), 512, "2", "e", device=CUDA))
    o, lse, lse_base, out_lse_base = merge_states_args(16, 2, (8, 4), 128, device=CUDA)
    out, out_lse = torch.empty_like(o[0]), torch.empty_like(lse[0])
    opcheck(OPS.merge_states_out.default, (o, lse, out, out_lse, lse_base, out_lse_base))


def test_fake_shapes_match_real_ones_across_a_sweep():
    from torch._subclasses.fake_tensor import FakeTensorMode

    cases = []
    for s_q, h_q in ((1, 16), (2, 64), (4, 128)):
        q, kv, table, lengths = mla_problem(10, lengths=(90, 3), s_q=s_q, h_q=h_q, device=CUDA)
        plan = ops.mla_decode_plan(lengths, s_q, h_q, 1)
        cases.append((OPS.mla_decode, (q, kv, table, lengths, plan[0], plan[1], None, True)))
    for d, h_q, h_kv, s_q in ((64, 8, 2, 1), (128, 32, 8, 2), (256, 4, 1, 8)):
        q, k, v, table, lengths, _ = gqa_problem(11, s_q=s_q, h_q=h_q, h_kv=h_kv, d=d, lengths=(40, 9), device=CUDA)
        plan = ops.gqa_decode_plan(lengths, s_q, h_q, h_kv, d, True)
        cases.append((OPS.gqa_decode, gqa_args(q, k, v, table, lengths, plan, causal=True)))
    sq, cache, indices = sparse_problem(12)
    splan = ops.mla_sparse_decode_plan(2, 2, 64, 128, sq)
    cases.append((OPS.mla_sparse_decode, (sq, cache, indices, None, None, splan[0], splan[1], None)))
    for n, rows, d in ((1, (7,), 20), (2, (33, 8), 128), (8, (4, 2, 128), 512)):
        cases.append((OPS.merge_states, merge_states_args(12, n, rows, d, device=CUDA)))
    for op, args in cases:
        real = op(*args)
        with FakeTensorMode(allow_non_fake_inputs=True) as mode:
            fake = op(*fake_args(mode, args))
        assert [(r.shape, r.dtype, r.device) for r in real] == [(f.shape, f.dtype, f.device) for f in fake], op


def test_a_plan_of_another_problem_is_an_error():
    q, k, v, table, lengths, _ = gqa_problem(13, device=CUDA)
    other = ops.gqa_decode_plan(lengths, 1, 4, 2, 64)  # made for h_q 4, q has 8
    with pytest.raises(ValueError, match="h_q"):
        OPS.gqa_decode(*gqa_args(q, k, v, table, lengths, other))
    small = ops.gqa_decode_plan(lengths, 1, 8, 2, 64)
    with pytest.raises(ValueError, match="workspace: expected"):
        OPS.gqa_decode(*gqa_args(q, k, v, table, lengths, (small[0][:16], small[1])))


def test_flash_mla_drop_in_calls_the_extension_directly_in_eager_mode():
    q, kv, table, lengths = mla_problem(14, lengths=(500, 40), h_q=16, device=CUDA)
    metadata, splits = flash_mla.get_mla_metadata(lengths, 16, 1)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        out, lse = flash_mla.flash_mla_with_kvcache(q, kv, table, lengths, 512, metadata, splits)
    # Eager: no torch.ops dispatch (its host cost exceeds a short decode); compiled: the op.
    assert not any(e.name == "mlakit::mla_decode" for e in prof.events())
    want_out, want_lse = mlakit.mla_decode(q, kv, table, lengths)
    assert torch.equal(out, want_out) and torch.equal(lse, want_lse)


def test_v4_cache_tool_ops_on_cuda_match_the_cpu_bit_for_bit():
    g = gen(77)
    kv = (torch.randn((3, 64, 1, 512), generator=g) / 10).to(torch.bfloat16)
    tokens = torch.randn((4, 512), generator=g).to(torch.bfloat16)
    slots = torch.tensor([0, 65, -1, 191], dtype=torch.int32)
    host = OPS.quantize_fp8_v4_cache(kv)
    device = OPS.quantize_fp8_v4_cache(kv.to(CUDA))
    assert device.stride() == host.stride() and torch.equal(device.cpu(), host)
    assert torch.equal(OPS.dequantize_fp8_v4_cache(device).cpu(), OPS.dequantize_fp8_v4_cache(host))
    OPS.append_fp8_v4_cache(tokens, slots, host)
    OPS.append_fp8_v4_cache(tokens.to(CUDA), slots.to(CUDA), device)
    assert torch.equal(device.cpu(), host)
    opcheck(OPS.quantize_fp8_v4_cache.default, (kv.to(CUDA),))
    opcheck(OPS.dequantize_fp8_v4_cache.default, (device,))
    opcheck(OPS.append_fp8_v4_cache.default, (tokens.to(CUDA), slots.to(CUDA), OPS.quantize_fp8_v4_cache(kv.to(CUDA))))


# ---- training through flash_attn_varlen_func ---------------------------------------------------


def test_a_few_sgd_steps_of_one_attention_layer_lower_the_loss():
    """x -> q, k, v projections (GQA: 8 query heads, 2 kv heads of 64) -> causal varlen
    attention -> output projection, regressed onto a fixed random target; float32 weights
    cast to bf16 in the forward (so that small updates are not lost to bf16 rounding)."""
    g = gen(20)
    lengths, dim, h_q, h_kv, d = [70, 0, 33, 128, 5], 256, 8, 2, 64
    cu = prefix_sums(lengths, CUDA)
    total = sum(lengths)
    x = torch.randn((total, dim), generator=g).to(torch.bfloat16).to(CUDA)
    target = (torch.randn((total, dim), generator=g) / 4).to(torch.bfloat16).to(CUDA)
    weights = [(torch.randn(shape, generator=g) * dim**-0.5).to(CUDA).requires_grad_()
               for shape in ((dim, h_q * d), (dim, h_kv * d), (dim, h_kv * d), (h_q * d, dim))]

    def loss():
        wq, wk, wv, wo = (w.to(torch.bfloat16) for w in weights)
        q, k, v = ((x @ w).view(total, -1, d) for w in (wq, wk, wv))
        out, _ = flash_mla.flash_attn_varlen_func(q, k, v, cu, cu, max(lengths), max(lengths), causal=True)
        return ((out.reshape(total, h_q * d) @ wo).float() - target.float()).pow(2).mean()

    losses = []
    for _ in range(8):
        value = loss()
        value.backward()
        with torch.no_grad():
            for w in weights:
                assert torch.isfinite(w.grad).all() and w.grad.abs().sum() > 0
                w -= 0.5 * w.grad
                w.grad = None
        losses.append(float(value))
    assert all(b < a for a, b in zip(losses, losses[1:])), losses
    assert losses[-1] < 0.9 * losses[0], losses


def test_a_compiled_forward_and_backward_matches_eager_bit_for_bit():
    q, k, v, cu_q, cu_k, dout = varlen_problem(21, [130, 0, 77, 5], [200, 3, 77, 0], 8, 2, 128, 128, device=CUDA)
    kv = torch.cat([k, v], dim=-1)

    def loss(q, kv):
        out, _ = flash_mla.flash_attn_varlen_kvpacked_func(q, kv, cu_q, cu_k, 130, 200, 128, causal=True,
                                                           deterministic=True)
        out2, _ = flash_mla.flash_attn_varlen_func(out * 0.5, kv[:, :, :128], kv[:, :, 128:], cu_q, cu_k, 130, 200,
                                                   deterministic=True)
        return (out2.float() * dout.float()).sum()

    eager, compiled = eager_and_compiled_grads(loss, (q, kv))
    # The loss: Inductor fuses the product and the sum (another float32 summation order); the
    # gradients: the ops' own results, bit for bit in the deterministic mode.
    torch.testing.assert_close(compiled[0], eager[0], rtol=1e-5, atol=0)
    for a, b in zip(eager[1:], compiled[1:]):
        assert torch.equal(a, b)


def test_opcheck_of_the_backward_and_of_the_autograd_formula_on_the_gpu():
    q, k, v, cu_q, cu_k, dout = varlen_problem(22, [5, 0, 9], [7, 2, 9], 4, 2, 128, 128, device=CUDA)
    out, lse = OPS.mha_prefill(q, k, v, cu_q, cu_k, 9, 9, None, True)
    opcheck(OPS.mha_prefill_backward.default, (dout, q, k, v, out, lse, cu_q, cu_k, 9, 9, None, True, True))
    opcheck(OPS.mha_prefill_backward.default, (dout, q, k, v, out, lse, cu_q, cu_k, 9, 9, 0.1, False, True,
                                               "portable"))
    opcheck(OPS.mha_prefill.default, leaves(q, k, v) + (cu_q, cu_k, 9, 9, None, True, "auto", True),
            test_utils=WITH_GRAD)
