"""How each side is loaded and called.

mlakit and FlashMLA are called through the same function with literally the same
arguments: mlakit through its drop-in `mlakit.flash_mla`, FlashMLA through its `flash_mla`
package. The decode schedule is made by the first call of a step and reused by the others
(`get_mla_metadata()` objects, as an engine reuses one per layer); `fresh` makes a new one
per call (plan + decode). The SDPA sides pin one PyTorch backend each.

The GQA decode has no FlashMLA-style API: mlakit is called through its own
`mlakit.gqa_decode` with the plan of `mlakit.gqa_decode_plan` made once (`fresh`: plan +
decode per call), SDPA on the same values in a contiguous cache; where the case appends
k_new / v_new with RoPE, SDPA's call does the same with PyTorch ops first (rotate q and
k_new, write the new row into its cache), as a caller without a fused kernel would.

The MHA prefill: mlakit's `mha_prefill` on packed rows + cu_seqlens; SDPA on [b, h, s, d]
(every sequence s long) or, for the varlen mix, once per sequence on views of the same packed
rows. Every side returns `out` as packed rows [tokens, h, d_v] (SDPA's converted
outside the timed call). A side that cannot run a case raises SideUnsupported: reported as not
supported, not as a failure. Its backward: the same calls on the same tensors, SDPA's timed
call `torch.autograd.grad` over a graph built once, mlakit's `mha_prefill_backward` (with
`deterministic=True` as side mlakit_deterministic) from out and lse of its own forward made
once; every side returns dq, dk, dv as packed rows.

The merge of partial states: mlakit's `merge_states` on the stacked states into output
buffers made once (an engine's), against the merge as a PyTorch user writes it, eager
(`torch`: logsumexp over the states, the weights, the weighted sum in float32, the cast).
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import os
import re
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import torch

from .cases import SIDES
from .data import D_V, Inputs, rope_neox


class SideUnavailable(RuntimeError):
    """A side asked for that cannot be imported; the message says how to provide it."""


class SideUnsupported(Exception):
    """This side cannot run this case (a documented limit of the backend, or the backend
    rejecting the inputs at run time); the message says why (the side's name is where it is
    recorded). Not a failure: the side is reported as not supported for the case, not timed."""


@dataclasses.dataclass
class Runner:
    side: str
    call: Callable[[], Any]  # the timed call: one layer, schedule reused
    fresh: Optional[Callable[[], Any]]  # plan + call, where the operation has a plan
    names: Tuple[str, ...]  # names of the call's outputs, in order
    unpack: Optional[Callable[[Any], Any]] = None  # the call's result -> outputs, untimed (layout changes)

    def outputs(self, result: Any) -> Dict[str, torch.Tensor]:
        return dict(zip(self.names, result if self.unpack is None else self.unpack(result)))


def _load_mlakit() -> Any:
    try:
        return importlib.import_module("mlakit.flash_mla")
    except ImportError as e:
        raise SideUnavailable(
            f"mlakit: cannot import mlakit.flash_mla ({e}); put the built package on the path "
            "(PYTHONPATH=build-gpu/python or --mlakit-path)"
        ) from e


def _load_flashmla() -> Any:
    try:
        module = importlib.import_module("flash_mla")
    except ImportError as e:
        raise SideUnavailable(
            f"flashmla: cannot import flash_mla ({e}); copy ../shared/baselines/flashmla to .baselines/, "
            "decompress flash_mla/cuda.cpython-312-x86_64-linux-gnu.so.xz with `xz -dk`, and put "
            ".baselines/flashmla on PYTHONPATH (or --flashmla-path)"
        ) from e
    if getattr(module, "MLAKIT_ALIAS", False) or importlib.util.find_spec("flash_mla.cuda") is None:
        raise SideUnavailable(
            f"flashmla: the flash_mla found at {os.path.dirname(module.__file__)} is not FlashMLA's build "
            "(mlakit's alias package, or no compiled flash_mla.cuda extension: was the .so.xz decompressed?)"
        )
    return module


def _load_sdpa(side: str) -> Any:
    from torch.nn.attention import SDPBackend

    return {"sdpa_cudnn": SDPBackend.CUDNN_ATTENTION, "sdpa_flash": SDPBackend.FLASH_ATTENTION}[side]


def load(names: Sequence[str]) -> Dict[str, Any]:
    """Handles of the named sides (modules or SDPA backends); SideUnavailable if one is missing."""
    handles = {}
    for name in names:
        if name not in SIDES:
            raise ValueError(f"unknown side {name!r}: expected one of {SIDES}")
        if name.startswith("mlakit"):  # one package, the mode and kernel chosen per call
            handles[name] = _load_mlakit()
        elif name == "flashmla":
            handles[name] = _load_flashmla()
        elif name == "torch":
            handles[name] = torch
        else:
            handles[name] = _load_sdpa(name)
    return handles


def describe(handles: Dict[str, Any]) -> Dict[str, str]:
    """Where each side came from, for the JSON lines."""
    out = {}
    for name, handle in handles.items():
        if name.startswith("mlakit") or name == "flashmla":
            package = importlib.import_module(handle.__name__.split(".")[0])
            version = getattr(package, "__version__", "?")
            out[name] = f"{package.__name__} {version} from {os.path.dirname(os.path.abspath(package.__file__))}"
        elif name == "torch":
            out[name] = f"torch {torch.__version__} eager"
        else:
            out[name] = f"torch {torch.__version__} SDPA {handle}"
    return out


def flash_api_runner(side: str, api: Any, family: str, x: Inputs) -> Runner:
    """mlakit.flash_mla or flash_mla, called the same way."""
    t = x.tensors
    if family == "dense_decode":
        def run(meta: Any) -> Any:
            return api.flash_mla_with_kvcache(
                t["q"], t["k_cache"], t["block_table"], t["cache_seqlens"], D_V, meta, None, causal=t["causal"]
            )
    elif family == "sparse_decode":
        def run(meta: Any) -> Any:
            return api.flash_mla_with_kvcache(
                t["q"], t["k_cache"], None, None, D_V, meta, None, is_fp8_kvcache=True, indices=t["indices"]
            )
    elif family == "sparse_decode_v4":
        def run(meta: Any) -> Any:
            return api.flash_mla_with_kvcache(
                t["q"], t["k_cache"], None, None, D_V, meta, None, is_fp8_kvcache=True, indices=t["indices"],
                extra_k_cache=t["extra_k_cache"], extra_indices_in_kvcache=t["extra_indices"],
            )
    elif family == "sparse_prefill":
        def call() -> Any:
            return api.flash_mla_sparse_fwd(t["q"], t["kv"], t["indices"], t["sm_scale"], D_V)

        return Runner(side, call, None, ("out", "max_logits", "lse"))
    else:
        raise NotImplementedError(f"{side}: no {family} operation")

    step_meta, _ = api.get_mla_metadata()
    return Runner(
        side, lambda: run(step_meta), lambda: run(api.get_mla_metadata()[0]), ("out", "lse")
    )


def mlakit_gqa_runner(side: str, api: Any, x: Inputs) -> Runner:
    """mlakit.gqa_decode (api: any module of the mlakit package that was loaded)."""
    mk = importlib.import_module(api.__name__.split(".")[0])
    t = x.tensors
    q, seqlens = t["q"], t["cache_seqlens"]
    _, s_q, h_q, d = q.shape
    h_kv = t["k_cache"].shape[2]
    options = dict(k_scale=t["k_scale"], v_scale=t["v_scale"], k_new=t["k_new"], v_new=t["v_new"],
                   rope_style="neox" if t["k_new"] is not None else None)

    def run(plan: Any) -> Any:
        return (mk.gqa_decode(q, t["k_cache"], t["v_cache"], t["block_table"], seqlens, plan=plan, **options),)

    plan = mk.gqa_decode_plan(seqlens, s_q, h_q, h_kv, d)
    return Runner(side, lambda: run(plan), lambda: run(None), ("out",))


def sdpa_gqa_runner(side: str, backend: Any, x: Inputs) -> Runner:
    """SDPA with `backend` pinned and enable_gqa over the contiguous [b, h_kv, s_k, d] cache;
    out back in mlakit's [b, s_q, h_q, d] layout (a view)."""
    from torch.nn.attention import sdpa_kernel

    t = x.tensors
    q, k, v = t["q"], t["k_sdpa"], t["v_sdpa"]
    s_q, s_k = q.shape[1], k.shape[2]
    if t["k_new"] is None:
        def call() -> Any:
            with sdpa_kernel([backend]):
                out = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k, v, enable_gqa=True)
            return (out.transpose(1, 2),)

        return Runner(side, call, None, ("out",))
    if s_q != 1:
        raise NotImplementedError(f"{side}: the append is written for s_q = 1")
    pos = s_k - 1

    def call_append() -> Any:
        qr = rope_neox(q.float(), pos).to(q.dtype)
        k[:, :, pos] = rope_neox(t["k_new"][:, 0].float(), pos).to(k.dtype)  # [b, h_kv, d]
        v[:, :, pos] = t["v_new"][:, 0]
        with sdpa_kernel([backend]):
            out = torch.nn.functional.scaled_dot_product_attention(qr.transpose(1, 2), k, v, enable_gqa=True)
        return (out.transpose(1, 2),)

    return Runner(side, call_append, None, ("out",))


def mlakit_mha_prefill_runner(side: str, api: Any, x: Inputs) -> Runner:
    """mlakit.mha_prefill on the packed rows; out [tokens, h, d_v] as it returns it."""
    mk = importlib.import_module(api.__name__.split(".")[0])
    t = x.tensors
    cu, n = t["cu_seqlens"], t["max_seqlen"]

    def call() -> Any:
        out, _ = mk.mha_prefill(t["q_rows"], t["k_rows"], t["v_rows"], cu, cu, n, n, causal=t["causal"])
        return (out,)

    return Runner(side, call, None, ("out",))


def mlakit_mha_backward_runner(side: str, api: Any, x: Inputs) -> Runner:
    """mlakit.mha_prefill_backward on the packed rows (side mlakit_deterministic: with
    deterministic=True), from out and lse of mlakit.mha_prefill on the same rows, computed here
    once (untimed, as a training step's forward would have); dq, dk, dv as it returns them."""
    mk = importlib.import_module(api.__name__.split(".")[0])
    t = x.tensors
    cu, n, causal = t["cu_seqlens"], t["max_seqlen"], t["causal"]
    q, k, v = t["q_rows"], t["k_rows"], t["v_rows"]
    out, lse = mk.mha_prefill(q, k, v, cu, cu, n, n, None, causal)
    deterministic = side.endswith("_deterministic")
    # Sides mlakit_sm90[_deterministic] (not in the family's default sides: --sides): the Hopper
    # main kernel, which serves d (64, 64), (128, 128) and (192, 128) (other cases: not supported).
    kernel = "sm90" if side.startswith("mlakit_sm90") else "auto"
    if kernel == "sm90" and (q.shape[-1], v.shape[-1]) not in ((64, 64), (128, 128), (192, 128)):
        raise SideUnsupported(f"{side}: the Hopper backward serves d (64, 64), (128, 128) and (192, 128)")

    def call() -> Any:
        return mk.mha_prefill_backward(t["dout_rows"], q, k, v, out, lse, cu, cu, n, n, causal=causal,
                                       deterministic=deterministic, kernel=kernel)

    return Runner(side, call, None, ("dq", "dk", "dv"))


def mlakit_merge_runner(side: str, api: Any, x: Inputs) -> Runner:
    """mlakit.merge_states on the stacked states, into out / out_lse buffers made here."""
    mk = importlib.import_module(api.__name__.split(".")[0])
    t = x.tensors
    o, lse = t["o"], t["lse"]
    out = torch.empty(o.shape[1:], dtype=t["out_dtype"], device=o.device)
    out_lse = torch.empty(lse.shape[1:], dtype=torch.float32, device=o.device)
    return Runner(side, lambda: mk.merge_states(o, lse, out, out_lse), None, ("out", "lse"))


def torch_merge_runner(side: str, handle: Any, x: Inputs) -> Runner:
    """The merge as a PyTorch user writes it, eager: lse = logsumexp over the states, weights
    exp(lse_i - lse), the weighted sum in float32, cast to the output dtype. It has no rule for
    empty states (a row of -inf LSEs gives NaN); the cases have none."""
    t = x.tensors
    o, lse, out_dtype = t["o"], t["lse"], t["out_dtype"]

    def call() -> Any:
        merged = torch.logsumexp(lse, dim=0)
        weights = torch.exp(lse - merged).unsqueeze(-1)
        return (o.float() * weights).sum(dim=0).to(out_dtype), merged

    return Runner(side, call, None, ("out", "lse"))


# What a pinned backend that refuses a call raises: SDPA's "No available kernel" or "No viable
# backend", NotImplementedError or "not implemented / supported", a cuDNN graph without an
# execution plan. Anything else (out of memory, CUDA errors) is a failure.
_REJECTIONS = re.compile(r"No available kernel|No viable backend|not (yet )?(implemented|supported)|No execution plan")


def _rejected(e: Exception) -> bool:
    if isinstance(e, torch.cuda.OutOfMemoryError) or "CUDA error" in str(e):
        return False
    if isinstance(e, NotImplementedError):
        return True
    return isinstance(e, (RuntimeError, ValueError)) and bool(_REJECTIONS.search(str(e)))


def _sequence_views(rows: torch.Tensor, starts: Sequence[int]) -> Tuple[torch.Tensor, ...]:
    """Packed rows [tokens, h, d] -> one [1, h, n, d] view per sequence (SDPA's layout, strided
    over the same memory: nothing is copied)."""
    return tuple(rows[a:b].unsqueeze(0).transpose(1, 2) for a, b in zip(starts[:-1], starts[1:]))


def _sdpa_operands(t: Dict[str, Any], names: Sequence[str]) -> list:
    """Per SDPA call, the named tensors in SDPA's layout: one call on [b, heads, s, d] where
    every sequence is s long; for the varlen mix one call per sequence on [1, heads, n, d] views
    of the packed rows (`<name>_rows`). SDPA's packed form (jagged nested tensors) ran cuDNN
    ~18x slower than these calls (H100, torch 2.11, 48.6 ms against 2.7 ms for mlakit on the
    varlen mix), which would flatter the comparison."""
    if not t["varlen"]:
        return [tuple(t[name] for name in names)]
    starts = t["cu_seqlens"].tolist()
    return list(zip(*(_sequence_views(t[name + "_rows"], starts) for name in names)))


def _to_rows(per_call: Sequence[torch.Tensor]) -> torch.Tensor:
    """Per SDPA call [B, heads, n, d] -> the packed rows [tokens, heads, d] of all of them."""
    rows = [y.transpose(1, 2).reshape(-1, y.shape[1], y.shape[-1]) for y in per_call]
    return rows[0] if len(rows) == 1 else torch.cat(rows)


def _sdpa_prefill_setup(backend: Any, t: Dict[str, Any]) -> Callable[..., Any]:
    """The MHA prefill's SDPA calls with `backend` pinned (what the forward and the backward
    share): `attend(calls)`, the outs of SDPA on each (q, k, v) of `calls` (SDPA's layout, see
    _sdpa_operands) under one sdpa_kernel context, causal as the case, enable_gqa where h_q !=
    h_kv. PyTorch's flash backend at d_qk != d_v raises SideUnsupported here (known up front:
    a clearer message than the backend's)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    d_qk, d_v = t["q_rows"].shape[-1], t["v_rows"].shape[-1]
    if backend == SDPBackend.FLASH_ATTENTION and d_qk != d_v:
        raise SideUnsupported(f"PyTorch's flash backend needs d_qk == d_v (here {d_qk} / {d_v})")
    gqa = t["q_rows"].shape[1] != t["k_rows"].shape[1]

    def attend(calls: Sequence[Tuple[torch.Tensor, ...]]) -> Tuple[torch.Tensor, ...]:
        with sdpa_kernel([backend]):
            return tuple(torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=t["causal"],
                                                                          enable_gqa=gqa) for q, k, v in calls)

    return attend


def _first_call(fn: Callable[[], Any]) -> Any:
    """One untimed call: a backend that refuses the case raises SideUnsupported with its
    message; any other error is the side's failure."""
    try:
        return fn()
    except Exception as e:
        if _rejected(e):
            raise SideUnsupported(f"{type(e).__name__}: {e}") from e
        raise


def sdpa_mha_prefill_runner(side: str, backend: Any, x: Inputs) -> Runner:
    """SDPA with `backend` pinned on [b, h, s, d] (every sequence s long) or once per sequence
    on views of the packed rows (the varlen mix), made here, outside the timed call; `out`
    converted to packed rows [tokens, h, d_v] by `unpack` (untimed). One untimed call first: a
    backend that refuses the case raises SideUnsupported with its message."""
    attend = _sdpa_prefill_setup(backend, x.tensors)
    calls = _sdpa_operands(x.tensors, ("q", "k", "v"))

    def call() -> Any:
        return attend(calls)

    _first_call(call)
    return Runner(side, call, None, ("out",), lambda result: (_to_rows(result),))


def sdpa_mha_backward_runner(side: str, backend: Any, x: Inputs) -> Runner:
    """The backward of SDPA with `backend` pinned: q, k, v of every call (as the forward's
    runner makes them) detached into leaves that require grad (the same memory), the forward
    run once here (untimed; a backend that refuses it or its backward raises SideUnsupported),
    and the timed call `torch.autograd.grad(outs, leaves, douts, retain_graph=True)` over the
    graph it built: the backend's backward kernels and what PyTorch's autograd adds around
    them. dq, dk, dv converted to packed rows by `unpack` (untimed)."""
    attend = _sdpa_prefill_setup(backend, x.tensors)
    leaves = [tuple(y.detach().requires_grad_() for y in qkv) for qkv in _sdpa_operands(x.tensors, ("q", "k", "v"))]
    douts = [dout for (dout,) in _sdpa_operands(x.tensors, ("dout",))]
    flat = [y for qkv in leaves for y in qkv]
    with torch.enable_grad():
        outs = _first_call(lambda: attend(leaves))

    def call() -> Any:
        return torch.autograd.grad(outs, flat, douts, retain_graph=True)

    def unpack(grads: Any) -> Any:  # (dq, dk, dv) of each call, in order -> packed rows of each
        return tuple(_to_rows(grads[i::3]) for i in range(3))

    _first_call(call)
    return Runner(side, call, None, ("dq", "dk", "dv"), unpack)


def sdpa_runner(side: str, backend: Any, family: str, x: Inputs) -> Runner:
    """torch SDPA with one backend pinned (an unavailable backend raises at the call)."""
    from torch.nn.attention import sdpa_kernel

    if family != "sdpa_mha":
        raise NotImplementedError(f"{side}: no {family} operation")
    t = x.tensors

    def call() -> Any:
        with sdpa_kernel([backend]):
            return (torch.nn.functional.scaled_dot_product_attention(t["q"], t["k"], t["v"], is_causal=t["causal"]),)

    return Runner(side, call, None, ("out",))


# Families whose sides need their own runners: (mlakit's, the prefix of the other sides'
# names, their runner). mlakit's runner serves every side whose name starts with mlakit (the
# backward's mlakit_deterministic).
_OWN_RUNNERS = {
    "gqa": (mlakit_gqa_runner, "sdpa", sdpa_gqa_runner),
    "mha_prefill": (mlakit_mha_prefill_runner, "sdpa", sdpa_mha_prefill_runner),
    "mha_backward": (mlakit_mha_backward_runner, "sdpa", sdpa_mha_backward_runner),
    "merge": (mlakit_merge_runner, "torch", torch_merge_runner),
}


def runner(side: str, handle: Any, family: str, x: Inputs) -> Runner:
    if family in _OWN_RUNNERS:
        mine, others, theirs = _OWN_RUNNERS[family]
        if side == "mlakit" or (side.startswith("mlakit_") and family == "mha_backward"):
            return mine(side, handle, x)
        if side.startswith(others):
            return theirs(side, handle, x)
        raise NotImplementedError(f"{side}: no {family} operation")
    if side in ("mlakit", "flashmla"):
        return flash_api_runner(side, handle, family, x)
    return sdpa_runner(side, handle, family, x)
