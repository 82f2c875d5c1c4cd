"""Token-sparse MLA prefill (docs/contract.md): each query token attends to its own topk rows."""

from __future__ import annotations

from typing import Any, Optional, Tuple

from . import _arrays as arrays
from . import _checks as checks
from . import _mlakit as _C

LSE_BASES = ("2", "e")


def mla_sparse_prefill(
    q: Any,
    kv: Any,
    indices: Any,
    sm_scale: Optional[float] = None,
    d_v: int = 512,
    attn_sink: Optional[Any] = None,
    topk_length: Optional[Any] = None,
    lse_base: str = "2",
) -> Tuple[Any, Any, Any]:
    """Sparse MLA prefill (docs/contract.md).

    q: [s_q, h_q, d_qk] bfloat16 (d_qk 576 or 512); kv: [s_kv, 1, d_qk] bfloat16; indices:
    [s_q, 1, topk] int32 (< 0 or >= s_kv: skipped); ``sm_scale`` defaults to 1/sqrt(d_qk)
    (None; NaN and infinities are errors); attn_sink: optional [h_q] float32; topk_length:
    optional [s_q] int32. ``lse_base``: '2' (docs/contract.md: P = q.k * sm_scale * log2(e),
    lse = log2 sum 2^P) or 'e' (natural-log statistics, what FlashMLA's Hopper releases return).

    Returns ``(out [s_q, h_q, d_v] bfloat16, max_logits [s_q, h_q] float32, lse [s_q, h_q]
    float32)``; a row with no valid index gives 0, -inf, +inf.

    Host arrays run the CPU reference; device arrays the GPU kernel on the current stream.
    """
    op = "mla_sparse_prefill"
    return _prefill(op, q, kv, indices, sm_scale, d_v, attn_sink, topk_length, lse_base)


def _prefill(
    op: str,
    q: Any,
    kv: Any,
    indices: Any,
    sm_scale: Optional[float],
    d_v: int,
    attn_sink: Optional[Any],
    topk_length: Optional[Any],
    lse_base: str,
) -> Tuple[Any, Any, Any]:
    """mla_sparse_prefill, its argument errors named after `op` (the caller's function)."""
    sm_scale, d_v = check_arguments(op, q, kv, indices, sm_scale, d_v, attn_sink, topk_length, lse_base)
    s_q, h_q = int(q.shape[0]), int(q.shape[1])
    out = arrays.empty(q, (s_q, h_q, d_v))
    max_logits = arrays.empty(q, (s_q, h_q), "float32")
    lse = arrays.empty(q, (s_q, h_q), "float32")
    v = arrays.extension_view
    args = (v(q), v(kv), indices, topk_length, attn_sink, v(out), max_logits, lse, sm_scale, d_v, lse_base)
    if arrays.on_host(q):
        _C.mla_sparse_prefill_reference(*args)
    else:
        with arrays.device_scope(q):
            _C.mla_sparse_prefill(*args, arrays.current_stream(q))
    return out, max_logits, lse


def check_arguments(
    op: str,
    q: Any,
    kv: Any,
    indices: Any,
    sm_scale: Optional[float],
    d_v: int,
    attn_sink: Optional[Any],
    topk_length: Optional[Any],
    lse_base: str,
) -> Tuple[Optional[float], int]:
    """The argument checks of mla_sparse_prefill, named after `op`; returns (sm_scale, d_v)."""
    checks.array(op, "q", q, "[s_q, h_q, d_qk]")
    checks.array(op, "kv", kv, "[s_kv, h_kv, d_qk]")
    checks.array(op, "indices", indices, "[s_q, h_kv, topk]")
    sm_scale = checks.scale(op, "sm_scale", sm_scale)
    # out is [s_q, h_q, d_v]: bounded by q's size before anything is allocated (the library
    # takes d_v 512 only, d_qk 576 or 512).
    d_v = checks.integer(op, "d_v", d_v, minimum=1)
    if d_v > int(q.shape[2]):
        raise ValueError(f"{op}: d_v: expected <= d_qk = {int(q.shape[2])} (V is the first d_v columns), got {d_v}")
    checks.optional_array(op, "attn_sink", attn_sink, "[h_q]")
    checks.optional_array(op, "topk_length", topk_length, "[s_q]")
    checks.choice(op, "lse_base", lse_base, LSE_BASES)
    return sm_scale, d_v
