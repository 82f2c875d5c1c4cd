"""Dense MLA decode over a paged cache (docs/contract.md): plan once per step, decode per layer."""

from __future__ import annotations

from typing import Any, Optional, Tuple

from . import _arrays as arrays
from . import _checks as checks
from . import _mlakit as _C

MlaDecodePlan = _C.MlaDecodePlan
#: A plan and the workspace it lives in: keep both for as long as the plan is used.
WorkspacePlan = Tuple[Any, MlaDecodePlan]

D_V = 512
KERNELS = ("auto", "portable", "sm90")


def mla_decode_plan(cache_seqlens: Any, s_q: int, h_q: int, h_kv: int = 1, kernel: str = "auto") -> WorkspacePlan:
    """Split-KV schedule of one decoding step, computed on the device from ``cache_seqlens``
    ([b] int32, device) on the current stream; nothing is read back to the host, so it can be
    captured in a CUDA graph.

    ``kernel``: 'auto' (the Hopper kernel on compute capability 9.0, else the portable one),
    'portable' or 'sm90'. Returns ``(workspace, plan)``, the workspace allocated by
    ``cache_seqlens``' framework: pass it to every layer's :func:`mla_decode` of the step.
    For host arrays (the CPU reference needs no schedule) the workspace is empty and the plan
    holds the problem only (``plan.kernel == 'reference'``).
    """
    op = "mla_decode_plan"
    checks.array(op, "cache_seqlens", cache_seqlens, "[b]")
    s_q = checks.integer(op, "s_q", s_q)
    h_q = checks.integer(op, "h_q", h_q)
    h_kv = checks.integer(op, "h_kv", h_kv)
    checks.choice(op, "kernel", kernel, KERNELS)
    b = int(cache_seqlens.shape[0])
    if arrays.on_host(cache_seqlens):
        return arrays.empty(cache_seqlens, (0,), "uint8"), _C.host_plan(b, s_q, h_q, h_kv)
    with arrays.device_scope(cache_seqlens):
        workspace = arrays.empty(cache_seqlens, (_C.mla_decode_workspace_size(b, s_q, h_q, h_kv, kernel),), "uint8")
        plan = _C.mla_decode_plan(
            b, s_q, h_q, h_kv, cache_seqlens, workspace, arrays.current_stream(cache_seqlens), kernel
        )
    return workspace, plan


def check_plan(op: str, plan: Any, plan_type: type = MlaDecodePlan,
               source: str = "the plan function") -> Optional[Tuple[Any, Any]]:
    """None, or the ``(workspace, plan)`` pair a plan function returned (its plan a ``plan_type``;
    ``source`` names the function in the error)."""
    if plan is not None and not (isinstance(plan, tuple) and len(plan) == 2 and isinstance(plan[1], plan_type)):
        raise TypeError(f"{op}: plan: expected None or the (workspace, plan) pair of {source}, got {type(plan).__name__}")
    return plan


def mla_decode(
    q: Any,
    kv_cache: Any,
    block_table: Any,
    cache_seqlens: Any,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    plan: Optional[WorkspacePlan] = None,
) -> Tuple[Any, Any]:
    """Dense MLA decode of one layer over a paged cache (docs/contract.md).

    q: [b, s_q, h_q, 576]; kv_cache: [num_blocks, page_size, h_kv, 576] (same dtype, bfloat16
    or float16); block_table: [b, max_blocks] int32; cache_seqlens: [b] int32.
    ``softmax_scale`` defaults to 1/sqrt(576) (None; NaN and infinities are errors);
    ``causal`` masks the s_q new tokens (MTP). ``plan``: the ``(workspace, plan)`` of
    :func:`mla_decode_plan` for device arrays (made here when None); host arrays ignore it.

    Returns ``(out [b, s_q, h_q, 512] in q's dtype, lse [b, h_q, s_q] float32)``, natural-log
    LSE; rows that see no key give 0 and +inf.
    """
    op = "mla_decode"
    checks.array(op, "q", q, "[b, s_q, h_q, d_qk]")
    checks.array(op, "kv_cache", kv_cache, "[num_blocks, page_block_size, h_kv, d_qk]")
    checks.array(op, "block_table", block_table, "[b, max_blocks_per_seq]")
    checks.array(op, "cache_seqlens", cache_seqlens, "[b]")
    softmax_scale = checks.scale(op, "softmax_scale", softmax_scale)
    causal = checks.flag(op, "causal", causal)
    check_plan(op, plan)
    b, s_q, h_q = int(q.shape[0]), int(q.shape[1]), int(q.shape[2])
    out = arrays.empty(q, (b, s_q, h_q, D_V))
    lse = arrays.empty(q, (b, h_q, s_q), "float32")
    v = arrays.extension_view
    if arrays.on_host(q):
        _C.mla_decode_reference(v(q), v(kv_cache), block_table, cache_seqlens, v(out), lse, softmax_scale, causal)
        return out, lse
    with arrays.device_scope(q):
        if plan is None:
            if arrays.on_host(cache_seqlens):  # its plan would be the CPU reference's placeholder
                raise ValueError("mla_decode: cache_seqlens: expected device memory (q is on the device), got a host array")
            plan = mla_decode_plan(cache_seqlens, s_q, h_q, int(kv_cache.shape[2]))
        x = arrays.to_extension
        _C.mla_decode(
            x(q), x(kv_cache), x(block_table), x(cache_seqlens), x(out), x(lse), plan[1], softmax_scale, causal,
            arrays.current_stream(q),
        )
    return out, lse
