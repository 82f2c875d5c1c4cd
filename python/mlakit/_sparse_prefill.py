"""Token-sparse MLA prefill (SPEC section 3): each query token attends to its own topk rows."""

from __future__ import annotations

from typing import Any, Optional, Tuple

from . import _arrays as arrays
from . import _mlakit as _C


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
    """Sparse MLA prefill (SPEC section 3).

    q: [s_q, h_q, d_qk] bfloat16 (d_qk 576 or 512); kv: [s_kv, 1, d_qk] bfloat16; indices:
    [s_q, 1, topk] int32 (< 0 or >= s_kv: skipped); ``sm_scale`` defaults to 1/sqrt(d_qk);
    attn_sink: optional [h_q] float32; topk_length: optional [s_q] int32.
    ``lse_base``: '2' (FlashMLA's convention: P = q.k * sm_scale * log2(e), lse = log2 sum 2^P)
    or 'e' (natural-log statistics).

    Returns ``(out [s_q, h_q, d_v] bfloat16, max_logits [s_q, h_q] float32, lse [s_q, h_q]
    float32)``; a row with no valid index gives 0, -inf, +inf.

    Host arrays run the CPU reference; device arrays the GPU kernel on the current stream.
    """
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
