"""GQA / MHA decode over a paged, optionally quantized KV cache (docs/contract.md, GQA decode):
plan once per step, decode per layer, with this step's new keys and values appended (keys
rotated) in the same call."""

from __future__ import annotations

from typing import Any, Optional, Tuple, Union

from . import _arrays as arrays
from . import _checks as checks
from . import _mlakit as _C
from ._decode import check_plan
from ._gqa_cache import call, check_cache, rope_arguments, same_place, scale_argument

GqaDecodePlan = _C.GqaDecodePlan
#: A plan and the workspace it lives in: keep both for as long as the plan is used.
GqaWorkspacePlan = Tuple[Any, GqaDecodePlan]


def gqa_decode_plan(
    cache_seqlens: Any, s_q: int, h_q: int, h_kv: int, d: int, causal: bool = False, window: int = 0
) -> GqaWorkspacePlan:
    """Split-KV schedule of one decoding step, computed on the device from ``cache_seqlens``
    ([b] int32, device: the lengths after this step's append) on the current stream; nothing
    is read back to the host, so it can be captured in a CUDA graph.

    ``causal`` and ``window`` must be the decode's (they bound the keys each sequence is
    scheduled). Returns ``(workspace, plan)``, the workspace allocated by ``cache_seqlens``'
    framework: pass the pair to every layer's :func:`gqa_decode` of the step. For host arrays
    (the CPU reference needs no schedule) the workspace is empty and the plan holds the
    problem only (``plan.kernel == 'reference'``).
    """
    op = "gqa_decode_plan"
    checks.array(op, "cache_seqlens", cache_seqlens, "[b]")
    s_q = checks.integer(op, "s_q", s_q)
    h_q = checks.integer(op, "h_q", h_q)
    h_kv = checks.integer(op, "h_kv", h_kv)
    d = checks.integer(op, "d", d)
    causal = checks.flag(op, "causal", causal)
    window = checks.integer(op, "window", window)
    b = int(cache_seqlens.shape[0])
    if arrays.on_host(cache_seqlens):
        return arrays.empty(cache_seqlens, (0,), "uint8"), _C.gqa_host_plan(b, s_q, h_q, h_kv, d, causal, window)
    with arrays.device_scope(cache_seqlens):
        size = _C.gqa_decode_workspace_size(b, s_q, h_q, h_kv, d, causal, window)
        workspace = arrays.empty(cache_seqlens, (size,), "uint8")
        plan = call(op, _C.gqa_decode_plan, b, s_q, h_q, h_kv, d, causal, window, cache_seqlens, workspace,
                    arrays.current_stream(cache_seqlens))
    return workspace, plan


def gqa_decode(
    q: Any,
    k_cache: Any,
    v_cache: Any,
    block_table: Any,
    cache_seqlens: Any,
    *,
    k_scale: Optional[Any] = None,
    v_scale: Optional[Any] = None,
    k_new: Optional[Any] = None,
    v_new: Optional[Any] = None,
    rope_style: Optional[str] = None,
    rope_theta: float = 10000.0,
    rotary_dim: int = 0,
    alibi_slopes: Optional[Any] = None,
    finished: Optional[Any] = None,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window: int = 0,
    softcap: float = 0.0,
    return_lse: bool = False,
    out: Optional[Any] = None,
    plan: Optional[GqaWorkspacePlan] = None,
) -> Union[Any, Tuple[Any, Any]]:
    """GQA / MHA decode of one layer over a paged cache (docs/contract.md, GQA decode).

    q: [b, s_q, h_q, d] bfloat16 / float16 (s_q 1..8, d 64, 128 or 256); k_cache, v_cache:
    [num_blocks, page_size, h_kv, d] in q's dtype, int8 or fp8 (float8 e4m3, or its uint8
    bytes) with ``k_scale`` / ``v_scale`` float32 [num_blocks, page_size, h_kv] (per token and
    kv head) or [1] / a float (fp8, per tensor); block_table [b, max_blocks] int32;
    cache_seqlens [b] int32, each sequence's length *after* this step's append.

    - ``k_new``, ``v_new`` [b, s_q, h_kv, d] (q's dtype): written into the caches at positions
      ``[L - s_q, L)`` (k rotated, both quantized to the caches' format; the caches and
      per-token scales are modified in place) before the attention reads them.
    - ``rope_style`` None, 'neox' or 'gptj': rotary embedding of q and k_new at their cache
      positions over the first ``rotary_dim`` columns (0: all d), angle ``pos *
      rope_theta^(-2c / rotary_dim)``.
    - Query token t sits at position ``L - s_q + t``; ``causal`` (s_q > 1): it sees keys up to
      it; ``window`` > 0 keeps the last ``window`` of those. Logits ``softmax_scale`` (None:
      1/sqrt(d)) times q.k, then ``softcap * tanh(s / softcap)`` when ``softcap`` > 0, then
      ``alibi_slopes[h] * (j - pos)`` (``alibi_slopes`` [h_q] float32).
    - ``finished`` [b] uint8: nonzero entries are skipped (their outputs and cache untouched).
    - ``out``: an output array [b, s_q, h_q, d] to write (allocated in q's dtype when None).
    - ``plan``: the ``(workspace, plan)`` of :func:`gqa_decode_plan` for device arrays (made
      here when None); host arrays ignore it.

    Returns ``out`` [b, s_q, h_q, d], or ``(out, lse)`` with ``return_lse`` (``lse`` [b, h_q,
    s_q] float32, natural log). Rows that see no key give 0 and +inf. Host arrays run the
    float64 CPU reference (which also checks the lengths and appended slots it can read);
    device arrays the GPU kernels, on the current stream.
    """
    op = "gqa_decode"
    checks.array(op, "q", q, "[b, s_q, h_q, d]")
    check_cache(op, "k_cache", k_cache)
    check_cache(op, "v_cache", v_cache)
    checks.array(op, "block_table", block_table, "[b, max_blocks_per_seq]")
    checks.array(op, "cache_seqlens", cache_seqlens, "[b]")
    checks.optional_array(op, "k_new", k_new, "[b, s_q, h_kv, d]")
    checks.optional_array(op, "v_new", v_new, "[b, s_q, h_kv, d]")
    k_scale = scale_argument(op, "k_scale", k_scale, q)
    v_scale = scale_argument(op, "v_scale", v_scale, q)
    if k_new is not None or v_new is not None:  # the append writes the caches and per-token scales
        checks.writable(op, "k_cache", k_cache)
        checks.writable(op, "v_cache", v_cache)
        for name, scale in (("k_scale", k_scale), ("v_scale", v_scale)):
            if scale is not None and len(scale.shape) == 3:
                checks.writable(op, name, scale)
    style, theta, rot = rope_arguments(op, rope_style, rope_theta, rotary_dim)
    checks.optional_array(op, "alibi_slopes", alibi_slopes, "[h_q]")
    checks.optional_array(op, "finished", finished, "[b]")
    softmax_scale = checks.scale(op, "softmax_scale", softmax_scale)
    causal = checks.flag(op, "causal", causal)
    window = checks.integer(op, "window", window)
    softcap = checks.real(op, "softcap", softcap)
    return_lse = checks.flag(op, "return_lse", return_lse)
    if out is not None:
        checks.writable(op, "out", checks.array(op, "out", out, "[b, s_q, h_q, d]"))
    check_plan(op, plan, GqaDecodePlan, "gqa_decode_plan")
    same_place(op, "q", q, dict(k_cache=k_cache, v_cache=v_cache, block_table=block_table,
                                 cache_seqlens=cache_seqlens, k_scale=k_scale, v_scale=v_scale, k_new=k_new,
                                 v_new=v_new, alibi_slopes=alibi_slopes, finished=finished, out=out))

    b, s_q, h_q, d = (int(n) for n in q.shape)
    if out is None:
        out = arrays.empty(q, (b, s_q, h_q, d))
    lse = arrays.empty(q, (b, h_q, s_q), "float32") if return_lse else None
    v = arrays.extension_view
    common = (v(q), v(k_cache), k_scale, v(v_cache), v_scale, block_table, cache_seqlens, v(k_new), v(v_new), style,
              theta, rot, alibi_slopes, finished, v(out), lse, softmax_scale, causal, window, softcap)
    if arrays.on_host(q):
        call(op, _C.gqa_decode_reference, *common)
    else:
        with arrays.device_scope(q):
            if plan is None:
                plan = gqa_decode_plan(cache_seqlens, s_q, h_q, int(k_cache.shape[2]), d, causal, window)
            call(op, _C.gqa_decode, *common, plan[1], arrays.current_stream(q))
    return (out, lse) if return_lse else out
