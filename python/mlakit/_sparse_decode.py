"""Token-sparse MLA decode over the FP8-with-scale cache (docs/contract.md, DeepSeek-V3.2):
plan once per step from topk (or topk_length), decode per layer."""

from __future__ import annotations

from typing import Any, Optional, Tuple

from . import _arrays as arrays
from . import _checks as checks
from . import _mlakit as _C
from ._decode import D_V, WorkspacePlan, check_plan


def mla_sparse_decode_plan(
    b: int, s_q: int, h_q: int, topk: int, like: Any, topk_length: Optional[Any] = None
) -> WorkspacePlan:
    """Schedule of one sparse decoding step, computed on the device on the current stream.

    ``like``: any array on the target device (the workspace comes from its framework);
    ``topk_length``: the optional [b] int32 device array the decode will get (then the
    schedule follows its values). Returns ``(workspace, plan)`` for :func:`mla_sparse_decode`;
    for a host ``like`` an empty workspace and a plan holding the problem only.
    """
    op = "mla_sparse_decode_plan"
    b = checks.integer(op, "b", b, bits=64)
    s_q = checks.integer(op, "s_q", s_q)
    h_q = checks.integer(op, "h_q", h_q)
    topk = checks.integer(op, "topk", topk)
    checks.array(op, "like", like, "[..., n]")
    checks.optional_array(op, "topk_length", topk_length, "[b]")
    if arrays.on_host(like):
        # The sparse schedule's problem: one sequence per (batch entry, query token).
        return arrays.empty(like, (0,), "uint8"), _C.host_plan(b * s_q, 1, h_q, 1, topk)
    with arrays.device_scope(like):
        workspace = arrays.empty(like, (_C.mla_sparse_decode_workspace_size(b, s_q, h_q, topk),), "uint8")
        plan = _C.mla_sparse_decode_plan(b, s_q, h_q, topk, topk_length, workspace, arrays.current_stream(like))
    return workspace, plan


def mla_sparse_decode(
    q: Any,
    kv_cache: Any,
    indices: Any,
    topk_length: Optional[Any] = None,
    attn_sink: Optional[Any] = None,
    softmax_scale: Optional[float] = None,
    plan: Optional[WorkspacePlan] = None,
) -> Tuple[Any, Any]:
    """Sparse MLA decode of one layer over the FP8 cache (docs/contract.md).

    q: [b, s_q, h_q, 576] bfloat16; kv_cache: [num_blocks, page_size, 1, 656] FP8-with-scale
    bytes (uint8, or a float8 view; see :func:`quantize_fp8_cache`); indices: [b, s_q, topk]
    int32 slots ``block * page_size + offset`` (-1 or out of range: skipped); topk_length:
    optional [b] int32 (only the first topk_length[i] indices count); attn_sink: optional
    [h_q] float32 (out *= 1 / (1 + exp(sink - lse))). ``softmax_scale`` defaults to
    1/sqrt(576). ``plan``: from :func:`mla_sparse_decode_plan` for device arrays (made here
    when None); host arrays ignore it.

    Returns ``(out [b, s_q, h_q, 512] bfloat16, lse [b, h_q, s_q] float32)``.
    """
    op = "mla_sparse_decode"
    checks.array(op, "q", q, "[b, s_q, h_q, d_qk]")
    checks.array(op, "kv_cache", kv_cache, "[num_blocks, page_block_size, 1, 656]")
    checks.array(op, "indices", indices, "[b, s_q, topk]")
    checks.optional_array(op, "topk_length", topk_length, "[b]")
    checks.optional_array(op, "attn_sink", attn_sink, "[h_q]")
    softmax_scale = checks.scale(op, "softmax_scale", softmax_scale)
    check_plan(op, plan)
    b, s_q, h_q = int(q.shape[0]), int(q.shape[1]), int(q.shape[2])
    out = arrays.empty(q, (b, s_q, h_q, D_V))
    lse = arrays.empty(q, (b, h_q, s_q), "float32")
    v = arrays.extension_view
    if arrays.on_host(q):
        _C.mla_sparse_decode_reference(v(q), v(kv_cache), indices, topk_length, attn_sink, v(out), lse, softmax_scale)
        return out, lse
    with arrays.device_scope(q):
        if plan is None:
            plan = mla_sparse_decode_plan(b, s_q, h_q, int(indices.shape[-1]), q, topk_length)
        _C.mla_sparse_decode_fp8(
            q, v(kv_cache), indices, topk_length, attn_sink, out, lse, plan[1], softmax_scale,
            arrays.current_stream(q),
        )
    return out, lse
