"""mlakit: multi-head latent attention (MLA) kernels for LLM serving, over DLPack arrays.

Arrays may come from NumPy, PyTorch, CuPy or JAX. Host arrays run the float64 CPU
reference; device arrays run the GPU kernels on the caller's current stream (for PyTorch,
``torch.cuda.current_stream()``). Outputs and workspaces are allocated by the framework the
inputs come from. Invalid arguments raise ``ValueError`` with the library's message, which
names the argument, the expected and the actual value.
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

from . import _mlakit as _C

__all__ = ["mla_decode", "mla_decode_plan", "MlaDecodePlan"]

MlaDecodePlan = _C.MlaDecodePlan
_D_V = 512


def _framework(x: Any) -> str:
    module = type(x).__module__.split(".")[0]
    return module if module in ("numpy", "torch", "cupy") else "other"


def _on_host(x: Any) -> bool:
    kind = _framework(x)
    if kind == "numpy":
        return True
    if kind == "torch":
        return x.device.type == "cpu"
    return False


def _empty(like: Any, shape: Tuple[int, ...], float32: bool) -> Any:
    """An uninitialised array of `shape` from `like`'s framework and device: float32, or
    `like`'s dtype."""
    kind = _framework(like)
    if kind == "numpy":
        import numpy as np

        return np.empty(shape, dtype=np.float32 if float32 else like.dtype)
    if kind == "torch":
        import torch

        return torch.empty(shape, dtype=torch.float32 if float32 else like.dtype, device=like.device)
    if kind == "cupy":
        import cupy

        return cupy.empty(shape, dtype=cupy.float32 if float32 else like.dtype)
    raise TypeError(f"mlakit: cannot allocate outputs for arrays of type {type(like).__name__}")


def _empty_bytes(like: Any, nbytes: int) -> Any:
    kind = _framework(like)
    if kind == "torch":
        import torch

        return torch.empty(nbytes, dtype=torch.uint8, device=like.device)
    if kind == "cupy":
        import cupy

        return cupy.empty(nbytes, dtype=cupy.uint8)
    raise TypeError(f"mlakit: cannot allocate a device workspace for {type(like).__name__}")


def _current_stream(like: Any) -> int:
    kind = _framework(like)
    if kind == "torch":
        import torch

        return torch.cuda.current_stream(like.device).cuda_stream
    if kind == "cupy":
        import cupy

        return cupy.cuda.get_current_stream().ptr
    return 0


def mla_decode_plan(cache_seqlens: Any, s_q: int, h_q: int, h_kv: int = 1, kernel: str = "auto") -> Tuple[Any, MlaDecodePlan]:
    """Split-KV schedule of one decoding step, computed on the device from ``cache_seqlens``
    ([b] int32, device). Returns ``(workspace, plan)``: keep both and pass them to every
    layer's :func:`mla_decode` of the step."""
    b = int(cache_seqlens.shape[0])
    workspace = _empty_bytes(cache_seqlens, _C.mla_decode_workspace_size(b, s_q, h_q, h_kv, kernel))
    plan = _C.mla_decode_plan(b, s_q, h_q, h_kv, cache_seqlens, workspace, _current_stream(cache_seqlens), kernel)
    return workspace, plan


def mla_decode(
    q: Any,
    kv_cache: Any,
    block_table: Any,
    cache_seqlens: Any,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    plan: Optional[Tuple[Any, MlaDecodePlan]] = None,
) -> Tuple[Any, Any]:
    """Dense MLA decode over a paged cache (SPEC section 1).

    q: [b, s_q, h_q, 576]; kv_cache: [num_blocks, page_size, h_kv, 576] (same dtype, bf16 or
    fp16); block_table: [b, max_blocks] int32; cache_seqlens: [b] int32. ``softmax_scale``
    defaults to 1/sqrt(576); ``causal`` masks the s_q new tokens (MTP). ``plan`` is the
    ``(workspace, plan)`` of :func:`mla_decode_plan` for device arrays (made here when None).

    Returns ``(out [b, s_q, h_q, 512] in q's dtype, lse [b, h_q, s_q] float32)``; rows that
    see no key give 0 and +inf.
    """
    b, s_q, h_q = int(q.shape[0]), int(q.shape[1]), int(q.shape[2])
    out = _empty(q, (b, s_q, h_q, _D_V), float32=False)
    lse = _empty(q, (b, h_q, s_q), float32=True)
    if _on_host(q):
        _C.mla_decode_reference(q, kv_cache, block_table, cache_seqlens, out, lse, softmax_scale, causal)
        return out, lse
    if plan is None:
        plan = mla_decode_plan(cache_seqlens, s_q, h_q, int(kv_cache.shape[2]))
    _, step_plan = plan
    _C.mla_decode(q, kv_cache, block_table, cache_seqlens, out, lse, step_plan, softmax_scale, causal,
                  _current_stream(q))
    return out, lse
