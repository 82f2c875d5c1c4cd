"""mlakit's operations as PyTorch custom ops, ``torch.ops.mlakit.*``: what ``torch.compile``
(``fullgraph=True``) and CUDA graphs take without a graph break.

Importing this module registers the ops (``import mlakit`` does it when PyTorch was imported
first; PyTorch stays optional: nothing here is imported without it). Each op calls the
package's own function, so arguments, checks, errors and results are those of ``mlakit.*``
(docs/python.md); each has a fake implementation that gives output shapes and dtypes without
running anything, and declares the tensors it writes.

A plan crosses an op as its workspace tensor and ``fields``, the plan as a list of integers
(``MlaDecodePlan.fields()`` / ``GqaDecodePlan.fields()``): the plan functions below return
``(workspace, fields)``. Make a plan once (outside the compiled or captured region: it
allocates the workspace), then per step re-run the schedule into the same workspace with the
``*_schedule`` op, inside the graph, for the step's new lengths; the fields depend on the
shapes only.

Ops (arguments as in the ``mlakit`` function of the same name):

- ``mla_decode(q, kv_cache, block_table, cache_seqlens, workspace, fields, softmax_scale,
  causal) -> (out, lse)``; ``mla_decode_schedule(cache_seqlens, workspace!, fields)``
- ``mla_sparse_decode(q, kv_cache, indices, topk_length, attn_sink, workspace, fields,
  softmax_scale, extra_kv_cache=None, extra_indices=None, extra_topk_length=None) -> (out,
  lse)`` (V3.2 or V4 tokens, optionally a second cache); ``mla_sparse_decode_schedule(
  topk_length, workspace!, fields, s_q, extra_topk_length=None)``
- ``mla_sparse_prefill(q, kv, indices, sm_scale, d_v, attn_sink, topk_length, lse_base) ->
  (out, max_logits, lse)``
- ``mha_prefill(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
  causal, kernel_name="auto", deterministic=False) -> (out, lse)`` (``lse`` [h_q, total_q];
  ``kernel_name``: the function's ``kernel``), differentiable in q, k and v: its backward is
  ``mha_prefill_backward`` (``deterministic`` is passed there; a nonzero gradient of ``lse``
  raises NotImplementedError in eager mode). ``mha_prefill_backward(dout, q, k, v, out, lse,
  cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
  deterministic=False, kernel_name="auto") -> (dq, dk, dv)``. ``flash_attn_varlen_func`` and
  its packed forms run through ``mha_prefill`` when compiled or when a tensor requires grad
- ``gqa_decode(q, k_cache, v_cache, block_table, cache_seqlens, workspace, fields, ...) ->
  (out, lse)``; ``gqa_decode_append(..., k_new, v_new, ...)``, the same with this step's keys
  and values written into ``k_cache!``, ``v_cache!`` (and per-token scales!) first;
  ``gqa_decode_schedule(cache_seqlens, workspace!, fields)``
- ``merge_states(o, lse, lse_base, out_lse_base) -> (out, out_lse)``: ``o`` and ``lse`` lists of
  tensors, out of place (``out`` in o's dtype; an op's outputs cannot alias its inputs: the
  in-place merge is ``mlakit.merge_states``'s); ``merge_states_out(o, lse, out!, out_lse!,
  lse_base, out_lse_base)`` into the caller's buffers (an engine's preallocated, graph-captured
  ones; disjoint from the inputs)
- ``quantize_fp8_cache``, ``dequantize_fp8_cache``, ``append_fp8_cache(tokens, slots,
  cache!)``; the DeepSeek V4 cache's ``quantize_fp8_v4_cache`` (the padded-block view),
  ``dequantize_fp8_v4_cache``, ``append_fp8_v4_cache(tokens, slots, cache!)``; ``quantize_gqa_cache``, ``dequantize_gqa_cache``, ``gqa_cache_append(...,
  k_cache!, v_cache!, ...)``

``!``: written in place. The decodes also write the partial results of split sequences into
the workspace (declared: layers sharing a plan stay in order). ``lse`` is always returned.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch
from torch import Tensor

from . import _decode, _fp8_cache, _gqa_cache, _gqa_decode, _merge, _mha_prefill, _sparse_decode, _sparse_prefill
from . import _mlakit as _C

__all__ = ["mla_decode_plan", "mla_sparse_decode_plan", "gqa_decode_plan"]

_NS = "mlakit"
_FP8_TOKEN_BYTES = 656
_MLA_D_QK = 576


# ---- plans as (workspace, fields) ----------------------------------------------------------


def mla_decode_plan(
    cache_seqlens: Tensor, s_q: int, h_q: int, h_kv: int = 1, kernel: str = "auto"
) -> Tuple[Tensor, List[int]]:
    """:func:`mlakit.mla_decode_plan` as ``(workspace, fields)`` for the ops."""
    workspace, plan = _decode.mla_decode_plan(cache_seqlens, s_q, h_q, h_kv, kernel)
    return workspace, list(plan.fields())


def mla_sparse_decode_plan(
    b: int,
    s_q: int,
    h_q: int,
    topk: int,
    like: Tensor,
    topk_length: Optional[Tensor] = None,
    extra_topk: int = 0,
    extra_topk_length: Optional[Tensor] = None,
) -> Tuple[Tensor, List[int]]:
    """:func:`mlakit.mla_sparse_decode_plan` as ``(workspace, fields)`` for the ops."""
    workspace, plan = _sparse_decode.mla_sparse_decode_plan(
        b, s_q, h_q, topk, like, topk_length, extra_topk, extra_topk_length
    )
    return workspace, list(plan.fields())


def gqa_decode_plan(
    cache_seqlens: Tensor, s_q: int, h_q: int, h_kv: int, d: int, causal: bool = False, window: int = 0
) -> Tuple[Tensor, List[int]]:
    """:func:`mlakit.gqa_decode_plan` as ``(workspace, fields)`` for the ops."""
    workspace, plan = _gqa_decode.gqa_decode_plan(cache_seqlens, s_q, h_q, h_kv, d, causal, window)
    return workspace, list(plan.fields())


def _mla_plan(workspace: Tensor, fields: List[int]) -> Tuple[Tensor, _C.MlaDecodePlan]:
    return workspace, _C.MlaDecodePlan.from_fields(fields, workspace)


def _stream(like: Tensor) -> int:
    return torch.cuda.current_stream(like.device).cuda_stream


# ---- dense MLA decode ----------------------------------------------------------------------


@torch.library.custom_op(f"{_NS}::mla_decode", mutates_args=("workspace",))
def _mla_decode(
    q: Tensor,
    kv_cache: Tensor,
    block_table: Tensor,
    cache_seqlens: Tensor,
    workspace: Tensor,
    fields: List[int],
    softmax_scale: Optional[float],
    causal: bool,
) -> Tuple[Tensor, Tensor]:
    return _decode.mla_decode(
        q, kv_cache, block_table, cache_seqlens, softmax_scale, causal, plan=_mla_plan(workspace, fields)
    )


@_mla_decode.register_fake
def _(q, kv_cache, block_table, cache_seqlens, workspace, fields, softmax_scale, causal):
    b, s_q, h_q = q.shape[0], q.shape[1], q.shape[2]
    return q.new_empty((b, s_q, h_q, _decode.D_V)), q.new_empty((b, h_q, s_q), dtype=torch.float32)


@torch.library.custom_op(f"{_NS}::mla_decode_schedule", mutates_args=("workspace",))
def _mla_decode_schedule(cache_seqlens: Tensor, workspace: Tensor, fields: List[int]) -> None:
    plan = _C.MlaDecodePlan.from_fields(fields, workspace)
    if plan.device < 0:
        return  # a host plan has no schedule
    with torch.cuda.device(cache_seqlens.device):
        _C.mla_decode_plan(
            plan.b, plan.s_q, plan.h_q, plan.h_kv, cache_seqlens, workspace, _stream(cache_seqlens), plan.kernel
        )


@_mla_decode_schedule.register_fake
def _(cache_seqlens, workspace, fields):
    return None


# ---- sparse MLA decode ---------------------------------------------------------------------


@torch.library.custom_op(f"{_NS}::mla_sparse_decode", mutates_args=("workspace",))
def _mla_sparse_decode(
    q: Tensor,
    kv_cache: Tensor,
    indices: Tensor,
    topk_length: Optional[Tensor],
    attn_sink: Optional[Tensor],
    workspace: Tensor,
    fields: List[int],
    softmax_scale: Optional[float],
    extra_kv_cache: Optional[Tensor] = None,
    extra_indices: Optional[Tensor] = None,
    extra_topk_length: Optional[Tensor] = None,
) -> Tuple[Tensor, Tensor]:
    return _sparse_decode.mla_sparse_decode(
        q, kv_cache, indices, topk_length, attn_sink, softmax_scale, plan=_mla_plan(workspace, fields),
        extra_kv_cache=extra_kv_cache, extra_indices=extra_indices, extra_topk_length=extra_topk_length,
    )


@_mla_sparse_decode.register_fake
def _(q, kv_cache, indices, topk_length, attn_sink, workspace, fields, softmax_scale, extra_kv_cache=None,
      extra_indices=None, extra_topk_length=None):
    b, s_q, h_q = q.shape[0], q.shape[1], q.shape[2]
    return q.new_empty((b, s_q, h_q, _decode.D_V)), q.new_empty((b, h_q, s_q), dtype=torch.float32)


@torch.library.custom_op(f"{_NS}::mla_sparse_decode_schedule", mutates_args=("workspace",))
def _mla_sparse_decode_schedule(
    topk_length: Optional[Tensor],
    workspace: Tensor,
    fields: List[int],
    s_q: int,
    extra_topk_length: Optional[Tensor] = None,
) -> None:
    """``s_q``: the query tokens per batch entry the plan was made for (its problem has one
    sequence per entry and token, so the fields alone do not say). ``topk_length`` and
    ``extra_topk_length``: given exactly when they were given to the plan (its layout
    depends on it)."""
    op = "mla_sparse_decode_schedule"
    plan = _C.MlaDecodePlan.from_fields(fields, workspace)
    lists = _sparse_decode.plan_lists(plan)
    for name, given in (("topk_length", topk_length), ("extra_topk_length", extra_topk_length)):
        if lists[name] != (given is not None):
            raise ValueError(f"{op}: {name}: expected {'a tensor' if lists[name] else 'None'} (as given to the "
                             f"plan), got {'None' if given is None else 'a tensor'}")
    if plan.device < 0:
        return  # a host plan has no schedule
    if s_q < 1 or plan.b % s_q != 0:
        raise ValueError(f"{op}: s_q: expected a divisor of the plan's {plan.b} scheduled sequences (b * s_q), "
                         f"got {s_q}")
    with torch.cuda.device(workspace.device):
        _C.mla_sparse_decode_plan(plan.b // s_q, s_q, plan.h_q, lists["topk"], topk_length, workspace,
                                  _stream(workspace), lists["extra_topk"], extra_topk_length)


@_mla_sparse_decode_schedule.register_fake
def _(topk_length, workspace, fields, s_q, extra_topk_length=None):
    return None


# ---- sparse MLA prefill --------------------------------------------------------------------


@torch.library.custom_op(f"{_NS}::mla_sparse_prefill", mutates_args=())
def _mla_sparse_prefill(
    q: Tensor,
    kv: Tensor,
    indices: Tensor,
    sm_scale: Optional[float],
    d_v: int,
    attn_sink: Optional[Tensor],
    topk_length: Optional[Tensor],
    lse_base: str,
) -> Tuple[Tensor, Tensor, Tensor]:
    return _sparse_prefill.mla_sparse_prefill(q, kv, indices, sm_scale, d_v, attn_sink, topk_length, lse_base)


@_mla_sparse_prefill.register_fake
def _(q, kv, indices, sm_scale, d_v, attn_sink, topk_length, lse_base):
    s_q, h_q = q.shape[0], q.shape[1]
    stats = q.new_empty((s_q, h_q), dtype=torch.float32)
    return q.new_empty((s_q, h_q, d_v)), stats, torch.empty_like(stats)


# ---- dense MHA prefill ---------------------------------------------------------------------


# The schemas are written out (those the annotations would give, int as SymInt) so that the
# arguments both ops take after their arrays stand once. ``kernel_name``: mlakit.mha_prefill's ``kernel``, 'auto',
# 'portable' or 'sm90' (CUDA tensors; CPU tensors run the reference). Not called ``kernel``:
# Inductor's fallback for custom ops takes a keyword of that name.
_VARLEN_SCHEMA = (
    "Tensor cu_seqlens_q, Tensor cu_seqlens_k, SymInt max_seqlen_q, SymInt max_seqlen_k, float? softmax_scale, "
    "bool causal"
)


@torch.library.custom_op(
    f"{_NS}::mha_prefill",
    mutates_args=(),
    schema=f'(Tensor q, Tensor k, Tensor v, {_VARLEN_SCHEMA}, str kernel_name="auto", bool deterministic=False) '
    "-> (Tensor, Tensor)",
)
def _mha_prefill_op(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
                    kernel_name="auto", deterministic=False):
    """Strided q / k / v (views of packed tensors) are passed as they are. ``deterministic``:
    not read by the forward (deterministic anyway), passed to the backward."""
    varlen = _mha_prefill.check_arguments(
        "mha_prefill", q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
        kernel_name,
    )
    return _mha_prefill.run(q, k, v, varlen, kernel_name)


@_mha_prefill_op.register_fake
def _(q, k, v, *_):
    total_q, h_q = q.shape[0], q.shape[1]
    return q.new_empty((total_q, h_q, v.shape[2])), q.new_empty((h_q, total_q), dtype=torch.float32)


@torch.library.custom_op(
    f"{_NS}::mha_prefill_backward",
    mutates_args=(),
    schema=f"(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, {_VARLEN_SCHEMA}, "
    'bool deterministic=False, str kernel_name="auto") -> (Tensor, Tensor, Tensor)',
)
def _mha_prefill_backward_op(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                             softmax_scale, causal, deterministic=False, kernel_name="auto"):
    """mlakit.mha_prefill_backward -> (dq, dk, dv)."""
    return _mha_prefill.mha_prefill_backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                             max_seqlen_k, softmax_scale, causal, deterministic, kernel_name)


@_mha_prefill_backward_op.register_fake
def _(dout, q, k, v, *_):
    return q.new_empty(q.shape), q.new_empty(k.shape), q.new_empty(v.shape)


def _mha_prefill_setup_context(ctx, inputs, output):
    q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal, kernel, deterministic = (
        inputs
    )
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k)
    # The forward's kernel choice does not carry over (the Hopper backward serves fewer head
    # dims than the Hopper forward): 'portable' asks for the portable backward, anything else
    # for the backward's 'auto' (the Hopper kernel where it serves the problem).
    backward_kernel = "portable" if kernel == "portable" else "auto"
    ctx.options = (max_seqlen_q, max_seqlen_k, softmax_scale, causal, deterministic, backward_kernel)
    ctx.set_materialize_grads(False)  # an unused out or lse arrives as None: no zeros made, nothing to check


def _mha_prefill_backward(ctx, dout, dlse):
    _check_no_lse_gradient(dlse)
    if dout is None:  # the loss does not depend on out
        return (None,) * 11
    q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k = ctx.saved_tensors
    if dout.stride(-1) != 1:  # e.g. the expanded gradient of out.sum(): the kernels read rows
        dout = dout.contiguous()
    dq, dk, dv = _mha_prefill_backward_op(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, *ctx.options)
    return (dq, dk, dv) + (None,) * 8


def _check_no_lse_gradient(dlse: Optional[Tensor]) -> None:
    """The backward takes no gradient of lse (the kernels' D = rowsum(dout * out) has no term
    for it): a nonzero one is an error, in eager mode. Compiled code and CUDA-graph capture
    cannot read the values without a synchronisation (a traced one has none): there a
    gradient reaching lse is ignored."""
    if dlse is None or torch.compiler.is_compiling() or _is_traced(dlse):
        return
    if dlse.is_cuda and torch.cuda.is_current_stream_capturing():
        return
    if bool((dlse != 0).any()):
        raise NotImplementedError(
            "mha_prefill: lse: the backward takes no gradient of lse (it is a statistic for merging states, not "
            "differentiable here), got a nonzero one: keep lse out of the loss, or detach it"
        )


def _is_traced(x: Tensor) -> bool:
    """Whether `x` holds no data to read: a fake or functional tensor of AOTAutograd's tracing."""
    from torch._subclasses.fake_tensor import is_fake

    return is_fake(x) or torch._is_functional_tensor(x)


_mha_prefill_op.register_autograd(_mha_prefill_backward, setup_context=_mha_prefill_setup_context)


# ---- merging partial states ----------------------------------------------------------------


@torch.library.custom_op(f"{_NS}::merge_states", mutates_args=())
def _merge_states(o: List[Tensor], lse: List[Tensor], lse_base: str, out_lse_base: str) -> Tuple[Tensor, Tensor]:
    """mlakit.merge_states into new ``out`` (o's dtype) and ``out_lse``; ``lse_base`` and
    ``out_lse_base`` 'e' or '2'."""
    return _merge.merge_states(o, lse, lse_base=lse_base, out_lse_base=out_lse_base)


@_merge_states.register_fake
def _(o, lse, lse_base, out_lse_base):
    first = o[0]
    return first.new_empty(first.shape), first.new_empty(first.shape[:-1], dtype=torch.float32)


@torch.library.custom_op(f"{_NS}::merge_states_out", mutates_args=("out", "out_lse"))
def _merge_states_out(
    o: List[Tensor], lse: List[Tensor], out: Tensor, out_lse: Tensor, lse_base: str, out_lse_base: str
) -> None:
    """mlakit.merge_states into the given ``out`` (any of its dtypes) and ``out_lse``."""
    _merge.merge_states(o, lse, out, out_lse, lse_base=lse_base, out_lse_base=out_lse_base)


@_merge_states_out.register_fake
def _(o, lse, out, out_lse, lse_base, out_lse_base):
    return None


# ---- GQA decode ----------------------------------------------------------------------------
# Two ops of one schema: gqa_decode reads the caches, gqa_decode_append (k_new, v_new after
# the scales) writes this step's keys and values into them first. Two, so that a decode
# without an append does not declare a write to the whole cache.

_GQA_SCHEMA = (
    "(Tensor q, Tensor{w} k_cache, Tensor{w} v_cache, Tensor block_table, Tensor cache_seqlens, Tensor(a!) workspace, "
    "int[] fields, Tensor{w}? k_scale, Tensor{w}? v_scale, {new}str rope_style, float rope_theta, int rotary_dim, "
    "Tensor? alibi_slopes, Tensor? finished, float? softmax_scale, bool causal, int window, float softcap) "
    "-> (Tensor, Tensor)"
)
_library = torch.library.Library(_NS, "FRAGMENT")
_library.define("gqa_decode" + _GQA_SCHEMA.replace("{w}", "").replace("{new}", ""))
# Every written argument gets its own alias set: (b!), (c!), ...
_append_schema = _GQA_SCHEMA.replace("{new}", "Tensor k_new, Tensor v_new, ")
for _letter in "bcde":
    _append_schema = _append_schema.replace("{w}", f"({_letter}!)", 1)
_library.define("gqa_decode_append" + _append_schema)


def _gqa_run(q, k_cache, v_cache, block_table, cache_seqlens, workspace, fields, k_scale, v_scale, k_new, v_new,
             rope_style, rope_theta, rotary_dim, alibi_slopes, finished, softmax_scale, causal, window, softcap):
    """``rope_style`` '' for none."""
    return _gqa_decode.gqa_decode(
        q, k_cache, v_cache, block_table, cache_seqlens, k_scale=k_scale, v_scale=v_scale, k_new=k_new, v_new=v_new,
        rope_style=rope_style or None, rope_theta=rope_theta, rotary_dim=rotary_dim, alibi_slopes=alibi_slopes,
        finished=finished, softmax_scale=softmax_scale, causal=causal, window=window, softcap=softcap,
        return_lse=True, plan=(workspace, _C.GqaDecodePlan.from_fields(fields, workspace)),
    )


@torch.library.impl(f"{_NS}::gqa_decode", ("CPU", "CUDA"), lib=_library)
def _gqa_decode_op(q, k_cache, v_cache, block_table, cache_seqlens, workspace, fields, k_scale, v_scale, *options):
    return _gqa_run(q, k_cache, v_cache, block_table, cache_seqlens, workspace, fields, k_scale, v_scale, None, None,
                    *options)


torch.library.impl(f"{_NS}::gqa_decode_append", ("CPU", "CUDA"), lib=_library)(_gqa_run)


def _gqa_fake(q, *_):
    b, s_q, h_q, d = q.shape
    return q.new_empty((b, s_q, h_q, d)), q.new_empty((b, h_q, s_q), dtype=torch.float32)


torch.library.register_fake(f"{_NS}::gqa_decode", _gqa_fake, lib=_library)
torch.library.register_fake(f"{_NS}::gqa_decode_append", _gqa_fake, lib=_library)


@torch.library.custom_op(f"{_NS}::gqa_decode_schedule", mutates_args=("workspace",))
def _gqa_decode_schedule(cache_seqlens: Tensor, workspace: Tensor, fields: List[int]) -> None:
    plan = _C.GqaDecodePlan.from_fields(fields, workspace)
    if plan.device < 0:
        return
    with torch.cuda.device(cache_seqlens.device):
        _C.gqa_decode_plan(plan.b, plan.s_q, plan.h_q, plan.h_kv, plan.d, plan.causal, plan.window, cache_seqlens,
                           workspace, _stream(cache_seqlens))


@_gqa_decode_schedule.register_fake
def _(cache_seqlens, workspace, fields):
    return None


# ---- cache tools ---------------------------------------------------------------------------


@torch.library.custom_op(f"{_NS}::quantize_fp8_cache", mutates_args=())
def _quantize_fp8_cache(kv: Tensor) -> Tensor:
    return _fp8_cache.quantize_fp8_cache(kv)


@_quantize_fp8_cache.register_fake
def _(kv):
    return kv.new_empty(tuple(kv.shape[:-1]) + (_FP8_TOKEN_BYTES,), dtype=torch.uint8)


@torch.library.custom_op(f"{_NS}::dequantize_fp8_cache", mutates_args=())
def _dequantize_fp8_cache(cache: Tensor) -> Tensor:
    return _fp8_cache.dequantize_fp8_cache(cache)


@_dequantize_fp8_cache.register_fake
def _(cache):
    return cache.new_empty(tuple(cache.shape[:-1]) + (_MLA_D_QK,), dtype=torch.bfloat16)


@torch.library.custom_op(f"{_NS}::append_fp8_cache", mutates_args=("cache",))
def _append_fp8_cache(tokens: Tensor, slots: Tensor, cache: Tensor) -> None:
    _fp8_cache.append_fp8_cache(tokens, slots, cache)


@_append_fp8_cache.register_fake
def _(tokens, slots, cache):
    return None


@torch.library.custom_op(f"{_NS}::quantize_fp8_v4_cache", mutates_args=())
def _quantize_fp8_v4_cache(kv: Tensor) -> Tensor:
    return _fp8_cache.quantize_fp8_v4_cache(kv)


@_quantize_fp8_v4_cache.register_fake
def _(kv):
    # The padded-block view quantize_fp8_v4_cache returns: [num_blocks, page_size, 1, 584] with
    # blocks v4_block_stride(page_size) bytes apart.
    num_blocks, page_size = kv.shape[0], kv.shape[1]
    stride = _fp8_cache.v4_block_stride(page_size)
    token = _fp8_cache.V4_TOKEN_BYTES
    buffer = kv.new_empty((num_blocks, stride), dtype=torch.uint8)
    return buffer.as_strided((num_blocks, page_size, 1, token), (stride, token, token, 1))


@torch.library.custom_op(f"{_NS}::dequantize_fp8_v4_cache", mutates_args=())
def _dequantize_fp8_v4_cache(cache: Tensor) -> Tensor:
    return _fp8_cache.dequantize_fp8_v4_cache(cache)


@_dequantize_fp8_v4_cache.register_fake
def _(cache):
    return cache.new_empty(tuple(cache.shape[:-1]) + (_fp8_cache.V4_D_QK,), dtype=torch.bfloat16)


@torch.library.custom_op(f"{_NS}::append_fp8_v4_cache", mutates_args=("cache",))
def _append_fp8_v4_cache(tokens: Tensor, slots: Tensor, cache: Tensor) -> None:
    _fp8_cache.append_fp8_v4_cache(tokens, slots, cache)


@_append_fp8_v4_cache.register_fake
def _(tokens, slots, cache):
    return None


_GQA_CACHE_DTYPES = {"int8": torch.int8, "fp8": torch.float8_e4m3fn, "float8_e4m3fn": torch.float8_e4m3fn}


@torch.library.custom_op(f"{_NS}::quantize_gqa_cache", mutates_args=())
def _quantize_gqa_cache(src: Tensor, dtype: str, scale: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
    values, out_scale = _gqa_cache.quantize_gqa_cache(src, dtype, scale)
    return values, out_scale.clone() if scale is not None and out_scale is scale else out_scale


@_quantize_gqa_cache.register_fake
def _(src, dtype, scale):
    values = src.new_empty(src.shape, dtype=_GQA_CACHE_DTYPES.get(dtype, torch.int8))
    scale_shape = (1,) if scale is not None else tuple(src.shape[:-1])
    return values, src.new_empty(scale_shape, dtype=torch.float32)


@torch.library.custom_op(f"{_NS}::dequantize_gqa_cache", mutates_args=())
def _dequantize_gqa_cache(values: Tensor, scale: Tensor, dtype: str) -> Tensor:
    return _gqa_cache.dequantize_gqa_cache(values, scale, dtype)


@_dequantize_gqa_cache.register_fake
def _(values, scale, dtype):
    return values.new_empty(values.shape, dtype=getattr(torch, dtype))


@torch.library.custom_op(f"{_NS}::gqa_cache_append", mutates_args=("k_cache", "v_cache", "k_scale", "v_scale"))
def _gqa_cache_append(
    k_new: Tensor,
    v_new: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    block_table: Tensor,
    cache_seqlens: Tensor,
    k_scale: Optional[Tensor],
    v_scale: Optional[Tensor],
    rope_style: str,
    rope_theta: float,
    rotary_dim: int,
    finished: Optional[Tensor],
) -> None:
    _gqa_cache.gqa_cache_append(
        k_new, v_new, k_cache, v_cache, block_table, cache_seqlens, k_scale=k_scale, v_scale=v_scale,
        rope_style=rope_style or None, rope_theta=rope_theta, rotary_dim=rotary_dim, finished=finished,
    )


@_gqa_cache_append.register_fake
def _(k_new, v_new, k_cache, v_cache, block_table, cache_seqlens, k_scale, v_scale, rope_style, rope_theta, rotary_dim,
      finished):
    return None
