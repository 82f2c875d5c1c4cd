"""Token-sparse MLA decode over an FP8 cache (docs/contract.md): DeepSeek-V3.2 tokens (q d_qk
576, the 656-byte cache) or DeepSeek V4 tokens (q d_qk 512, the 584-byte cache), optionally
with a second cache of the same layout whose tokens join the first's under one softmax. Plan
once per step from topk / extra_topk (or their length arrays), decode per layer."""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

from . import _arrays as arrays
from . import _checks as checks
from . import _mlakit as _C
from ._decode import D_V, WorkspacePlan, check_plan

#: The C++ argument names of the second cache, as mlakit.mla_sparse_decode spells them.
EXTRA_NAMES = ("extra_kv_cache", "extra_indices", "extra_topk_length")


def check_second_cache(
    op: str, extra_kv_cache: Any, extra_indices: Any, extra_topk_length: Any, names: Tuple[str, str, str] = EXTRA_NAMES
) -> int:
    """The second cache's arrays come together (its cache and its indices; its lengths only
    with them); returns its topk (extra_indices.shape[-1]), 0 without one. ``names``: the
    caller's names of the three arguments, for the errors."""
    cache_name, indices_name, lengths_name = names
    checks.optional_array(op, cache_name, extra_kv_cache, "[num_blocks, page_block_size, 1, bytes_per_token]")
    checks.optional_array(op, indices_name, extra_indices, "[b, s_q, extra_topk]")
    checks.optional_array(op, lengths_name, extra_topk_length, "[b]")
    if (extra_kv_cache is None) != (extra_indices is None):
        missing, given = (indices_name, cache_name) if extra_indices is None else (cache_name, indices_name)
        raise ValueError(
            f"{op}: {missing}: expected an array with {given} (the second cache and its indices come together), "
            "got None"
        )
    if extra_indices is None:
        if extra_topk_length is not None:
            raise ValueError(
                f"{op}: {lengths_name}: expected None without {cache_name} and {indices_name} (no second cache), "
                "got an array"
            )
        return 0
    return int(extra_indices.shape[-1])


def mla_sparse_decode_plan(
    b: int,
    s_q: int,
    h_q: int,
    topk: int,
    like: Any,
    topk_length: Optional[Any] = None,
    extra_topk: int = 0,
    extra_topk_length: Optional[Any] = None,
) -> WorkspacePlan:
    """Schedule of one sparse decoding step, computed on the device on the current stream.

    ``like``: any array on the target device (the workspace comes from its framework);
    ``topk_length``: the optional [b] int32 device array the decode will get (then the
    schedule follows its values). With a second cache: ``extra_topk`` its indices per query
    token (``extra_indices.shape[-1]``; 0: no second cache) and ``extra_topk_length`` its
    optional [b] int32 lengths. The plan serves decodes with exactly these index lists (the
    same topk and extra_topk, the length arrays given or not as here), of either token layout.
    Returns ``(workspace, plan)`` for :func:`mla_sparse_decode`; for a host ``like`` an empty
    workspace and a plan holding the problem only.
    """
    op = "mla_sparse_decode_plan"
    b = checks.integer(op, "b", b, bits=64)
    s_q = checks.integer(op, "s_q", s_q)
    h_q = checks.integer(op, "h_q", h_q)
    topk = checks.integer(op, "topk", topk)
    extra_topk = checks.integer(op, "extra_topk", extra_topk)
    checks.array(op, "like", like, "[..., n]")
    checks.optional_array(op, "topk_length", topk_length, "[b]")
    checks.optional_array(op, "extra_topk_length", extra_topk_length, "[b]")
    if arrays.on_host(like):
        plan = _C.mla_sparse_decode_host_plan(
            b, s_q, h_q, topk, topk_length is not None, extra_topk, extra_topk_length is not None
        )
        return arrays.empty(like, (0,), "uint8"), plan
    with arrays.device_scope(like):
        size = _C.mla_sparse_decode_workspace_size(b, s_q, h_q, topk, extra_topk)
        workspace = arrays.empty(like, (size,), "uint8")
        plan = _C.mla_sparse_decode_plan(
            b, s_q, h_q, topk, topk_length, workspace, arrays.current_stream(like), extra_topk, extra_topk_length
        )
    return workspace, plan


def plan_lists(plan: Any) -> Dict[str, Any]:
    """The index lists a sparse plan was made for: ``{'topk', 'topk_length', 'extra_topk',
    'extra_topk_length'}`` (the length entries: whether those arrays were given)."""
    return _C.mla_sparse_decode_plan_lists(plan)


def mla_sparse_decode(
    q: Any,
    kv_cache: Any,
    indices: Any,
    topk_length: Optional[Any] = None,
    attn_sink: Optional[Any] = None,
    softmax_scale: Optional[float] = None,
    plan: Optional[WorkspacePlan] = None,
    extra_kv_cache: Optional[Any] = None,
    extra_indices: Optional[Any] = None,
    extra_topk_length: Optional[Any] = None,
) -> Tuple[Any, Any]:
    """Sparse MLA decode of one layer over an FP8 cache (docs/contract.md).

    Two token layouts, told apart by q's last dimension:

    - DeepSeek V3.2: q [b, s_q, h_q, 576] bfloat16; kv_cache [num_blocks, page_size, 1, 656]
      FP8-with-scale bytes (uint8, or a float8 view; see :func:`quantize_fp8_cache`).
    - DeepSeek V4: q [b, s_q, h_q, 512] bfloat16; kv_cache [num_blocks, page_size, 1, 584]
      as :func:`quantize_fp8_v4_cache` returns it (a view whose stride[1] is 584 and whose
      blocks lie a padded block stride apart).

    indices: [b, s_q, topk] int32 slots ``block * page_size + offset`` (-1 or out of range:
    skipped; duplicates count twice); topk_length: optional [b] int32 (only the first
    topk_length[i] indices count); attn_sink: optional [h_q] float32 (out *= 1 / (1 +
    exp(sink - lse))). ``softmax_scale`` defaults to 1/sqrt(d_qk).

    Second cache (optional): ``extra_kv_cache`` of the same layout as kv_cache (its own
    num_blocks and page_size), ``extra_indices`` [b, s_q, extra_topk] int32 slots into it, and
    optional ``extra_topk_length`` [b] int32. Each row attends to the union of both token lists
    under one softmax: the LSE covers both, the sink applies once, and a row with no valid
    token in either list gives 0 and +inf.

    ``plan``: from :func:`mla_sparse_decode_plan` for device arrays (made here when None, for
    this call's topk, extra_topk and length arrays); host arrays ignore it.

    Returns ``(out [b, s_q, h_q, 512] bfloat16, lse [b, h_q, s_q] float32)``.
    """
    op = "mla_sparse_decode"
    checks.array(op, "q", q, "[b, s_q, h_q, d_qk]")
    checks.array(op, "kv_cache", kv_cache, "[num_blocks, page_block_size, 1, bytes_per_token]")
    checks.array(op, "indices", indices, "[b, s_q, topk]")
    checks.optional_array(op, "topk_length", topk_length, "[b]")
    checks.optional_array(op, "attn_sink", attn_sink, "[h_q]")
    extra_topk = check_second_cache(op, extra_kv_cache, extra_indices, extra_topk_length)
    softmax_scale = checks.scale(op, "softmax_scale", softmax_scale)
    check_plan(op, plan)
    b, s_q, h_q = int(q.shape[0]), int(q.shape[1]), int(q.shape[2])
    out = arrays.empty(q, (b, s_q, h_q, D_V))
    lse = arrays.empty(q, (b, h_q, s_q), "float32")
    v = arrays.extension_view
    if arrays.on_host(q):
        _C.mla_sparse_decode_reference(
            v(q), v(kv_cache), indices, topk_length, attn_sink, v(out), lse, softmax_scale,
            v(extra_kv_cache), extra_indices, extra_topk_length,
        )
        return out, lse
    with arrays.device_scope(q):
        if plan is None:
            plan = mla_sparse_decode_plan(
                b, s_q, h_q, int(indices.shape[-1]), q, topk_length, extra_topk, extra_topk_length
            )
        x = arrays.to_extension
        _C.mla_sparse_decode_fp8(
            x(q), x(kv_cache), x(indices), x(topk_length), x(attn_sink), x(out), x(lse), plan[1], softmax_scale,
            arrays.current_stream(q), x(extra_kv_cache), x(extra_indices), x(extra_topk_length),
        )
    return out, lse
