"""FlashMLA's Python API on mlakit: ``from mlakit import flash_mla`` in place of ``import
flash_mla``, same names, arguments, defaults, shapes and return values.

- ``get_mla_metadata()`` returns ``(FlashMLASchedMeta(), None)`` (FlashMLA's current API): the
  first ``flash_mla_with_kvcache`` call of a step makes the schedule, the other layers reuse it.
- ``get_mla_metadata(cache_seqlens, num_q_tokens_per_head_k, num_heads_k, num_heads_q=None,
  is_fp8_kvcache=False, topk=None)`` returns ``(tile_scheduler_metadata [num_sm_parts, 8]
  int32, num_splits [b + 1] int32)`` (FlashMLA's earlier API), computed on the device now.
- ``flash_mla_with_kvcache`` takes either form: dense bf16/fp16 decode, or with
  ``is_fp8_kvcache=True`` and ``indices`` the token-sparse decode over an FP8 cache: DeepSeek
  V3.2's 656-byte tokens (q d_qk 576) or DeepSeek V4's 584-byte tokens (q d_qk 512), with an
  optional second cache (``extra_k_cache``, ``extra_indices_in_kvcache``,
  ``extra_topk_length``) whose tokens join the first's under one softmax. A
  ``FlashMLASchedMeta`` records the first call's configuration (``extra_page_block_size`` and
  ``extra_topk`` included) and later calls must agree, as in FlashMLA; metadata arrays from
  ``get_mla_metadata(*args)`` (no length or second-cache arguments there) serve only calls
  without topk_length and without a second cache.
- ``flash_mla_sparse_fwd``: sparse prefill. Like the FlashMLA that engines run on Hopper, it
  returns natural-log ``max_logits`` and ``lse``; ``lse_base="2"`` (keyword only, mlakit's
  one switch) returns base-2 ones, as FlashMLA's 2025 releases did (docs/contract.md).
- ``flash_attn_varlen_func`` / ``flash_attn_varlen_qkvpacked_func`` /
  ``flash_attn_varlen_kvpacked_func``: the dense MHA prefill forward (varlen, causal
  bottom-right, GQA) through ``torch.ops.mlakit.mha_prefill``; ``lse`` as FlashMLA returns it,
  ``[total_q, h_q]`` viewing an ``[h_q, total_q]`` buffer. Differentiable in q, k, v (or
  qkv / kv) on PyTorch tensors (the backward ``mlakit.mha_prefill_backward``, ``deterministic``
  honoured there); ``dropout_p`` must be 0.

Host arrays (NumPy, CPU tensors) run the float64 CPU reference and need no metadata. What is
not honoured raises NotImplementedError: the dense FP8 cache, the sparse decode over a bf16
cache, indexer_topk > 0, dropout_p != 0 and is_varlen=False. docs/python.md has the details.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any, Optional, Tuple, Union

from . import _arrays as arrays
from . import _checks as checks
from . import _flash_mla_schedule as schedules
from . import _mha_prefill
from ._decode import D_V, mla_decode, mla_decode_plan
from ._mlakit import mla_decode as _decode_on_device
from ._mlakit import mla_sparse_decode_fp8 as _sparse_decode_on_device
from ._sparse_decode import check_second_cache, mla_sparse_decode, mla_sparse_decode_plan
from ._sparse_prefill import _prefill
from ._sparse_prefill import check_arguments as check_prefill_arguments

#: FlashMLA's names of the second cache's arguments.
_EXTRA_NAMES = ("extra_k_cache", "extra_indices_in_kvcache", "extra_topk_length")

__all__ = [
    "FlashMLASchedMeta",
    "get_mla_metadata",
    "flash_mla_with_kvcache",
    "flash_mla_sparse_fwd",
    "flash_attn_varlen_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_varlen_kvpacked_func",
]


@dataclasses.dataclass
class FlashMLASchedMeta:
    """Scheduler metadata of one decoding step, filled by the first ``flash_mla_with_kvcache``
    call that receives it; reuse it for the step's other layers (same shapes, same
    cache_seqlens / topk_length values)."""

    @dataclasses.dataclass
    class Config:
        b: int
        s_q: int
        h_q: int
        page_block_size: int
        h_k: int
        causal: bool
        is_fp8_kvcache: bool
        topk: Optional[int]
        extra_page_block_size: Optional[int]
        extra_topk: Optional[int]

    have_initialized: bool = False
    config: Optional[Config] = None
    #: Views of the plan's workspace, for inspection: [num_parts, 8] and [b + 1] int32
    #: ([b * s_q + 1] for the sparse decode, which schedules each query token on its own).
    tile_scheduler_metadata: Optional[Any] = None
    num_splits: Optional[Any] = None
    _schedule: Optional[schedules.Schedule] = dataclasses.field(default=None, repr=False)


def get_mla_metadata(
    cache_seqlens: Optional[Any] = None,
    num_q_tokens_per_head_k: Optional[int] = None,
    num_heads_k: Optional[int] = None,
    num_heads_q: Optional[int] = None,
    is_fp8_kvcache: bool = False,
    topk: Optional[int] = None,
) -> Union[Tuple[FlashMLASchedMeta, None], Tuple[Any, Any]]:
    """Scheduling metadata of one decoding step.

    Without arguments: ``(FlashMLASchedMeta(), None)``, filled by the first
    :func:`flash_mla_with_kvcache` call.

    With arguments: ``(tile_scheduler_metadata [num_sm_parts, 8] int32, num_splits [b + 1]
    int32)`` for ``cache_seqlens`` ([b] int32), computed on the device on the current stream.
    ``num_q_tokens_per_head_k`` = s_q * h_q / h_k; ``num_heads_k`` = h_k. For the sparse FP8
    decode pass ``num_heads_q``, ``is_fp8_kvcache=True`` and ``topk``; this form takes no
    topk_length and no second cache, so its sparse schedule serves only calls without
    topk_length and without extra_k_cache (a ValueError otherwise: use the object form). Pass the returned arrays themselves to flash_mla_with_kvcache (mlakit finds its
    plan from them, so copies cost a new plan per call). Host arrays get placeholders of the
    same shapes (the CPU reference needs no schedule).
    """
    op = "get_mla_metadata"
    if cache_seqlens is None:
        return FlashMLASchedMeta(), None
    if num_q_tokens_per_head_k is None or num_heads_k is None:
        raise TypeError(f"{op}: pass no argument, or cache_seqlens, num_q_tokens_per_head_k and num_heads_k")
    checks.array(op, "cache_seqlens", cache_seqlens, "[b]")
    num_q_tokens_per_head_k = checks.integer(op, "num_q_tokens_per_head_k", num_q_tokens_per_head_k)
    num_heads_k = checks.integer(op, "num_heads_k", num_heads_k, minimum=1)
    if num_heads_q is not None:
        num_heads_q = checks.integer(op, "num_heads_q", num_heads_q, minimum=1)
    if topk is not None:
        topk = checks.integer(op, "topk", topk)
    is_fp8_kvcache = checks.flag(op, "is_fp8_kvcache", is_fp8_kvcache)
    b = int(cache_seqlens.shape[0])
    sparse = topk is not None
    _check_cache_kind(is_fp8_kvcache, sparse)
    if arrays.on_host(cache_seqlens):
        placeholders = arrays.empty(cache_seqlens, (1, 8), "int32"), arrays.empty(cache_seqlens, (b + 1,), "int32")
        for array in placeholders:
            array[...] = 0
        return placeholders
    if sparse:
        if num_heads_q is None:
            raise ValueError(
                "get_mla_metadata: num_heads_q: expected the number of query heads for the sparse decode (topk given), "
                "got None"
            )
        rows = num_q_tokens_per_head_k * num_heads_k
        if rows % num_heads_q != 0:
            raise ValueError(
                f"get_mla_metadata: num_q_tokens_per_head_k * num_heads_k = {rows}: expected a multiple of "
                f"num_heads_q = {num_heads_q} (s_q * h_q)"
            )
        workspace, plan = mla_sparse_decode_plan(b, rows // num_heads_q, num_heads_q, topk, cache_seqlens)
    else:
        workspace, plan = mla_decode_plan(cache_seqlens, 1, num_q_tokens_per_head_k * num_heads_k, num_heads_k)
    schedule = schedules.Schedule(workspace, plan, schedules.KeyLists(topk), from_metadata_args=True)
    tile_scheduler_metadata, num_splits = schedule.views()
    schedules.register(tile_scheduler_metadata, schedule)
    return tile_scheduler_metadata, num_splits


def flash_mla_with_kvcache(
    q: Any,
    k_cache: Any,
    block_table: Optional[Any],
    cache_seqlens: Optional[Any],
    head_dim_v: int,
    tile_scheduler_metadata: Any,
    num_splits: Optional[Any] = None,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    is_fp8_kvcache: bool = False,
    indices: Optional[Any] = None,
    attn_sink: Optional[Any] = None,
    extra_k_cache: Optional[Any] = None,
    extra_indices_in_kvcache: Optional[Any] = None,
    topk_length: Optional[Any] = None,
    extra_topk_length: Optional[Any] = None,
) -> Tuple[Any, Any]:
    """MLA decode over a paged KV cache, on the current stream.

    Dense: q [b, s_q, h_q, 576], k_cache [num_blocks, page_block_size, h_k, 576] (q's dtype,
    bfloat16 or float16), block_table [b, max_blocks] int32, cache_seqlens [b] int32, optional
    ``causal`` (MTP).

    Sparse (``is_fp8_kvcache=True`` with ``indices``): q bfloat16, k_cache an FP8 cache of one
    of two layouts, told apart by q's last dimension: DeepSeek V3.2, q d_qk 576 over the
    656-byte cache [num_blocks, page_block_size, 1, 656] (``mlakit.quantize_fp8_cache``);
    DeepSeek V4, q d_qk 512 over the 584-byte cache [num_blocks, page_block_size, 1, 584]
    (``mlakit.quantize_fp8_v4_cache``: stride[1] 584, padded block stride); uint8 or a float8
    view. indices [b, s_q, topk] int32 slots ``block * page_block_size + offset`` (-1: none),
    optional topk_length [b] int32 and attn_sink [h_q] float32; block_table and cache_seqlens
    are not used. A second cache, optional: ``extra_k_cache`` (same layout, its own page block
    size) with ``extra_indices_in_kvcache`` [b, s_q, extra_topk] (the two together) and
    optional ``extra_topk_length`` [b]: each row attends to both token lists under one
    softmax (the LSE covers both). The extra arguments exist only for sparse attention.

    ``head_dim_v`` must be 512; ``softmax_scale`` defaults to ``q.shape[-1] ** -0.5``.
    ``tile_scheduler_metadata`` / ``num_splits``: from :func:`get_mla_metadata`, either form; a
    ``FlashMLASchedMeta`` fixes the first call's configuration (shapes, topk, the second
    cache's page block size and extra_topk) for the calls after it.

    Returns ``(out [b, s_q, h_q, 512] in q's dtype, softmax_lse [b, h_q, s_q] float32)``.
    """
    op = "flash_mla_with_kvcache"
    if checks.integer(op, "head_dim_v", head_dim_v) != D_V:
        raise ValueError(f"{op}: head_dim_v: expected {D_V}, got {head_dim_v}")
    causal = checks.flag(op, "causal", causal)
    is_fp8_kvcache = checks.flag(op, "is_fp8_kvcache", is_fp8_kvcache)
    softmax_scale = checks.scale(op, "softmax_scale", softmax_scale)
    checks.array(op, "q", q, "[b, s_q, h_q, d_qk]")
    checks.array(op, "k_cache", k_cache, "[num_blocks, page_block_size, h_k, d_qk]")
    checks.optional_array(op, "indices", indices, "[b, s_q, topk]")
    sparse = indices is not None
    _check_cache_kind(is_fp8_kvcache, sparse)
    if sparse and causal:
        raise ValueError("flash_mla_with_kvcache: causal: expected False with indices (sparse attention), got True")
    if not sparse:
        sparse_only = (
            ("attn_sink", attn_sink),
            ("topk_length", topk_length),
            ("extra_k_cache", extra_k_cache),
            ("extra_indices_in_kvcache", extra_indices_in_kvcache),
            ("extra_topk_length", extra_topk_length),
        )
        given = [name for name, value in sparse_only if value is not None]
        if given:
            raise ValueError(f"{op}: {', '.join(given)}: expected None for dense attention (no indices)")
        checks.array(op, "block_table", block_table, "[b, max_num_blocks_per_seq]")
        checks.array(op, "cache_seqlens", cache_seqlens, "[b]")
    else:
        checks.optional_array(op, "topk_length", topk_length, "[b]")
        checks.optional_array(op, "attn_sink", attn_sink, "[h_q]")
        check_second_cache(op, extra_k_cache, extra_indices_in_kvcache, extra_topk_length, _EXTRA_NAMES)
    if softmax_scale is None:  # FlashMLA's default, of q's head dim
        softmax_scale = int(q.shape[-1]) ** -0.5

    if isinstance(tile_scheduler_metadata, FlashMLASchedMeta):
        if num_splits is not None:
            raise ValueError(f"{op}: num_splits: expected None with a FlashMLASchedMeta")
        _check_config(
            tile_scheduler_metadata,
            _config(q, k_cache, causal, is_fp8_kvcache, indices, extra_k_cache, extra_indices_in_kvcache),
        )
    if arrays.on_host(q):
        if sparse:
            return mla_sparse_decode(
                q, k_cache, indices, topk_length, attn_sink, softmax_scale,
                extra_kv_cache=extra_k_cache, extra_indices=extra_indices_in_kvcache,
                extra_topk_length=extra_topk_length,
            )
        return mla_decode(q, k_cache, block_table, cache_seqlens, softmax_scale, causal)

    with arrays.device_scope(q):
        lists = schedules.KeyLists.of_call(indices, topk_length, extra_indices_in_kvcache, extra_topk_length)
        schedule = _schedule(tile_scheduler_metadata, q, k_cache, cache_seqlens, lists, topk_length, extra_topk_length)
        plan = schedule.plan_for(q, lists)
        if arrays.traced(q):  # through torch.ops.mlakit (mlakit.torch_ops): one node of the compiled graph
            import torch

            from . import torch_ops  # noqa: F401  (registers the ops)

            if sparse:
                return torch.ops.mlakit.mla_sparse_decode(
                    q, k_cache, indices, topk_length, attn_sink, schedule.workspace, plan.fields(), softmax_scale,
                    extra_k_cache, extra_indices_in_kvcache, extra_topk_length,
                )
            return torch.ops.mlakit.mla_decode(
                q, k_cache, block_table, cache_seqlens, schedule.workspace, plan.fields(), softmax_scale, causal
            )
        b, s_q, h_q = int(q.shape[0]), int(q.shape[1]), int(q.shape[2])
        out = arrays.empty(q, (b, s_q, h_q, D_V))
        lse = arrays.empty(q, (b, h_q, s_q), "float32")
        stream = arrays.current_stream(q)
        x = arrays.to_extension
        if sparse:
            _sparse_decode_on_device(
                x(q), x(k_cache), x(indices), x(topk_length), x(attn_sink), x(out), x(lse), plan, softmax_scale,
                stream, x(extra_k_cache), x(extra_indices_in_kvcache), x(extra_topk_length),
            )
        else:
            _decode_on_device(x(q), x(k_cache), x(block_table), x(cache_seqlens), x(out), x(lse), plan, softmax_scale,
                              causal, stream)
    return out, lse


def flash_mla_sparse_fwd(
    q: Any,
    kv: Any,
    indices: Any,
    sm_scale: float,
    d_v: int = 512,
    attn_sink: Optional[Any] = None,
    topk_length: Optional[Any] = None,
    indexer_topk: int = 0,
    *,
    lse_base: str = "e",
) -> Tuple[Any, Any, Any]:
    """Sparse MLA prefill: q [s_q, h_q, d_qk] bfloat16, kv [s_kv, 1, d_qk] bfloat16, indices
    [s_q, 1, topk] int32 (< 0 or >= s_kv: invalid), optional attn_sink [h_q] float32 and
    topk_length [s_q] int32. Returns ``(output [s_q, h_q, d_v] bfloat16, max_logits [s_q, h_q]
    float32, lse [s_q, h_q] float32)``.

    ``max_logits`` and ``lse`` are natural-log, as the FlashMLA that engines run on Hopper
    returns them: max of q.k * sm_scale and log(sum exp(q.k * sm_scale)). ``lse_base="2"``
    (keyword only; not a FlashMLA argument) returns them in base 2 instead (multiplied by
    log2(e)), as FlashMLA's 2025 releases did. A row with no valid index: 0, -inf, +inf."""
    op = "flash_mla_sparse_fwd"
    if indexer_topk != 0:
        raise NotImplementedError(f"{op}: indexer_topk: only 0 is supported, got {indexer_topk}")
    if arrays.traced(q) and not arrays.on_host(q):  # through torch.ops.mlakit, as the decode
        sm_scale, d_v = check_prefill_arguments(op, q, kv, indices, sm_scale, d_v, attn_sink, topk_length, lse_base)
        import torch

        from . import torch_ops  # noqa: F401  (registers the ops)

        return torch.ops.mlakit.mla_sparse_prefill(q, kv, indices, sm_scale, d_v, attn_sink, topk_length, lse_base)
    return _prefill(op, q, kv, indices, sm_scale, d_v, attn_sink, topk_length, lse_base)


def flash_attn_varlen_func(
    q: Any,
    k: Any,
    v: Any,
    cu_seqlens_qo: Any,
    cu_seqlens_kv: Any,
    max_seqlen_qo: int,
    max_seqlen_kv: int,
    dropout_p: float = 0.0,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    deterministic: bool = False,
    is_varlen: bool = True,
) -> Tuple[Any, Any]:
    """Dense attention forward over variable-length sequences (mlakit.mha_prefill): q
    [total_q, h_q, d_qk], k [total_k, h_kv, d_qk], v [total_k, h_kv, d_v] (bfloat16 / float16,
    h_q a multiple of h_kv, (d_qk, d_v) in (64, 64), (128, 128), (192, 128), (256, 256); views
    with a contiguous last dimension are read in place); cu_seqlens_qo / cu_seqlens_kv [b + 1]
    int32 prefix sums; max_seqlen_qo / max_seqlen_kv at least every length. ``causal``:
    bottom-right aligned. ``softmax_scale`` defaults to 1/sqrt(d_qk).

    Returns ``(out [total_q, h_q, d_v] in q's dtype, lse [total_q, h_q] float32)``, natural
    log, ``lse`` the transposed view of an ``[h_q, total_q]`` buffer (as FlashMLA returns it;
    ``lse.T`` is contiguous). A query that sees no key: 0 and +inf.

    Differentiable: PyTorch tensors that require grad (grad mode on) and compiled calls run
    through ``torch.ops.mlakit.mha_prefill``, whose backward is mlakit.mha_prefill_backward
    (dq, dk, dv; ``lse`` takes no gradient: a nonzero one raises NotImplementedError in eager
    mode); other eager calls go straight to the extension. ``deterministic``: the backward's
    bitwise run-to-run reproducibility (the forward is deterministic either way).
    ``dropout_p`` must be 0 (no dropout: NotImplementedError otherwise); ``is_varlen=False``
    (FlashMLA's fixed-length 4-d layout, which its own Python wrapper cannot pass) raises
    NotImplementedError. Host arrays run the float64 CPU reference (forward and backward).
    """
    op = "flash_attn_varlen_func"
    return _varlen(op, q, k, v, cu_seqlens_qo, cu_seqlens_kv, max_seqlen_qo, max_seqlen_kv, dropout_p,
                   softmax_scale, causal, deterministic, is_varlen)


def flash_attn_varlen_qkvpacked_func(
    qkv: Any,
    cu_seqlens: Any,
    max_seqlen: int,
    head_dim_qk: int,
    dropout_p: float = 0.0,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    deterministic: bool = False,
    is_varlen: bool = True,
) -> Tuple[Any, Any]:
    """:func:`flash_attn_varlen_func` of ``qkv`` [total, h, 2 * head_dim_qk + d_v]: q its
    first ``head_dim_qk`` columns, k the next ``head_dim_qk``, v the rest (views, not copies;
    h_q = h_kv = h), with one ``cu_seqlens`` / ``max_seqlen`` for queries and keys. The
    gradients of the three views add up in ``qkv.grad``."""
    op = "flash_attn_varlen_qkvpacked_func"
    checks.array(op, "qkv", qkv, "[total, h, 2 * head_dim_qk + d_v]")
    d = checks.integer(op, "head_dim_qk", head_dim_qk, minimum=1)
    width = int(qkv.shape[2])
    if 2 * d >= width:
        raise ValueError(
            f"{op}: head_dim_qk: expected 2 * head_dim_qk < qkv.shape[2] = {width} (q, k, then v along the last "
            f"dimension), got {d}"
        )
    return _varlen(op, qkv[:, :, :d], qkv[:, :, d : 2 * d], qkv[:, :, 2 * d :], cu_seqlens, cu_seqlens, max_seqlen,
                   max_seqlen, dropout_p, softmax_scale, causal, deterministic, is_varlen)


def flash_attn_varlen_kvpacked_func(
    q: Any,
    kv: Any,
    cu_seqlens_qo: Any,
    cu_seqlens_kv: Any,
    max_seqlen_qo: int,
    max_seqlen_kv: int,
    head_dim_qk: int,
    dropout_p: float = 0.0,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    deterministic: bool = False,
    is_varlen: bool = True,
) -> Tuple[Any, Any]:
    """:func:`flash_attn_varlen_func` of q and ``kv`` [total_k, h_kv, head_dim_qk + d_v]: k its
    first ``head_dim_qk`` columns, v the rest (views, not copies); ``head_dim_qk`` must be q's
    last dimension. The gradients of k and v land in ``kv.grad``."""
    op = "flash_attn_varlen_kvpacked_func"
    checks.array(op, "q", q, "[total_q, h_q, d_qk]")
    checks.array(op, "kv", kv, "[total_k, h_kv, head_dim_qk + d_v]")
    d = checks.integer(op, "head_dim_qk", head_dim_qk, minimum=1)
    if d != int(q.shape[2]):
        raise ValueError(f"{op}: head_dim_qk: expected q.shape[2] = {int(q.shape[2])}, got {d}")
    width = int(kv.shape[2])
    if d >= width:
        raise ValueError(
            f"{op}: head_dim_qk: expected < kv.shape[2] = {width} (k, then v along the last dimension), got {d}"
        )
    return _varlen(op, q, kv[:, :, :d], kv[:, :, d:], cu_seqlens_qo, cu_seqlens_kv, max_seqlen_qo, max_seqlen_kv,
                   dropout_p, softmax_scale, causal, deterministic, is_varlen)


# The names of the sequence arguments (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
# in each function's signature, for its errors.
_VARLEN_NAMES = {
    "flash_attn_varlen_func": ("cu_seqlens_qo", "cu_seqlens_kv", "max_seqlen_qo", "max_seqlen_kv"),
    "flash_attn_varlen_qkvpacked_func": ("cu_seqlens", "cu_seqlens", "max_seqlen", "max_seqlen"),
    "flash_attn_varlen_kvpacked_func": ("cu_seqlens_qo", "cu_seqlens_kv", "max_seqlen_qo", "max_seqlen_kv"),
}


def _varlen(
    op: str,
    q: Any,
    k: Any,
    v: Any,
    cu_seqlens_qo: Any,
    cu_seqlens_kv: Any,
    max_seqlen_qo: Any,
    max_seqlen_kv: Any,
    dropout_p: Any,
    softmax_scale: Any,
    causal: Any,
    deterministic: Any,
    is_varlen: Any,
) -> Tuple[Any, Any]:
    """The three flash_attn_varlen functions once q, k and v are apart: FlashMLA's options,
    mlakit.mha_prefill's checks named after `op`, then the op (PyTorch) or the function."""
    dropout_p = checks.real(op, "dropout_p", dropout_p)
    if dropout_p != 0.0:
        raise NotImplementedError(f"{op}: dropout_p: mlakit's forward has no dropout: expected 0.0, got {dropout_p}")
    deterministic = checks.flag(op, "deterministic", deterministic)  # the backward's mode (the forward's is anyway)
    if not checks.flag(op, "is_varlen", is_varlen):
        raise NotImplementedError(
            f"{op}: is_varlen: expected True (False is FlashMLA's fixed-length [b, s, h, d] layout, not supported by "
            "mlakit: pass the batch as sequences of equal length through cu_seqlens)"
        )
    varlen = _mha_prefill.check_arguments(
        op, q, k, v, cu_seqlens_qo, cu_seqlens_kv, max_seqlen_qo, max_seqlen_kv, softmax_scale, causal,
        names=_VARLEN_NAMES[op],
    )
    out, lse = _mha_prefill.forward(q, k, v, varlen, "auto", deterministic)
    return out, lse.T  # FlashMLA's [total_q, h_q] view of the [h_q, total_q] buffer


def _check_cache_kind(is_fp8_kvcache: bool, sparse: bool) -> None:
    """mlakit has the dense bf16/fp16 decode and the sparse decode over the FP8 cache."""
    if is_fp8_kvcache and not sparse:
        raise NotImplementedError(
            "is_fp8_kvcache=True without indices / topk (dense decode over an FP8 cache): not supported by mlakit"
        )
    if sparse and not is_fp8_kvcache:
        raise NotImplementedError(
            "indices / topk with is_fp8_kvcache=False (sparse decode over a bf16 cache): not supported by mlakit; "
            "quantize the cache with mlakit.quantize_fp8_cache"
        )


def _config(
    q: Any,
    k_cache: Any,
    causal: bool,
    is_fp8_kvcache: bool,
    indices: Optional[Any],
    extra_k_cache: Optional[Any],
    extra_indices_in_kvcache: Optional[Any],
) -> FlashMLASchedMeta.Config:
    return FlashMLASchedMeta.Config(
        b=int(q.shape[0]),
        s_q=int(q.shape[1]),
        h_q=int(q.shape[2]),
        page_block_size=int(k_cache.shape[1]),
        h_k=int(k_cache.shape[2]),
        causal=causal,
        is_fp8_kvcache=is_fp8_kvcache,
        topk=None if indices is None else int(indices.shape[-1]),
        extra_page_block_size=None if extra_k_cache is None else int(extra_k_cache.shape[1]),
        extra_topk=None if extra_indices_in_kvcache is None else int(extra_indices_in_kvcache.shape[-1]),
    )


# Where each configuration field comes from in a flash_mla_with_kvcache call (for the errors).
_CONFIG_SOURCES = {
    "b": "q.shape[0]",
    "s_q": "q.shape[1]",
    "h_q": "q.shape[2]",
    "page_block_size": "k_cache.shape[1]",
    "h_k": "k_cache.shape[2]",
    "causal": "causal",
    "is_fp8_kvcache": "is_fp8_kvcache",
    "topk": "indices.shape[-1], None without indices",
    "extra_page_block_size": "extra_k_cache.shape[1], None without extra_k_cache",
    "extra_topk": "extra_indices_in_kvcache.shape[-1], None without extra_indices_in_kvcache",
}


def _check_config(meta: FlashMLASchedMeta, config: FlashMLASchedMeta.Config) -> None:
    """The first call fixes the step's configuration; later calls must agree (FlashMLA checks
    the same fields in the same order)."""
    if not meta.have_initialized:
        meta.config = config
        meta.have_initialized = True
        return
    if meta.config == config:  # every later call of the step: one comparison (dataclass __eq__)
        return
    for field in dataclasses.fields(config):
        made, given = getattr(meta.config, field.name), getattr(config, field.name)
        if made != given:
            raise ValueError(
                f"flash_mla_with_kvcache: tile_scheduler_metadata.config.{field.name}: expected {made} (the first "
                f"call's), got {given} ({_CONFIG_SOURCES[field.name]}): use one FlashMLASchedMeta per "
                "configuration and step"
            )


def _schedule(
    meta: Any,
    q: Any,
    k_cache: Any,
    cache_seqlens: Any,
    lists: schedules.KeyLists,
    topk_length: Optional[Any],
    extra_topk_length: Optional[Any],
) -> schedules.Schedule:
    """The plan behind `meta`: the object's (made by its first call), the registered one of
    get_mla_metadata's arrays, or, for arrays mlakit does not know, one made for this call."""
    if isinstance(meta, FlashMLASchedMeta):
        if meta._schedule is None:
            meta._schedule = schedules.schedule_for_call(q, k_cache, cache_seqlens, lists, topk_length,
                                                         extra_topk_length)
            meta.tile_scheduler_metadata, meta.num_splits = meta._schedule.views()
        return meta._schedule
    schedule = schedules.lookup(meta)
    if schedule is not None:
        return schedule
    warnings.warn(
        "mlakit.flash_mla: tile_scheduler_metadata is not an array returned by get_mla_metadata (a copy?): "
        "making a new plan for this call; pass the returned arrays, or use get_mla_metadata() objects, "
        "to plan once per step",
        stacklevel=3,
    )
    return schedules.schedule_for_call(q, k_cache, cache_seqlens, lists, topk_length, extra_topk_length)
