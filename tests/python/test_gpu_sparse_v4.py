"""The sparse decode of DeepSeek V4 tokens (q d_qk 512 over the 584-byte cache) and with a
second cache, on PyTorch CUDA tensors: mlakit.mla_sparse_decode, mlakit.flash_mla (the
FlashMLASchedMeta object and the metadata arrays) and torch.ops.mlakit.mla_sparse_decode
(opcheck, fake shapes, torch.compile without a graph break), each against the host reference
(mlakit on CPU copies) and the NumPy float64 decode of sparse_v4_cases.py; a CUDA graph of a
flash_mla step with a second cache replayed with new lengths. Caches are written byte by byte
with their last block, the unused scale bytes and the block padding poisoned (0xFF). Skipped
without torch, CUDA, or an mlakit built with CUDA."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import mlakit  # noqa: E402
import mlakit.torch_ops as ops  # noqa: E402
from accuracy import check_out, check_stat  # noqa: E402
from mlakit import flash_mla  # noqa: E402
from sparse_v4_cases import (  # noqa: E402
    V4_D_QK,
    V32_D_QK,
    indices_into,
    lengths,
    queries,
    reference,
    split_case,
    v4_cache,
    v32_cache,
)
from torch.library import opcheck  # noqa: E402
from torch_cases import capture, require_gpu  # noqa: E402
from torch_ops_cases import fake_args  # noqa: E402

require_gpu()
CUDA = "cuda"
OPS = torch.ops.mlakit
LAYOUTS = {"v4": (v4_cache, V4_D_QK), "v32": (v32_cache, V32_D_QK)}


def on(device, x):
    """A NumPy array of the cases as a tensor on `device` (uint16 bit patterns as bfloat16)."""
    if x is None:
        return None
    t = torch.from_numpy(np.ascontiguousarray(x))
    return (t.view(torch.bfloat16) if x.dtype == np.uint16 else t).to(device)


class Case:
    """One sparse decode problem in NumPy (q, caches, index lists, lengths, sink) and its
    arguments on a device."""

    def __init__(self, seed, b, s_q, h_q, topk, extra_topk=0, options=False, layout="v4", page=64, extra_page=32,
                 num_blocks=40):
        make, d_qk = LAYOUTS[layout]
        rng = np.random.default_rng(seed)
        self.b, self.s_q, self.h_q, self.topk, self.extra_topk = b, s_q, h_q, topk, extra_topk
        self.q = queries(rng, b, s_q, h_q, d_qk)
        self.cache = make(rng, num_blocks, page)
        self.indices = indices_into(rng, b, s_q, topk, self.cache)
        self.topk_length = lengths(rng, b, topk) if options else None
        self.sink = rng.standard_normal(h_q).astype(np.float32) if options else None
        self.extra = self.extra_indices = self.extra_topk_length = None
        if extra_topk:
            self.extra = make(rng, max(2, num_blocks // 2), extra_page)
            self.extra_indices = indices_into(rng, b, s_q, extra_topk, self.extra)
            self.extra_topk_length = lengths(rng, b, extra_topk) if options else None

    def lists(self):
        main = [(self.cache, self.indices, self.topk_length)]
        return main + ([(self.extra, self.extra_indices, self.extra_topk_length)] if self.extra_topk else [])

    def args(self, device=CUDA):
        """The keyword arguments of mlakit.mla_sparse_decode on `device`."""
        return dict(
            q=on(device, self.q),
            kv_cache=self.cache.torch(device),
            indices=on(device, self.indices),
            topk_length=on(device, self.topk_length),
            attn_sink=on(device, self.sink),
            extra_kv_cache=None if self.extra is None else self.extra.torch(device),
            extra_indices=on(device, self.extra_indices),
            extra_topk_length=on(device, self.extra_topk_length),
        )


def to_numpy(t):
    return t.detach().float().cpu().numpy()


def check_references(out, lse, case, scale=None):
    """out and lse against the NumPy float64 decode and against the host reference (mlakit
    on CPU copies of the same arguments)."""
    ref_out, ref_lse = reference(case.q, case.lists(), scale=scale, sink=case.sink)
    check_out(to_numpy(out), ref_out)
    check_stat(to_numpy(lse), ref_lse)
    host_out, host_lse = mlakit.mla_sparse_decode(**case.args("cpu"), softmax_scale=scale)
    check_out(to_numpy(out), to_numpy(host_out), "out against the host reference")
    check_stat(to_numpy(lse), host_lse.numpy().astype(np.float64), "lse against the host reference")


CASES = {
    # (b, s_q, h_q, topk, extra_topk, options, layout, extra_page)
    "v4_decode": (4, 1, 128, 2048, 0, False, "v4", 64),
    "v4_two_caches_mtp_lengths_sink": (3, 2, 64, 512, 128, True, "v4", 64),
    "v4_two_caches_h128": (2, 1, 128, 1024, 512, False, "v4", 32),
    "v4_two_caches_small": (2, 2, 16, 64, 64, True, "v4", 32),
    "v32_two_caches": (3, 2, 64, 512, 128, True, "v32", 64),
}


@pytest.mark.parametrize("name", CASES)
def test_sparse_decode_matches_the_references(name):
    b, s_q, h_q, topk, extra_topk, options, layout, extra_page = CASES[name]
    case = Case(len(name), b, s_q, h_q, topk, extra_topk, options, layout, extra_page=extra_page)
    a = case.args()
    plan = mlakit.mla_sparse_decode_plan(b, s_q, h_q, topk, a["q"], a["topk_length"], extra_topk,
                                         a["extra_topk_length"])
    out, lse = mlakit.mla_sparse_decode(**a, plan=plan)
    assert out.dtype == torch.bfloat16 and out.shape == (b, s_q, h_q, 512) and lse.shape == (b, h_q, s_q)
    check_references(out, lse, case)
    assert torch.all(lse[0, :, -1] == float("inf")) and torch.all(out[0, -1] == 0)  # no valid index anywhere
    for _ in range(3):  # the same plan and inputs: the same bits
        again = mlakit.mla_sparse_decode(**a, plan=plan)
        assert torch.equal(again[0], out) and torch.equal(again[1], lse)
    out, lse = mlakit.mla_sparse_decode(**a, softmax_scale=0.05)  # a plan made here
    check_references(out, lse, case, scale=0.05)


def test_a_plan_for_other_lists_is_an_error():
    case = Case(60, 2, 1, 64, 128, 64)
    a = case.args()
    without = mlakit.mla_sparse_decode_plan(2, 1, 64, 128, a["q"])
    with pytest.raises(ValueError, match=r"plan: expected a plan for topk = 128, extra_topk = 64"):
        mlakit.mla_sparse_decode(**a, plan=without)
    with_lengths = mlakit.mla_sparse_decode_plan(2, 1, 64, 128, a["q"], extra_topk=64,
                                                 extra_topk_length=torch.ones(2, dtype=torch.int32, device=CUDA))
    with pytest.raises(ValueError, match=r"extra_topk_length: expected a tensor \(as given to mla_sparse_decode_plan"):
        mlakit.mla_sparse_decode(**a, plan=with_lengths)


@pytest.mark.parametrize("layout", ["v4", "v32"])
def test_a_second_cache_holding_part_of_a_list_gives_the_one_list_result(layout):
    make, d_qk = LAYOUTS[layout]
    rng = np.random.default_rng(61)
    b, s_q, h_q, topk, cut = 3, 2, 64, 512, 384
    cache = make(rng, 20, 64)
    q = queries(rng, b, s_q, h_q, d_qk)
    idx = indices_into(rng, b, s_q, topk, cache)
    n = np.array([topk, 400, 100], dtype=np.int32)
    first, first_n, other, second, second_n = split_case(rng, cache, idx, n, cut)
    out, lse = mlakit.mla_sparse_decode(on(CUDA, q), cache.torch(CUDA), on(CUDA, first), on(CUDA, first_n),
                                        extra_kv_cache=other.torch(CUDA), extra_indices=on(CUDA, second),
                                        extra_topk_length=on(CUDA, second_n))
    one_out, one_lse = mlakit.mla_sparse_decode(on(CUDA, q), cache.torch(CUDA), on(CUDA, idx), on(CUDA, n))
    ref_out, ref_lse = reference(q, [(cache, idx, n)])
    for o, l in ((out, lse), (one_out, one_lse)):
        check_out(to_numpy(o), ref_out)
        check_stat(to_numpy(l), ref_lse)


# ---- mlakit.flash_mla --------------------------------------------------------------------------


def flash_call(meta, a, num_splits=None, **kw):
    """flash_mla_with_kvcache of a Case's arguments, the FP8 caches as FlashMLA passes them
    (float8 views)."""
    extra = a["extra_kv_cache"]
    return flash_mla.flash_mla_with_kvcache(
        a["q"], a["kv_cache"].view(torch.float8_e4m3fn), None, None, 512, meta, num_splits, is_fp8_kvcache=True,
        indices=a["indices"], attn_sink=a["attn_sink"], topk_length=a["topk_length"],
        extra_k_cache=None if extra is None else extra.view(torch.float8_e4m3fn),
        extra_indices_in_kvcache=a["extra_indices"], extra_topk_length=a["extra_topk_length"], **kw,
    )


@pytest.mark.parametrize("layout", ["v4", "v32"])
def test_flash_mla_object_form_with_a_second_cache(layout):
    case = Case(62, 3, 2, 64, 512, 128, True, layout)
    a = case.args()
    meta, _ = flash_mla.get_mla_metadata()
    out, lse = flash_call(meta, a)
    check_references(out, lse, case)
    assert (meta.config.extra_page_block_size, meta.config.extra_topk) == (32, 128)
    assert meta.tile_scheduler_metadata.is_cuda and meta.num_splits.shape == (3 * 2 + 1,)
    again = flash_call(meta, a)  # a later layer of the step reuses the schedule
    assert torch.equal(again[0], out) and torch.equal(again[1], lse)
    wider = dict(a, extra_indices=torch.cat([a["extra_indices"]] * 2, dim=-1))
    with pytest.raises(ValueError, match=r"config\.extra_topk: expected 128 \(the first call's\), got 256"):
        flash_call(meta, wider)


def test_flash_mla_metadata_arrays_serve_v4_calls_without_a_second_cache():
    case = Case(63, 2, 2, 64, 256, 0, False, "v4")
    a = case.args()
    cache_seqlens = torch.zeros(2, dtype=torch.int32, device=CUDA)  # not used by the sparse decode
    meta, num_splits = flash_mla.get_mla_metadata(cache_seqlens, 2 * 64, 1, 64, True, 256)
    out, lse = flash_call(meta, a, num_splits)
    check_references(out, lse, case)
    two = Case(64, 2, 2, 64, 256, 64, False, "v4").args()
    with pytest.raises(ValueError, match=r"extra_indices_in_kvcache: the schedule was made without a second cache.*"
                                         r"get_mla_metadata\(\*args\) has no extra arguments"):
        flash_call(meta, two, num_splits)


def test_flash_mla_drop_in_with_a_second_cache_calls_the_extension_directly_in_eager_mode():
    case = Case(65, 2, 1, 64, 128, 64, True)
    a = case.args()
    meta, _ = flash_mla.get_mla_metadata()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        out, lse = flash_call(meta, a)
    assert not any(e.name == "mlakit::mla_sparse_decode" for e in prof.events())  # eager: no op dispatch
    check_references(out, lse, case)


def test_cuda_graph_of_a_flash_mla_step_with_a_second_cache_replays_with_new_lengths():
    """The step's metadata (its first call plans) and every layer's decode are captured; each
    replay plans again from the lengths then in topk_length and extra_topk_length."""
    layers, b, s_q, h_q, topk, extra_topk = 3, 3, 2, 64, 512, 128
    cases = [Case(66 + i, b, s_q, h_q, topk, extra_topk, True) for i in range(layers)]
    args = [c.args() for c in cases]
    topk_length, extra_topk_length = args[0]["topk_length"], args[0]["extra_topk_length"]
    for a in args:  # one pair of length tensors for the step, as an engine has
        a["topk_length"], a["extra_topk_length"] = topk_length, extra_topk_length

    def step():
        meta, _ = flash_mla.get_mla_metadata()
        return [flash_call(meta, a) for a in args]

    graph, results = capture(step)
    rng = np.random.default_rng(69)
    for replay in range(4):
        n, extra_n = lengths(rng, b, topk), lengths(rng, b, extra_topk)
        topk_length.copy_(on(CUDA, n))
        extra_topk_length.copy_(on(CUDA, extra_n))
        graph.replay()
        torch.cuda.synchronize()
        for case, (out, lse) in zip(cases, results):
            case.topk_length, case.extra_topk_length = n, extra_n
            ref_out, ref_lse = reference(case.q, case.lists(), sink=case.sink)
            check_out(to_numpy(out), ref_out, f"out, replay {replay}")
            check_stat(to_numpy(lse), ref_lse, f"lse, replay {replay}")


# ---- torch.ops.mlakit --------------------------------------------------------------------------


def op_args(case, plan):
    a = case.args()
    return (a["q"], a["kv_cache"], a["indices"], a["topk_length"], a["attn_sink"], plan[0], plan[1], None,
            a["extra_kv_cache"], a["extra_indices"], a["extra_topk_length"])


def test_the_op_with_a_second_cache_is_the_function_and_passes_opcheck():
    case = Case(70, 2, 2, 64, 128, 64, True)
    a = case.args()
    plan = ops.mla_sparse_decode_plan(2, 2, 64, 128, a["q"], a["topk_length"], 64, a["extra_topk_length"])
    args = op_args(case, plan)
    out, lse = OPS.mla_sparse_decode(*args)
    want = mlakit.mla_sparse_decode(**a, plan=(plan[0], mlakit.MlaDecodePlan.from_fields(plan[1], plan[0])))
    assert torch.equal(out, want[0]) and torch.equal(lse, want[1])
    check_references(out, lse, case)
    opcheck(OPS.mla_sparse_decode.default, args)
    opcheck(OPS.mla_sparse_decode_schedule.default, (a["topk_length"], plan[0], plan[1], 2, a["extra_topk_length"]))
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake = OPS.mla_sparse_decode(*fake_args(mode, args))
    assert [(f.shape, f.dtype, f.device) for f in fake] == [(r.shape, r.dtype, r.device) for r in (out, lse)]


def test_a_compiled_two_layer_v4_step_with_a_second_cache_has_no_graph_break():
    case = Case(71, 2, 2, 64, 256, 64, True)
    a = case.args()
    plan = ops.mla_sparse_decode_plan(2, 2, 64, 256, a["q"], a["topk_length"], 64, a["extra_topk_length"])
    _, cache, idx, n, sink, ws, fields, _, extra, extra_idx, extra_n = op_args(case, plan)

    def step(q):
        OPS.mla_sparse_decode_schedule(n, ws, fields, 2, extra_n)
        out, lse = OPS.mla_sparse_decode(q, cache, idx, n, sink, ws, fields, None, extra, extra_idx, extra_n)
        out2, lse2 = OPS.mla_sparse_decode(out * 0.5, cache, idx, n, sink, ws, fields, None, extra, extra_idx,
                                           extra_n)
        return out2, lse + lse2

    eager = step(a["q"])
    explained = torch._dynamo.explain(step)(a["q"])
    assert explained.graph_break_count == 0, explained.break_reasons
    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True)(a["q"])
    torch.cuda.synchronize()
    for x, y in zip(eager, compiled):
        assert torch.equal(x, y)
