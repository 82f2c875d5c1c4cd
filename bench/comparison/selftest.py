"""What can be checked without a GPU, on tiny problems on the CPU: the case table, the data
conventions, the references and checks (against mlakit's float64 CPU reference where mlakit
is importable, which its drop-in runs for host tensors), the SDPA side (math backend), the
eager PyTorch merge, the run loop with wall-clock stand-ins for the GPU timers, the JSON
lines, the table and the chart."""

from __future__ import annotations

import contextlib
import importlib
import os
import tempfile
import time
import types
from typing import Any, Callable, List

import torch

from . import cases, chart, data, reference, report, runner, sides, timing

FAILURES: List[str] = []


def expect(ok: bool, what: str) -> None:
    print(("ok    " if ok else "FAIL  ") + what)
    if not ok:
        FAILURES.append(what)


def _case(family: str, **params: Any) -> cases.Case:
    return cases.Case(f"{family}_tiny_" + "_".join(f"{k}{v}" for k, v in params.items()), family, params)


DENSE = _case("dense_decode", b=4, s_q=2, h_q=16, h_kv=1, s_k=200, page=64, causal=True, varlen=True)
SPARSE = _case("sparse_decode", b=2, s_q=2, h_q=16, topk=64, s_k=512, page=64)
PREFILL = _case("sparse_prefill", s_q=48, h_q=16, topk=64, s_kv=1024, indices="near_end", window=200)
SPARSE_V4 = _case("sparse_decode_v4", b=3, s_q=2, h_q=16, topk=64, page=64, s_k=300, extra_topk=40, extra_page=2)
PREFILL_D512 = _case("sparse_prefill", s_q=48, h_q=16, topk=64, s_kv=1024, indices="uniform", window=0, d_qk=512)
SDPA = _case("sdpa_mha", b=1, h=2, s=64, d=32, causal=True)
GQA = {cache + ("_append" if append else ""): _case("gqa", b=3, s_q=1, h_q=8, h_kv=2, s_k=192, d=64, page=64,
                                                     cache=cache, append=append)
       for cache, append in (("bf16", False), ("int8", False), ("fp8", False), ("bf16", True))}
MHA = _case("mha_prefill", b=2, h=2, s=48, d_qk=64, d_v=64, causal=True, varlen=False)
MHA_D192 = _case("mha_prefill", b=2, h=2, s=48, d_qk=192, d_v=128, causal=True, varlen=False)
VARLEN = {causal: _case("mha_prefill", tokens=200, min_s=16, max_s=96, h=2, d_qk=64, d_v=64, causal=causal, varlen=True)
          for causal in (False, True)}
MHA_GQA = _case("mha_prefill", b=2, h=4, h_kv=2, s=40, d_qk=64, d_v=64, causal=True, varlen=False)
# The backward: the same shapes (the forward's q, k, v, dout added), and GQA (h_q 4 over h_kv 2)
# varlen, causal.
BWD = _case("mha_backward", b=2, h=2, s=48, d_qk=64, d_v=64, causal=True, varlen=False)
BWD_D192 = _case("mha_backward", b=2, h=2, s=48, d_qk=192, d_v=128, causal=False, varlen=False)
BWD_VARLEN = {causal: _case("mha_backward", tokens=200, min_s=16, max_s=96, h=2, d_qk=64, d_v=64, causal=causal,
                            varlen=True) for causal in (False, True)}
BWD_GQA = _case("mha_backward", tokens=160, min_s=16, max_s=96, h=4, h_kv=2, d_qk=64, d_v=64, causal=True, varlen=True)
BWD_CASES = (BWD, BWD_D192, BWD_VARLEN[False], BWD_VARLEN[True], BWD_GQA)
# s_q 2 in the decode layout: the LSE view's strides differ from a contiguous tensor's.
MERGE = {"cp_decode": cases._merge(3, (4, 2, 8), 64, lse_layout="decode"),
         "fp32_to_bf16": cases._merge(5, (40, 4), 32, "fp32", "bf16")}


def test_case_table() -> None:
    table = cases.all_cases()
    default = cases.select(table)
    expect(len(default) == 50, f"50 benchmark cases (docs/benchmarking.md) by default (got {len(default)})")
    expect(len({c.name for c in table}) == len(table), "case names unique")
    expect(len(cases.select(table, quick=True)) == 7, "--quick: 7 cases")
    v4 = cases.select(table, ["sparse_decode_v4"])
    expect(len(v4) == 7 and sum(c.params["extra_topk"] > 0 for c in v4) == 6,
           "--families sparse_decode_v4: 7 cases, 6 with a second cache")
    expect(sum(c.params.get("d_qk") == 512 for c in cases.select(table, ["sparse_prefill"])) == 4,
           "sparse_prefill: 4 cases of d_qk 512")
    mha = cases.select(table, ["mha_prefill"])
    expect(len(mha) == 10, f"--families mha_prefill: 10 cases (got {len(mha)})")
    expect(cases.FAMILIES["mha_prefill"].sides == ("sdpa_cudnn", "sdpa_flash", "mlakit")
           and cases.FAMILIES["mha_prefill"].subject == "mlakit", "mha_prefill: cuDNN (baseline), flash, mlakit")
    expect([c.name for c in mha if c.quick] == ["mha_prefill_b4_h32_s4096_d128_128"], "mha_prefill: one quick case")
    heads = {c.params["h"] for c in mha if c.params["d_qk"] < 256}
    expect(sum(c.params["varlen"] for c in mha) == 2 and heads == {32}, "mha_prefill: 2 varlen, h 32 but at d 256")
    bwd = cases.select(table, ["mha_backward"])
    family = cases.FAMILIES["mha_backward"]
    expect(len(bwd) == 10 and not family.default and family.subject == "mlakit"
           and family.sides == ("sdpa_cudnn", "sdpa_flash", "mlakit", "mlakit_deterministic")
           and family.on_request == ("mlakit_sm90", "mlakit_sm90_deterministic"),
           "--families mha_backward: 10 cases, not in the default run; cuDNN (baseline), flash, mlakit, deterministic")
    expect([c.params for c in bwd] == [c.params for c in mha]
           and [c.name for c in bwd] == [c.name.replace("mha_prefill", "mha_backward") for c in mha],
           f"mha_backward: the forward's cases ({', '.join(c.name for c in bwd)})")
    quick = [c.name for c in cases.select(table, ["mha_backward"], quick=True)]
    expect(quick == ["mha_backward_b4_h32_s4096_d128_128"], "mha_backward: one quick case (--families mha_backward --quick)")
    expect(len(cases.select(table, ["gqa"])) == 5, "--families gqa: 5 cases")
    expect([c.name for c in cases.select(table, pattern="sk32768_causal")] == ["dense_b128_hq128_sq2_sk32768_causal"],
           "--filter by regex")
    expect(len(cases.select(table, ["sdpa_mha"])) == 2, "--families sdpa_mha: 2 cases")
    merge = cases.select(table, ["merge"])
    expect(len(merge) == 6 and not cases.FAMILIES["merge"].default
           and cases.FAMILIES["merge"].sides == ("torch", "mlakit"),
           "--families merge: 6 cases, not in the default run; PyTorch (baseline) and mlakit")
    expect([c.name for c in merge if c.quick] == ["merge_cp_decode_b128_sq1_hq128_d512_n2_bf16",
                                                 "merge_t16384_h32_d128_n4_bf16"], "merge: two quick cases")


def test_dense_data() -> None:
    x = data.generate(DENSE, 3, "cpu")
    t = x.tensors
    lengths, table, cache = t["cache_seqlens"], t["block_table"], t["k_cache"]
    expect(bool((lengths >= 2).all()), "dense: lengths >= s_q")
    expect(sorted(table.flatten().tolist()) == list(range(table.numel())), "dense: block table a permutation")
    expect(table.flatten().tolist() != sorted(table.flatten().tolist()), "dense: block table shuffled")
    ok = True
    for i in range(lengths.numel()):
        rows = cache[table[i].long()].reshape(-1, 576)
        used, unused = rows[: lengths[i]].float(), rows[lengths[i] :].float()
        ok &= bool(torch.isfinite(used).all()) and bool(torch.isnan(unused).all())
    expect(ok, "dense: finite before each length, NaN in every slot after")
    expect(abs(x.info["mean_s_k"] - lengths.double().mean().item()) < 1e-9, "dense: mean s_k recorded as drawn")


def test_sparse_data() -> None:
    x = data.generate(SPARSE, 3, "cpu")
    idx, cache = x.tensors["indices"].long(), x.tensors["k_cache"].view(-1, 656)
    distinct = all(len(set(row.tolist())) == row.numel() for row in idx.view(-1, idx.shape[-1]))
    expect(distinct, "sparse decode: indices distinct per query token")
    table = x.tensors["block_table"]
    own = all(set((idx[i] // 64).flatten().tolist()) <= set(table[i].tolist()) for i in range(idx.shape[0]))
    expect(own, "sparse decode: every index a slot of its own sequence's blocks")
    listed = torch.zeros(cache.shape[0], dtype=torch.bool)
    listed[idx.flatten()] = True
    expect(bool((cache[~listed] == 0xFF).all()), "sparse decode: unlisted tokens all NaN bytes")
    expect(bool(torch.isfinite(data.dequantize_fp8(cache[listed])).all()), "sparse decode: listed tokens finite")
    kv = torch.randn(64, 576).to(torch.bfloat16)
    back = data.dequantize_fp8(data.quantize_fp8(kv))
    nope_err = (back[:, :512] - kv[:, :512].double()).abs().max() / kv[:, :512].double().abs().max()
    expect(float(nope_err) <= 1 / 8 and bool((back[:, 512:] == kv[:, 512:].double()).all()),
           f"FP8 quantize round trip (NoPE rel err {float(nope_err):.3g}, RoPE exact)")


def test_sparse_v4_data() -> None:
    x = data.generate(SPARSE_V4, 3, "cpu")
    t = x.tensors
    expect(tuple(t["k_cache"].shape) == (t["records"].shape[0], 64, 1, 584) and t["k_cache"].stride(1) == 584
           and t["k_cache"].stride(0) % 576 == 0, "V4 decode: the cache view [num_blocks, 64, 1, 584], blocks padded to 576")
    for prefix in ("", "extra_"):
        idx, records, scales = t[prefix + "indices"].long(), t[prefix + "records"], t[prefix + "scales"]
        page = records.shape[1]
        distinct = all(len(set(row.tolist())) == row.numel() for row in idx.view(-1, idx.shape[-1]))
        expect(distinct, f"V4 decode {prefix}indices distinct per query token")
        listed = torch.zeros(records.shape[0] * page, dtype=torch.bool)
        listed[idx.flatten()] = True
        listed = listed.view(records.shape[0], page)
        expect(bool((records[~listed] == 0xFF).all() and (scales[~listed] == 0xFF).all()),
               f"V4 decode {prefix}cache: unlisted records and scales all NaN bytes")
        values = data.dequantize_fp8_v4(records[listed], scales[listed])
        expect(bool(torch.isfinite(values).all()), f"V4 decode {prefix}cache: listed tokens finite")
    kv = torch.randn(64, 512).to(torch.bfloat16)
    back = data.dequantize_fp8_v4(*data.quantize_fp8_v4(kv))
    nope_err = ((back[:, :448] - kv[:, :448].double()).abs() / kv[:, :448].double().abs().clamp(min=1e-3)).max()
    expect(float(nope_err) <= 1 / 8 and bool((back[:, 448:] == kv[:, 448:].double()).all()),
           f"V4 quantize round trip (NoPE rel err {float(nope_err):.3g}, RoPE exact)")


def test_prefill_data() -> None:
    x = data.generate(PREFILL, 3, "cpu")
    idx = x.tensors["indices"][:, 0].long()
    expect(all(len(set(r.tolist())) == 64 for r in idx), "prefill: indices distinct per token")
    expect(bool(((idx >= 0) & (idx < 1024)).all()), "prefill: indices in range")
    near = (idx >= 1024 - 200).sum(dim=-1)
    expect(bool((near == round(0.9 * 64)).all()), "prefill: 90% of the indices in the last window")


def test_gqa_data() -> None:
    for name, case in GQA.items():
        x = data.generate(case, 3, "cpu")
        t = x.tensors
        table, b, s_k = t["block_table"].long(), 3, 192
        expect(sorted(table.flatten().tolist()) == list(range(table.numel())), f"gqa {name}: block table a permutation")
        same = True
        for which in ("k", "v"):
            paged = t[f"{which}_cache"]
            scale = t[f"{which}_scale"]
            values = paged.double() if scale is None else data.dequantize_rows(paged, scale)
            # position p of sequence i, kv head h: block table[i, p // 64], row p % 64
            gathered = values[table].reshape(b, s_k, 2, 64).permute(0, 2, 1, 3)
            sdpa = t[f"{which}_sdpa"].double()
            tol = 0 if scale is None else 2**-8
            same &= bool(((gathered - sdpa).abs() <= tol * gathered.abs()).all())
        expect(same, f"gqa {name}: the paged cache and SDPA's contiguous one hold the same values")
        if name == "int8":
            k = t["k_cache"].double()
            expect(bool((k.abs() <= 127).all()) and bool((k.abs().amax(-1) == 127).all()),
                   "gqa int8: per-row max quantizes to 127")
    kv = torch.randn(16, 64).to(torch.bfloat16)
    for kind, bound in (("int8", 1 / 127), ("fp8", 1 / 8)):
        values, scale = data.quantize_rows(kv, kind)
        err = (data.dequantize_rows(values, scale) - kv.double()).abs().max() / kv.double().abs().max()
        expect(float(err) <= bound, f"gqa {kind} quantize round trip (rel err {float(err):.3g})")
    x = torch.randn(4, 64, dtype=torch.float64)
    back = data.rope_neox(data.rope_neox(x, 77), -77)
    norm_kept = torch.allclose(data.rope_neox(x, 77).norm(dim=-1), x.norm(dim=-1))
    expect(torch.equal(data.rope_neox(x, 0), x) and bool(torch.allclose(back, x)) and bool(norm_kept),
           "rope: identity at position 0, a rotation (norm kept, undone at -pos)")


def test_mha_prefill_data() -> None:
    ok = True
    for seed in range(50):
        lengths = data.varlen_lengths(16384, 512, 8192, seed)
        ok &= sum(lengths) == 16384 and 512 <= min(lengths) and max(lengths) <= 8192
        ok &= lengths == data.varlen_lengths(16384, 512, 8192, seed)
    expect(ok, f"varlen lengths: in [512, 8192], 16384 in all, the same per seed (seed 0: "
               f"{data.varlen_lengths(16384, 512, 8192, 0)})")
    x = data.generate(VARLEN[False], 3, "cpu")
    t, lengths = x.tensors, x.tensors["lengths"]
    starts = [0] + torch.tensor(lengths).cumsum(0).tolist()
    expect(sum(lengths) == 200 and min(lengths) >= 16 and max(lengths) <= 96 and lengths == data.varlen_lengths(
        200, 16, 96, 3) and t["cu_seqlens"].tolist() == starts
        and t["q_rows"].shape == (200, 2, 64) and t["max_seqlen"] == max(lengths),
        f"mha_prefill varlen: lengths {lengths}, cu_seqlens their prefix sums, packed rows")
    flops = sum(2 * 2 * n * n * 128 for n in lengths)
    expect(x.info["flops"] == flops and data.generate(VARLEN[True], 3, "cpu").info["flops"] == flops / 2,
           "mha_prefill varlen: FLOPs summed per sequence, halved for causal")
    x = data.generate(MHA, 3, "cpu")
    t = x.tensors
    same = torch.equal(t["q_rows"].view(2, 48, 2, 64).transpose(1, 2), t["q"])
    same &= torch.equal(t["v_rows"].view(2, 48, 2, 64).transpose(1, 2), t["v"])
    expect(same and t["cu_seqlens"].tolist() == [0, 48, 96] and x.info["flops"] == 2 * 2 * 2 * 48 * 48 * 128 / 2,
           "mha_prefill: packed rows hold SDPA's [b, h, s, d] values; FLOPs 2 b h s^2 (d_qk + d_v), causal / 2")


def test_mha_backward_data() -> None:
    for case in BWD_CASES:
        x = data.generate(case, 3, "cpu")
        t, p = x.tensors, case.params
        forward = data.generate(cases.Case("forward", "mha_prefill", p), 3, "cpu").tensors
        same = all(torch.equal(t[n], forward[n]) for n in ("q_rows", "k_rows", "v_rows", "cu_seqlens"))
        h, h_kv, d_qk, d_v = p["h"], p.get("h_kv", p["h"]), p["d_qk"], p["d_v"]
        total = t["cu_seqlens"][-1].item()
        dout = t["dout_rows"]
        shapes = dout.shape == (total, h, d_v) and dout.dtype == torch.bfloat16
        shapes &= t["k_rows"].shape == (total, h_kv, d_qk)
        scale = 0.07 < float(dout.float().std()) < 0.13
        if not p["varlen"]:
            b, s = p["b"], p["s"]
            same &= torch.equal(t["dout_rows"].view(b, s, h, d_v).transpose(1, 2), t["dout"])
            same &= torch.equal(t["k_rows"].view(b, s, h_kv, d_qk).transpose(1, 2), t["k"])
        pairs = sum(n * n for n in t["lengths"]) / (2 if p["causal"] else 1)
        flops = 2 * (3 * d_qk + 2 * d_v) * pairs * h
        nbytes = total * 2 * (h * (d_qk + d_v) * 2 + h_kv * (d_qk + d_v) * 2) + total * h * 4
        expect(same and shapes and scale and x.info["flops"] == flops and x.info["bytes"] == nbytes,
               f"{case.name}: the forward's q, k, v, dout ~ N(0, 1) / 10 (std {float(dout.float().std()):.3f}), "
               f"packed rows hold SDPA's values, FLOPs 2 (3 d_qk + 2 d_v) pairs h ({x.info['flops']:.0f}), bytes")
    x = data.generate(MHA_GQA, 3, "cpu")
    expect(x.info["bytes"] == 80 * (4 * 128 + 2 * 128) * 2 and x.tensors["k"].shape == (2, 2, 40, 64),
           "mha_prefill GQA: k, v with h_kv heads; bytes q, k, v, out once")


def test_merge_data() -> None:
    x = data.generate(MERGE["cp_decode"], 3, "cpu")
    o, lse = x.tensors["o"], x.tensors["lse"]
    expect(o.shape == (3, 4, 2, 8, 64) and o.dtype == torch.bfloat16 and lse.shape == (3, 4, 2, 8)
           and lse.stride() == (64, 16, 1, 2) and x.tensors["out_dtype"] == torch.bfloat16,
           f"merge cp decode: states [n, b, s_q, h_q, d], LSEs the view of [n, b, h_q, s_q] memory {lse.stride()}")
    rows = 4 * 2 * 8
    expect(x.info["bytes"] == 3 * rows * (64 * 2 + 4) + rows * (64 * 2 + 4) and x.info["tokens"] == 8,
           "merge: bytes = states read + out written (values and LSEs); tokens = rows / heads")
    x = data.generate(MERGE["fp32_to_bf16"], 3, "cpu")
    t = x.tensors
    expect(t["o"].dtype == torch.float32 and t["out_dtype"] == torch.bfloat16 and t["lse"].is_contiguous()
           and x.info["bytes"] == 5 * 160 * (32 * 4 + 4) + 160 * (32 * 2 + 4),
           "merge fp32 -> bf16: float32 states, contiguous LSEs, bytes by each dtype")


def test_merge_torch_side() -> None:
    for name, case in MERGE.items():
        x = data.generate(case, 5, "cpu")
        r = sides.runner("torch", torch, "merge", x)
        result = reference.check("merge", r.outputs(r.call()), reference.merge(x))
        expect(result["ok"], f"merge {name}: the PyTorch side passes the check {result['out']} {result['lse']}")


def test_mha_prefill_reference() -> None:
    """The per-sequence reference against SDPA in float64 per sequence; attention across the
    sequences of the packed rows (one long sequence) must fail the check."""
    for causal, case in VARLEN.items():
        x = data.generate(case, 5, "cpu")
        t, starts = x.tensors, x.tensors["cu_seqlens"].tolist()
        ref = reference.mha_prefill(x)

        def attend(first: int, last: int) -> torch.Tensor:  # rows [first, last) as one sequence, float64
            q, k, v = (t[n][first:last].double().transpose(0, 1) for n in ("q_rows", "k_rows", "v_rows"))
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal).transpose(0, 1)

        per_sequence = torch.cat([attend(starts[i], starts[i + 1]) for i in range(len(starts) - 1)])
        rows = ref["index"][1]
        expect(torch.allclose(per_sequence[rows], ref["out"], rtol=0, atol=1e-12) and len(rows) > 2 * len(starts),
               f"mha_prefill varlen reference (causal {causal}): float64 SDPA per sequence, {len(rows)} tokens")
        across = dict(out=attend(0, starts[-1]).to(torch.bfloat16))
        expect(not reference.check("mha_prefill", across, ref)["ok"],
               f"mha_prefill varlen (causal {causal}): attention across sequences fails the check")


def _sdpa_backward_float64(x: data.Inputs, first: int, last: int) -> dict:
    """dq, dk, dv of rows [first, last) as one sequence: float64 SDPA (math) by autograd,
    enable_gqa: a second way to the reference."""
    t = x.tensors
    q, k, v = (t[n][first:last].double().transpose(0, 1).requires_grad_() for n in ("q_rows", "k_rows", "v_rows"))
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=t["causal"],
                                                           enable_gqa=q.shape[0] != k.shape[0])
    grads = torch.autograd.grad(out, (q, k, v), t["dout_rows"][first:last].double().transpose(0, 1))
    return {n: g.transpose(0, 1) for n, g in zip(("dq", "dk", "dv"), grads)}


def test_mha_backward_reference() -> None:
    """The autograd reference against float64 SDPA per sequence, in one chunk of heads and in
    chunks of one kv head; the gradients of attention across the sequences fail the check, and
    so does a perturbed gradient."""
    for case in BWD_CASES:
        x = data.generate(case, 5, "cpu")
        starts = x.tensors["cu_seqlens"].tolist()
        ref = reference.mha_backward(x)
        chunk = reference.GRAD_CHUNK
        try:
            reference.GRAD_CHUNK = 1  # one kv head per chunk
            small = reference.mha_backward(x)
        finally:
            reference.GRAD_CHUNK = chunk
        per_sequence = [_sdpa_backward_float64(x, a, b) for a, b in zip(starts[:-1], starts[1:])]
        same = all(torch.allclose(torch.cat([g[n] for g in per_sequence]), ref[n], rtol=0, atol=1e-12)
                   and torch.equal(small[n], ref[n]) for n in ("dq", "dk", "dv"))
        expect(same and ref["index"] == ("token", list(range(starts[-1]))),
               f"{case.name}: the backward's reference is float64 SDPA's autograd per sequence, in chunks of heads "
               "or not; every token checked")
        rounded = {n: ref[n].to(torch.bfloat16) for n in ("dq", "dk", "dv")}
        expect(reference.check("mha_backward", rounded, ref)["ok"], f"{case.name}: the rounded reference passes")
        for name in ("dq", "dk", "dv"):
            bad = dict(rounded, **{name: rounded[name] * 1.1})
            expect(not reference.check("mha_backward", bad, ref)[name]["ok"],
                   f"{case.name}: {name} 10% off fails the check")
        if len(starts) > 2:
            across = {n: g.to(torch.bfloat16) for n, g in _sdpa_backward_float64(x, 0, starts[-1]).items()}
            result = reference.check("mha_backward", across, ref)
            expect(not result["ok"] and not result["dk"]["ok"],
                   f"{case.name}: the gradients of attention across sequences fail the check")
    expect(reference.check_output(torch.tensor([1.06]), torch.tensor([1.0], dtype=torch.float64),
                                  reference.ELEMENTWISE["dq"])["over"] == 0
           and reference.check_output(torch.tensor([1.07]), torch.tensor([1.0], dtype=torch.float64),
                                      reference.ELEMENTWISE["dq"])["over"] == 1
           and reference.check_output(torch.tensor([1.02]), torch.tensor([1.0], dtype=torch.float64))["over"] == 1,
           "backward tolerance rel 8/128 (out: 2/128)")


def _mlakit():
    try:
        return importlib.import_module("mlakit.flash_mla")
    except ImportError as e:
        print(f"skip  mlakit not importable ({e}): its parts of the selftest are skipped")
        return None


def test_references(api) -> None:
    for case in (DENSE, SPARSE, SPARSE_V4, PREFILL, PREFILL_D512, *GQA.values(), MHA, MHA_D192, *VARLEN.values(),
                 MHA_GQA, *BWD_CASES, *MERGE.values()):
        x = data.generate(case, 5, "cpu")
        ref = reference.REFERENCES[case.family](x)
        if api is None:
            continue
        for side in ("mlakit", "mlakit_deterministic") if case.family == "mha_backward" else ("mlakit",):
            r = sides.runner(side, api, case.family, x)
            r.call()
            got = r.outputs(r.call())
            result = reference.check(case.family, got, ref)
            bases = {k: v.get("base") for k, v in result.items() if isinstance(v, dict) and "base" in v}
            expect(result["ok"] and set(got) <= set(result),
                   f"{case.name}: {side}'s CPU reference passes the check against ours {sorted(got)} {bases}")
        for name in (n for n in got if n in reference.ELEMENTWISE):
            bad = dict(got, **{name: got[name] + 0.05})
            expect(not reference.check(case.family, bad, ref)["ok"], f"{case.name}: a perturbed {name} fails the check")
        if "lse" in got:
            bad = dict(got, lse=got["lse"] + 1e-3)
            expect(not reference.check(case.family, bad, ref)["ok"], f"{case.family}: a perturbed lse fails the check")
        if case.family == "sparse_decode":
            from mlakit import dequantize_fp8_cache

            mine = data.dequantize_fp8(x.tensors["k_cache"][:1]).to(torch.bfloat16)
            theirs = dequantize_fp8_cache(x.tensors["k_cache"][:1].contiguous())
            listed = torch.isfinite(mine.float())
            same = bool((mine.float()[listed] == theirs.float()[listed]).all())
            expect(same, "FP8 layout: mlakit dequantizes ours alike")
        if case.family == "sparse_decode_v4":
            from mlakit import dequantize_fp8_v4_cache

            t = x.tensors
            mine = data.dequantize_fp8_v4(t["records"], t["scales"]).to(torch.bfloat16)  # [blocks, page, 512]
            theirs = dequantize_fp8_v4_cache(t["k_cache"])[:, :, 0]
            listed = torch.isfinite(mine.float())
            same = bool((mine.float()[listed] == theirs.float()[listed]).all())
            expect(same, "V4 cache layout: mlakit dequantizes ours alike")


def test_sdpa_side() -> None:
    from torch.nn.attention import SDPBackend

    x = data.generate(SDPA, 5, "cpu")
    r = sides.sdpa_runner("sdpa_math", SDPBackend.MATH, "sdpa_mha", x)
    result = reference.check("sdpa_mha", r.outputs(r.call()), reference.sdpa_mha(x))
    expect(result["ok"], f"SDPA side (math backend) passes the check {result['out']}")
    for name, case in GQA.items():
        x = data.generate(case, 5, "cpu")
        r = sides.runner("sdpa_math", SDPBackend.MATH, "gqa", x)
        r.call()
        result = reference.check("gqa", r.outputs(r.call()), reference.gqa(x))
        expect(result["ok"], f"gqa {name}: SDPA side (math backend, enable_gqa) passes the check {result['out']}")
    for case in (MHA, MHA_D192, VARLEN[False], VARLEN[True], MHA_GQA, *BWD_CASES):
        x = data.generate(case, 5, "cpu")
        ref = reference.REFERENCES[case.family](x)
        r = sides.runner("sdpa_math", SDPBackend.MATH, case.family, x)
        r.call()
        got = r.outputs(r.call())
        result = reference.check(case.family, got, ref)
        expect(result["ok"] and set(got) <= set(result),
               f"{case.name}: SDPA side (math backend) passes the check "
               + " ".join(f"{n} {result[n]}" for n in got))
    x = data.generate(BWD_VARLEN[True], 5, "cpu")
    r = sides.runner("sdpa_math", SDPBackend.MATH, "mha_backward", x)
    first, again = r.call(), r.call()
    expect(len(first) == 3 * len(x.tensors["lengths"]) and all(torch.equal(a, b) for a, b in zip(first, again))
           and all(g.data_ptr() != x.tensors["q_rows"].data_ptr() for g in first)
           and not x.tensors["q_rows"].requires_grad,
           "mha_backward varlen: SDPA's timed call is autograd.grad over the graph built once (repeatable; per "
           "sequence dq, dk, dv; the shared rows untouched)")
    x = data.generate(VARLEN[False], 5, "cpu")
    t = x.tensors
    starts = t["cu_seqlens"].tolist()
    views = sides._sequence_views(t["q_rows"], starts)
    expect(len(views) == len(t["lengths"]) and all(
        q.data_ptr() == t["q_rows"][a].data_ptr() and q.shape == (1, 2, b - a, t["q_rows"].shape[-1])
        for q, a, b in zip(views, starts[:-1], starts[1:])),
        "mha_prefill varlen: SDPA's q per sequence [1, h, n, d] is a view of the packed rows")
    for case, backend, why in ((MHA_D192, SDPBackend.FLASH_ATTENTION, "d_qk == d_v"),
                               (BWD_D192, SDPBackend.FLASH_ATTENTION, "d_qk == d_v")):
        try:
            sides.runner("sdpa_x", backend, case.family, data.generate(case, 5, "cpu"))
            raised = "nothing"
        except sides.SideUnsupported as e:
            raised = str(e)
        expect(why in raised, f"{case.name} on {backend}: SideUnsupported ({raised[:90]})")
    rejected = [sides._rejected(e) for e in (RuntimeError("No available kernel. Aborting execution."),
                                             NotImplementedError("jagged"), RuntimeError("CUDA error: not supported"),
                                             torch.cuda.OutOfMemoryError("out of memory"), ValueError("bad dtype"))]
    expect(rejected == [True, True, False, False, False], f"what counts as a backend's refusal {rejected}")


def test_kernel_names() -> None:
    names = {
        "void flash::flash_fwd_splitkv_mla_kernel<cutlass::bfloat16_t, 64>(Flash_fwd_mla_params)": "main",
        "void flash::flash_fwd_mla_combine_kernel<cutlass::bfloat16_t, 512>(Flash_fwd_mla_params)": "combine",
        "get_mla_metadata_kernel(Mla_metadata_params)": "plan",
        "void mlakit::detail::decode_plan_kernel(mlakit::detail::SeqLengths, long)": "plan",
        "void mlakit::detail::mla_decode_sm90_kernel<(anon)::Cfg>(mlakit::detail::DenseDecodeParams)": "main",
        "Memset (Device)": "other",
    }
    got = {raw: timing.bucket(timing.short_name(raw)) for raw in names}
    expect(got == names, f"kernel buckets {[timing.short_name(r) for r in names]}")


class WallMeasure:
    """Wall-clock stand-ins for runner.CudaMeasure (the run loop's plumbing only)."""

    def sync(self) -> None:
        pass

    def _time(self, fn: Callable[[], Any]) -> float:
        start = time.perf_counter()
        fn()
        return 1e6 * (time.perf_counter() - start)

    def sustained(self, fn, rep_ms=None):
        return sorted(self._time(fn) for _ in range(3))[1]

    def idle(self, fn):
        return [self._time(fn) for _ in range(2)]

    def kernels(self, fn):
        t = self._time(fn)
        return dict(plan=0.0, main=t, combine=0.0, other=0.0, total=t, kernels={}, raw_names=[])

    def host(self, fn):
        return self._time(fn)

    def clock(self):
        return contextlib.nullcontext(types.SimpleNamespace(median=None, watts=None))

    def clock_now(self):
        return None


def test_run_loop(api) -> None:
    from torch.nn.attention import SDPBackend

    opts = types.SimpleNamespace(rounds=2, rep_ms=200, idle=True, profile=True, fresh=True, seed=0)
    plan = [(SDPA, {"sdpa_cudnn": SDPBackend.MATH, "sdpa_flash": SDPBackend.MATH})]
    if api is not None:
        plan += [(c, {"flashmla": api, "mlakit": api}) for c in (DENSE, SPARSE, PREFILL)]
        plan += [(c, {"sdpa_cudnn": SDPBackend.MATH, "mlakit": api}) for c in (GQA["int8"], GQA["bf16_append"])]
        plan += [(MERGE["cp_decode"], {"torch": torch, "mlakit": api})]
    records = [runner.run_case(case, handles, opts, WallMeasure(), "cpu") for case, handles in plan]
    for rec in records:
        report.add_ceiling_fractions(rec, {"copy_gbps": 100.0})
    counted = [r for r in records if r["family"] in ("gqa", "merge")]
    expect(all(report.bandwidth_line(r) and all("copy_fraction" in s and "tokens_per_s" in s
                                                 for s in r["sides"].values()) for r in counted)
           and len(counted) == (3 if api is not None else 0),
           f"gqa and merge: GB/s, tokens/s and the fraction of the copy ceiling per side ({len(counted)} cases)")
    for rec in records:
        sides_ok = all(s["check"]["ok"] and len(s["rounds"]) == 2 for s in rec["sides"].values())
        orders = [[r["position"] for r in s["rounds"]] for s in rec["sides"].values()]
        expect(not rec.get("error") and sides_ok and rec["ratio"] is not None and sorted(orders) == [[0, 1], [1, 0]],
               f"run loop on {rec['case']}: checked, 2 rounds, both orders, ratio {rec.get('ratio')}"
               + (f" ERROR {rec.get('error')}" if rec.get("error") else ""))
    records += _mha_run_loop(api, opts, (MHA, MHA_D192, VARLEN[True]), ("mlakit",))
    records += _mha_run_loop(api, opts, (BWD, BWD_D192, BWD_VARLEN[True]), ("mlakit", "mlakit_deterministic"))
    header = dict(run_id=report.run_id(), commit="selftest", gpu="CPU selftest", driver="-", options=dict(rep_ms=200),
                  ceilings={})
    with tempfile.TemporaryDirectory() as tmp:
        path = report.jsonl_path(tmp, header["gpu"])
        report.append(path, header, records)
        report.append(path, dict(header, run_id=header["run_id"] + "-2"), records)
        back = report.read(path)
        expect(len(back) == 2 * len(records) and back[0]["case"] == records[0]["case"], "JSON lines written and read")
        text = report.table(header, records)
        print(text)
        expect("sdpa_flash not supported (n/s): PyTorch's flash backend needs d_qk == d_v" in text,
               "table: a side that cannot run a case is marked n/s, with the reason")
        png = chart.render(path, os.path.join(tmp, "chart.png"))
        expect(os.path.getsize(png) > 10000, f"chart drawn ({os.path.getsize(png)} bytes)")


def _mha_run_loop(api, opts, three: tuple, mlakit_sides: tuple) -> List[dict]:
    """The MHA prefill's forward or backward family on its three tiny cases (d 64, d 192/128,
    varlen causal), SDPA sides and mlakit's (where importable): SDPA's flash backend not
    supported at d 192/128, recorded as such and not timed, the other sides timed (the varlen
    mix once per sequence); every other side's ratio to mlakit recorded and printed."""
    from torch.nn.attention import SDPBackend

    mine = {side: api for side in mlakit_sides} if api is not None else {}
    d64, d192, varlen = three
    plan = [(d64, dict(sdpa_cudnn=SDPBackend.MATH, sdpa_flash=SDPBackend.MATH, **mine), set()),
            (d192, dict(sdpa_cudnn=SDPBackend.MATH, sdpa_flash=SDPBackend.FLASH_ATTENTION, **mine), {"sdpa_flash"}),
            (varlen, dict(sdpa_cudnn=SDPBackend.MATH, sdpa_flash=SDPBackend.MATH, **mine), set())]
    records = []
    for case, handles, unsupported in plan:
        rec = runner.run_case(case, handles, opts, WallMeasure(), "cpu")
        records.append(rec)
        said = {n for n, s in rec["sides"].items() if report.unsupported(s)}
        timed = {n for n, s in rec["sides"].items() if len(s.get("rounds", [])) == 2 and s["check"]["ok"]}
        # The timed sides in the order of each round: the second the first reversed.
        seqs = [sorted(timed, key=lambda n: rec["sides"][n]["rounds"][rnd]["position"]) for rnd in (0, 1)]
        want_ratio = api is not None and "sdpa_cudnn" not in unsupported
        expect(not rec.get("error") and said == unsupported and timed == set(handles) - unsupported
               and (rec["ratio"] is not None) == want_ratio and seqs[1] == seqs[0][::-1],
               f"run loop on {rec['case']}: not supported {sorted(said)}, timed {seqs[0]} then reversed, "
               f"ratio {rec['ratio']}"
               + (f" ERROR {rec.get('error')}" if rec.get("error") else ""))
        if api is not None:
            others = sorted(timed - {"sdpa_cudnn", "mlakit"})
            line = report.other_sides_line(rec) or ""
            expect(all(rec["ratios"].get(n, {}).get("sustained") is not None
                       and report.SIDE_LABELS[n] + " " in line for n in others),
                   f"{rec['case']}: the ratios of {others} to mlakit recorded and printed")
        expect(all(rec["sides"][n]["check"]["ok"] for n in said),
               f"{rec['case']}: a side that is not supported is not a failed check")
    return records


def main(argv: List[str]) -> int:
    torch.manual_seed(0)
    api = _mlakit()
    for test in (test_case_table, test_dense_data, test_sparse_data, test_sparse_v4_data, test_prefill_data, test_gqa_data,
                 test_mha_prefill_data, test_mha_backward_data, test_merge_data, test_mha_prefill_reference,
                 test_mha_backward_reference, test_sdpa_side, test_merge_torch_side, test_kernel_names):
        test()
    test_references(api)
    test_run_loop(api)
    print(f"selftest: {len(FAILURES)} failed" + (": " + "; ".join(FAILURES) if FAILURES else ""))
    return 1 if FAILURES else 0
