"""Dense MHA prefill forward over variable-length sequences (include/mlakit/mha_prefill.h):
the float64 CPU reference on host arrays; the GPU kernels are issue 26's next step."""

from __future__ import annotations

from typing import Any, Optional, Tuple

from . import _arrays as arrays
from . import _checks as checks
from . import _mlakit as _C


def mha_prefill(
    q: Any,
    k: Any,
    v: Any,
    cu_seqlens_q: Any,
    cu_seqlens_k: Any,
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
) -> Tuple[Any, Any]:
    """Attention of each sequence's queries over its keys: q [total_q, h_q, d_qk], k
    [total_k, h_kv, d_qk], v [total_k, h_kv, d_v] (bfloat16 / float16, h_q a multiple of
    h_kv; (d_qk, d_v) in (64, 64), (128, 128), (192, 128), (256, 256)); cu_seqlens_q /
    cu_seqlens_k [b + 1] int32 prefix sums starting at 0 (lengths may be 0); max_seqlen_q /
    max_seqlen_k at least every length. ``causal``: bottom-right aligned (query t of a
    sequence of lengths (Lq, Lk) sees keys j <= t + Lk - Lq). ``softmax_scale`` defaults to
    1/sqrt(d_qk).

    Returns ``(out [total_q, h_q, d_v] in q's dtype, lse [h_q, total_q] float32)``, natural
    log; a query that sees no key gives 0 and +inf; rows in no sequence are 0. Host arrays
    only for now: device arrays raise NotImplementedError.
    """
    op = "mha_prefill"
    checks.array(op, "q", q, "[total_q, h_q, d_qk]")
    checks.array(op, "k", k, "[total_k, h_kv, d_qk]")
    checks.array(op, "v", v, "[total_k, h_kv, d_v]")
    checks.array(op, "cu_seqlens_q", cu_seqlens_q, "[b + 1]")
    checks.array(op, "cu_seqlens_k", cu_seqlens_k, "[b + 1]")
    max_seqlen_q = checks.integer(op, "max_seqlen_q", max_seqlen_q)
    max_seqlen_k = checks.integer(op, "max_seqlen_k", max_seqlen_k)
    softmax_scale = checks.scale(op, "softmax_scale", softmax_scale)
    causal = checks.flag(op, "causal", causal)
    if not arrays.on_host(q):
        raise NotImplementedError(f"{op}: device arrays: the GPU kernels are not built yet (host arrays run the CPU "
                                  "reference)")
    total_q, h_q = int(q.shape[0]), int(q.shape[1])
    out = arrays.full(q, (total_q, h_q, int(v.shape[2])), None, 0)  # rows in no sequence: 0
    lse = arrays.full(q, (h_q, total_q), "float32", 0)
    v_ = arrays.extension_view
    _C.mha_prefill_reference(v_(q), v_(k), v_(v), cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, v_(out),
                             lse, softmax_scale, causal)
    return out, lse
