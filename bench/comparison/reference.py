"""Float64 references on a sample of each case (the full problem would cost more than the
timing) and the accuracy checks (docs/contract.md) of a side's outputs against them.

The sample: a few batch entries (dense and sparse decode: the longest, the shortest and
random ones) or query tokens (sparse prefill: the first, the last and random ones; MHA
prefill: those of every sequence; merge: entries of the first row dimension), or query rows
(SDPA). The MHA prefill's backward checks every row: a key's gradient sums over every query
that sees it, so its reference computes the whole problem anyway. Every output of the whole
tensor is also checked for NaN.
"""

from __future__ import annotations

import math
from typing import Any, Dict, List

import torch

from .data import D_QK, D_V, Inputs, dequantize_fp8, dequantize_fp8_v4, dequantize_rows, rope_neox

OUT_ABS, OUT_REL, OUT_COS = 1e-3, 2 / 128, 5e-6  # docs/contract.md, Accuracy: bf16/fp16 outputs
GRAD_ABS, GRAD_REL, GRAD_COS = 1e-3, 8 / 128, 7e-6  # the same, backward (dq, dk, dv)
# Outputs checked element by element (abs, rel, cosine difference); the others (lse, max_logits)
# are statistics.
ELEMENTWISE = {"out": (OUT_ABS, OUT_REL, OUT_COS), "dq": (GRAD_ABS, GRAD_REL, GRAD_COS),
               "dk": (GRAD_ABS, GRAD_REL, GRAD_COS), "dv": (GRAD_ABS, GRAD_REL, GRAD_COS)}
STAT_ABS, STAT_REL = 1e-6, 8 / 65536  # docs/contract.md, Accuracy: lse and max_logits
SAMPLE = 8  # batch entries (decode) sampled
SAMPLE_TOKENS = 32  # query tokens (sparse prefill) / query rows per head (SDPA) sampled
GRAD_CHUNK = 1 << 27  # scores per chunk of heads in the backward's reference (1 GiB a float64 matrix)


def _pick(n: int, count: int, seed: int, first: List[int]) -> List[int]:
    rest = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    picked = list(dict.fromkeys(first + rest))
    return sorted(picked[: min(count, n)])


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, mask: Any = None):
    """q [..., m, d], k [..., n, d], v [..., n, d_v] in float64 -> out, lse, max (natural log)."""
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    return torch.matmul(torch.exp(scores - lse[..., None]), v), lse, scores.amax(dim=-1)


def dense_decode(x: Inputs) -> Dict[str, Any]:
    t = x.tensors
    q, cache, table, lengths = t["q"], t["k_cache"], t["block_table"], t["cache_seqlens"].cpu()
    b, s_q, h_q, _ = q.shape
    page, h_kv = cache.shape[1], cache.shape[2]
    group = h_q // h_kv
    rows = _pick(b, SAMPLE, x.info["seed"], [int(lengths.argmax()), int(lengths.argmin())])
    outs, lses = [], []
    for i in rows:
        length = int(lengths[i])
        keys = cache[table[i, : math.ceil(length / page)].long()].reshape(-1, h_kv, D_QK)[:length].double()
        keys = keys.permute(1, 0, 2)  # [h_kv, L, 576]
        qi = q[i].double().view(s_q, h_kv, group, D_QK).permute(1, 0, 2, 3).reshape(h_kv, s_q * group, D_QK)
        mask = None
        if t["causal"]:
            last = length - s_q + torch.arange(s_q, device=q.device).repeat_interleave(group)
            mask = torch.arange(length, device=q.device)[None, :] <= last[:, None]
        out, lse, _ = _attend(qi, keys, keys[..., :D_V], D_QK**-0.5, mask)
        outs.append(out.view(h_kv, s_q, group, D_V).permute(1, 0, 2, 3).reshape(s_q, h_q, D_V))
        lses.append(lse.view(h_kv, s_q, group).permute(0, 2, 1).reshape(h_q, s_q))
    return dict(index=("batch", rows), out=torch.stack(outs), lse=torch.stack(lses))


def sparse_decode(x: Inputs) -> Dict[str, Any]:
    t = x.tensors
    q, cache, indices = t["q"], t["k_cache"], t["indices"]
    b, s_q, h_q, _ = q.shape
    tokens = cache.view(-1, cache.shape[-1])
    rows = _pick(b, SAMPLE, x.info["seed"], [0, b - 1])
    outs, lses = [], []
    for i in rows:
        keys = dequantize_fp8(tokens[indices[i].long()])  # [s_q, topk, 576]
        out, lse, _ = _attend(q[i].double(), keys, keys[..., :D_V], D_QK**-0.5)  # q [s_q, h_q, 576]
        outs.append(out)
        lses.append(lse.transpose(0, 1))
    return dict(index=("batch", rows), out=torch.stack(outs), lse=torch.stack(lses))


def sparse_decode_v4(x: Inputs) -> Dict[str, Any]:
    """Both caches' listed tokens (all valid) under one softmax; V is the whole 512-value row."""
    t = x.tensors
    q = t["q"]
    b = q.shape[0]

    def tokens(records: torch.Tensor, scales: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        page = records.shape[1]
        block, offset = slots.long() // page, slots.long() % page
        return dequantize_fp8_v4(records[block, offset], scales[block, offset])  # [s_q, n, 512]

    rows = _pick(b, SAMPLE, x.info["seed"], [0, b - 1])
    outs, lses = [], []
    for i in rows:
        keys = tokens(t["records"], t["scales"], t["indices"][i])
        if t["extra_indices"] is not None:
            keys = torch.cat([keys, tokens(t["extra_records"], t["extra_scales"], t["extra_indices"][i])], dim=1)
        out, lse, _ = _attend(q[i].double(), keys, keys, q.shape[-1] ** -0.5)  # q [s_q, h_q, 512]
        outs.append(out)
        lses.append(lse.transpose(0, 1))
    return dict(index=("batch", rows), out=torch.stack(outs), lse=torch.stack(lses))


def sparse_prefill(x: Inputs) -> Dict[str, Any]:
    t = x.tensors
    q, kv, indices = t["q"], t["kv"], t["indices"]
    s_q = q.shape[0]
    rows = _pick(s_q, SAMPLE_TOKENS, x.info["seed"], [0, s_q - 1])
    outs, lses, maxes = [], [], []
    for r in rows:
        keys = kv[indices[r, 0].long(), 0].double()  # [topk, d_qk]
        out, lse, top = _attend(q[r].double(), keys, keys[:, :D_V], t["sm_scale"])
        outs.append(out)
        lses.append(lse)
        maxes.append(top)
    return dict(index=("token", rows), out=torch.stack(outs), lse=torch.stack(lses), max_logits=torch.stack(maxes))


def gqa(x: Inputs) -> Dict[str, Any]:
    """Float64 attention over the dequantized paged cache (stored * scale, exact), with this
    step's k_new / v_new at position s_k - 1 and q and k_new rotated (NeoX) when appended (the
    rotated q rounded to its dtype, as the contract has it)."""
    t = x.tensors
    q, table, lengths = t["q"], t["block_table"], t["cache_seqlens"].cpu()
    b, s_q, h_q, d = q.shape
    page, h_kv = t["k_cache"].shape[1], t["k_cache"].shape[2]
    group = h_q // h_kv
    rows = _pick(b, SAMPLE, x.info["seed"], [0, b - 1])
    outs = []
    for i in rows:
        length = int(lengths[i])
        blocks = table[i, : math.ceil(length / page)].long()

        def rows_of(name: str) -> torch.Tensor:  # [h_kv, length, d] float64
            values, scale = t[f"{name}_cache"][blocks], t[f"{name}_scale"]
            full = values.double() if scale is None else dequantize_rows(values, scale[blocks])
            return full.reshape(-1, h_kv, d)[:length].permute(1, 0, 2).clone()

        keys, values = rows_of("k"), rows_of("v")
        qi = q[i].double()  # [s_q, h_q, d]
        if t["k_new"] is not None:
            for tok in range(s_q):
                pos = length - s_q + tok
                # q rotated, then rounded to its dtype: the kernels' input (docs/contract.md).
                qi[tok] = rope_neox(qi[tok], pos).float().to(q.dtype).double()
                keys[:, pos] = rope_neox(t["k_new"][i, tok].double(), pos)
                values[:, pos] = t["v_new"][i, tok].double()
        qi = qi.view(s_q, h_kv, group, d).permute(1, 0, 2, 3).reshape(h_kv, s_q * group, d)
        out, _, _ = _attend(qi, keys, values, d**-0.5)
        outs.append(out.view(h_kv, s_q, group, d).permute(1, 0, 2, 3).reshape(s_q, h_q, d))
    return dict(index=("batch", rows), out=torch.stack(outs))


def sdpa_mha(x: Inputs) -> Dict[str, Any]:
    t = x.tensors
    q, k, v = t["q"], t["k"], t["v"]
    s = q.shape[2]
    rows = _pick(s, SAMPLE_TOKENS, x.info["seed"], [0, s - 1])
    qs = q[:, :, rows].double()
    mask = None
    if t["causal"]:
        mask = torch.arange(s, device=q.device)[None, :] <= torch.tensor(rows, device=q.device)[:, None]
    out, _, _ = _attend(qs, k.double(), v.double(), q.shape[-1] ** -0.5, mask)
    return dict(index=("query_row", rows), out=out)


def _kv_heads(x: torch.Tensor, group: int) -> torch.Tensor:
    """[h_kv, n, d] -> [h_kv * group, n, d]: each kv head repeated for the query heads that
    share it (query head i uses kv head i // group; in a graph, its gradient sums over them)."""
    return x if group == 1 else x.repeat_interleave(group, dim=0)


def _causal_mask(at: torch.Tensor, n: int) -> torch.Tensor:
    """Keys j <= query position t (the same lengths for q and k: bottom-right is top-left)."""
    return torch.arange(n, device=at.device)[None, :] <= at[:, None]


def mha_prefill(x: Inputs) -> Dict[str, Any]:
    """Per sequence of the packed rows (no attention across sequences): SAMPLE_TOKENS query
    tokens of each, its first and last included, every head, over that sequence's keys only
    (causal: key j <= query t, the same lengths for q and k)."""
    t = x.tensors
    q, k, v, starts = t["q_rows"], t["k_rows"], t["v_rows"], t["cu_seqlens"].tolist()
    scale = q.shape[-1] ** -0.5
    group = q.shape[1] // k.shape[1]
    rows, outs = [], []
    for i in range(len(starts) - 1):
        first, n = starts[i], starts[i + 1] - starts[i]
        picked = _pick(n, SAMPLE_TOKENS, x.info["seed"] + i, [0, n - 1])
        at = torch.tensor(picked, device=q.device)
        qs = q[first + at].double().transpose(0, 1)  # [h, picked, d_qk]
        ks, vs = (_kv_heads(y[first : first + n].double().transpose(0, 1), group) for y in (k, v))  # [h, n, d]
        out, _, _ = _attend(qs, ks, vs, scale, _causal_mask(at, n) if t["causal"] else None)
        outs.append(out.transpose(0, 1))  # [picked, h, d_v]
        rows += [first + p for p in picked]
    return dict(index=("token", rows), out=torch.cat(outs))


def mha_backward(x: Inputs) -> Dict[str, Any]:
    """dq, dk, dv of float64 attention by autograd (torch.autograd.grad of the float64 out
    against dout), per sequence of the packed rows (no attention across sequences), over all
    its queries and keys, in chunks of kv heads (with their query heads) of at most GRAD_CHUNK
    scores; dk and dv of a kv head sum over its query heads through the repeat in the graph.
    The float64 out is differentiated (the sides get their own rounded out and lse). Every
    token is in the sample (the gradient of one key needs every query anyway)."""
    t = x.tensors
    q, k, v, dout, starts = t["q_rows"], t["k_rows"], t["v_rows"], t["dout_rows"], t["cu_seqlens"].tolist()
    scale = q.shape[-1] ** -0.5
    h_kv = k.shape[1]
    group = q.shape[1] // h_kv
    grads = {name: torch.zeros(y.shape, dtype=torch.float64, device=y.device) for name, y in (("dq", q), ("dk", k),
                                                                                                ("dv", v))}
    for first, last in zip(starts[:-1], starts[1:]):
        n = last - first
        mask = _causal_mask(torch.arange(n, device=q.device), n) if t["causal"] else None
        step = max(1, GRAD_CHUNK // (group * n * n))  # kv heads per chunk
        for h0 in range(0, h_kv, step):
            kv = slice(h0, min(h_kv, h0 + step))
            qh = slice(kv.start * group, kv.stop * group)
            # [heads, n, d] float64 leaves of this chunk's graph
            qs, ks, vs = (y[first:last, heads].transpose(0, 1).double().requires_grad_()
                          for y, heads in ((q, qh), (k, kv), (v, kv)))
            with torch.enable_grad():
                out, _, _ = _attend(qs, _kv_heads(ks, group), _kv_heads(vs, group), scale, mask)
                got = torch.autograd.grad(out, (qs, ks, vs), dout[first:last, qh].transpose(0, 1).double())
            for name, heads, g in zip(("dq", "dk", "dv"), (qh, kv, kv), got):
                grads[name][first:last, heads] = g.transpose(0, 1)
    return dict(index=("token", list(range(starts[-1]))), **grads)


def merge(x: Inputs) -> Dict[str, Any]:
    """The merge of docs/contract.md in float64 on SAMPLE_TOKENS entries of the first row
    dimension (tokens, or batch entries), the first and the last included, every other row."""
    t = x.tensors
    o, lse = t["o"], t["lse"]
    rows = _pick(o.shape[1], SAMPLE_TOKENS, x.info["seed"], [0, o.shape[1] - 1])
    at = torch.tensor(rows, device=o.device)
    states, logs = o.index_select(1, at).double(), lse.index_select(1, at).double()
    merged = torch.logsumexp(logs, dim=0)
    out = (states * torch.exp(logs - merged).unsqueeze(-1)).sum(dim=0)
    return dict(index=("token", rows), out=out, lse=merged)


REFERENCES = {
    "dense_decode": dense_decode,
    "sparse_decode": sparse_decode,
    "sparse_decode_v4": sparse_decode_v4,
    "sparse_prefill": sparse_prefill,
    "gqa": gqa,
    "sdpa_mha": sdpa_mha,
    "mha_prefill": mha_prefill,
    "mha_backward": mha_backward,
    "merge": merge,
}


def sample(family: str, name: str, got: torch.Tensor, index) -> torch.Tensor:
    """The side's output `name` at the reference's sample."""
    kind, rows = index
    sel = torch.tensor(rows, device=got.device)
    if kind == "query_row":
        return got.index_select(2, sel)
    return got.index_select(0, sel)


def check_output(got: torch.Tensor, ref: torch.Tensor, rule=ELEMENTWISE["out"]) -> Dict[str, Any]:
    """Every element within abs or rel of `rule` (abs, rel, cosine), whichever is looser, and
    the cosine difference 1 - 2<a,b>/(|a|^2+|b|^2) over the sample within its cosine bound."""
    abs_tol, rel_tol, cos_tol = rule
    g = got.double()
    err = (g - ref).abs()
    bound = torch.clamp(ref.abs() * rel_tol, min=abs_tol)
    over = ~(err <= bound)  # NaN counts as over
    cos_diff = float(1 - 2 * (g * ref).sum() / ((g * g).sum() + (ref * ref).sum()))
    ok = not bool(over.any()) and cos_diff <= cos_tol
    return dict(ok=ok, max_abs=float(err.nan_to_num(float("inf")).max()), over=int(over.sum()), cos_diff=cos_diff)


def _stat_errors(got: torch.Tensor, ref: torch.Tensor):
    inf_ok = (torch.isinf(got) == torch.isinf(ref)) & (~torch.isinf(got) | (got == ref))
    finite = torch.isfinite(ref) & torch.isfinite(got)
    err = torch.where(finite, (got - ref).abs(), torch.zeros_like(ref))
    bound = torch.clamp(ref.abs() * STAT_REL, min=STAT_ABS)
    bad = ~inf_ok | torch.isnan(got) | (finite & (err > bound))
    return bad, float(err.max()) if err.numel() else 0.0


def check_stat(got: torch.Tensor, ref: torch.Tensor) -> Dict[str, Any]:
    """lse / max_logits against the natural-log reference; a side that returns base-2
    statistics (x / ln 2) is recognised by its values, converted and reported as such."""
    g = got.double()
    best = None
    for base, factor in (("e", 1.0), ("2", math.log(2.0))):
        bad, max_abs = _stat_errors(g * factor, ref)
        result = dict(ok=not bool(bad.any()), base=base, max_abs=max_abs, over=int(bad.sum()))
        if result["ok"]:
            return result
        best = best or result
    return best


def check(family: str, outputs: Dict[str, torch.Tensor], ref: Dict[str, Any]) -> Dict[str, Any]:
    """Accuracy rules (docs/contract.md) on the sample, NaN anywhere in the whole outputs; {'ok': bool, per output...}."""
    result: Dict[str, Any] = {"ok": True, "sample": {ref["index"][0]: len(ref["index"][1])}}
    for name, got in outputs.items():
        if name not in ref:
            continue
        nan_anywhere = bool(torch.isnan(got).any())
        picked = sample(family, name, got, ref["index"])
        if name in ELEMENTWISE:
            one = check_output(picked, ref[name], ELEMENTWISE[name])
        else:
            one = check_stat(picked, ref[name])
        one["nan_anywhere"] = nan_anywhere
        one["ok"] = one["ok"] and not nan_anywhere
        result[name] = one
        result["ok"] = result["ok"] and one["ok"]
    return result


def cross(a: Dict[str, torch.Tensor], b: Dict[str, torch.Tensor]) -> Dict[str, Any]:
    """Two sides' whole outputs against each other (not a pass/fail check: a record): `out`'s
    {max_abs, cos_diff}, or one such entry per gradient (dq, dk, dv) for the backward."""
    def one(name: str) -> Dict[str, float]:
        x, y = a[name].float(), b[name].float()
        diff = (x - y).abs().nan_to_num(float("inf"))
        cos = 1 - 2 * (x.double() * y.double()).sum() / ((x.double() ** 2).sum() + (y.double() ** 2).sum())
        return dict(max_abs=float(diff.max()), cos_diff=float(cos))

    names = [name for name in ELEMENTWISE if name in a and name in b]
    return one("out") if names == ["out"] else {name: one(name) for name in names}
