"""Dense MHA prefill forward over variable-length sequences (include/mlakit/mha_prefill.h):
the float64 CPU reference on host arrays, the GPU kernels on device arrays."""

from __future__ import annotations

from typing import Any, Optional, Tuple

from . import _arrays as arrays
from . import _checks as checks
from . import _mlakit as _C

KERNELS = ("auto", "portable", "sm90")


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
    kernel: str = "auto",
) -> Tuple[Any, Any]:
    """Attention of each sequence's queries over its keys: q [total_q, h_q, d_qk], k
    [total_k, h_kv, d_qk], v [total_k, h_kv, d_v] (bfloat16 / float16, h_q a multiple of
    h_kv; (d_qk, d_v) in (64, 64), (128, 128), (192, 128), (256, 256); strided views are
    taken as they are, the last dimension contiguous); cu_seqlens_q / cu_seqlens_k [b + 1]
    int32 prefix sums starting at 0 (lengths may be 0); max_seqlen_q / max_seqlen_k at least
    every length. ``causal``: bottom-right aligned (query t of a sequence of lengths (Lq, Lk)
    sees keys j <= t + Lk - Lq). ``softmax_scale`` defaults to 1/sqrt(d_qk). ``kernel``
    (device arrays): 'auto' (the Hopper kernel on compute capability 9.0 where the layout
    allows it, else the portable one), 'portable' or 'sm90' (an error where it cannot run);
    host arrays ignore it.

    Returns ``(out [total_q, h_q, d_v] in q's dtype, lse [h_q, total_q] float32)``, natural
    log; a query that sees no key gives 0 and +inf; rows in no sequence (past
    cu_seqlens_q[-1]) are 0 on the host and not written on the device (as FlashMLA's: no
    extra memset per call).
    Host arrays run the float64 CPU reference (which also checks the prefix sums' values);
    device arrays the GPU kernels on the current stream (asynchronous, nothing read back:
    capturable in a CUDA graph; the prefix sums must then be valid, docs/contract.md).
    """
    op = "mha_prefill"
    max_seqlen_q, max_seqlen_k, softmax_scale, causal = check_arguments(
        op, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal, kernel
    )
    return run(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal, kernel)


def check_arguments(
    op: str,
    q: Any,
    k: Any,
    v: Any,
    cu_seqlens_q: Any,
    cu_seqlens_k: Any,
    max_seqlen_q: Any,
    max_seqlen_k: Any,
    softmax_scale: Any,
    causal: Any,
    kernel: Any = "auto",
    names: Tuple[str, str, str, str] = ("cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k"),
) -> Tuple[int, int, Optional[float], bool]:
    """The argument checks of mha_prefill (what the output allocation and the extension's
    conversion rely on, and that every array is where q is), named after `op` and, for the
    sequence arguments, `names` (the caller's parameter names); returns (max_seqlen_q,
    max_seqlen_k, softmax_scale, causal). Everything else is the library's to check."""
    cu_q_name, cu_k_name, max_q_name, max_k_name = names
    checks.array(op, "q", q, "[total_q, h_q, d_qk]")
    checks.array(op, "k", k, "[total_k, h_kv, d_qk]")
    checks.array(op, "v", v, "[total_k, h_kv, d_v]")
    checks.array(op, cu_q_name, cu_seqlens_q, "[b + 1]")
    checks.array(op, cu_k_name, cu_seqlens_k, "[b + 1]")
    max_seqlen_q = checks.integer(op, max_q_name, max_seqlen_q)
    max_seqlen_k = checks.integer(op, max_k_name, max_seqlen_k)
    softmax_scale = checks.scale(op, "softmax_scale", softmax_scale)
    causal = checks.flag(op, "causal", causal)
    checks.choice(op, "kernel", kernel, KERNELS)
    host = _on_host(q)
    for name, x in (("k", k), ("v", v), (cu_q_name, cu_seqlens_q), (cu_k_name, cu_seqlens_k)):
        if _on_host(x) != host:  # the reference must not read device memory, nor the kernels host memory
            where, other = ("host", "device") if host else ("device", "host")
            raise ValueError(f"{op}: {name}: expected {where} memory (q is a {where} array), got a {other} array")
    return max_seqlen_q, max_seqlen_k, softmax_scale, causal


def _on_host(x: Any) -> bool:
    """arrays.on_host, PyTorch tensors by their device (what torch.compile traces: the
    flash_attn_varlen functions run these checks inside compiled code)."""
    if arrays.framework(x) == "torch":
        return x.device.type == "cpu"
    return arrays.on_host(x)


def run(
    q: Any,
    k: Any,
    v: Any,
    cu_seqlens_q: Any,
    cu_seqlens_k: Any,
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: Optional[float],
    causal: bool,
    kernel: str,
) -> Tuple[Any, Any]:
    """mha_prefill on checked arguments: allocates the outputs (rows in no sequence: 0 on the
    host, unwritten on the device) and runs the reference or the GPU kernels."""
    total_q, h_q = int(q.shape[0]), int(q.shape[1])
    if arrays.on_host(q):
        out = arrays.full(q, (total_q, h_q, int(v.shape[2])), None, 0)
        lse = arrays.full(q, (h_q, total_q), "float32", 0)
    else:
        out = arrays.empty(q, (total_q, h_q, int(v.shape[2])), None)
        lse = arrays.empty(q, (h_q, total_q), "float32")
    x = arrays.extension_view
    args = (x(q), x(k), x(v), cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, x(out), lse)
    try:
        if arrays.on_host(q):
            _C.mha_prefill_reference(*args, softmax_scale, causal)
            return out, lse
        with arrays.device_scope(q):
            size = _C.mha_prefill_workspace_size(*args, softmax_scale, causal, kernel)
            workspace = arrays.empty(q, (size,), "uint8") if size > 0 else None
            _C.mha_prefill(*args, workspace, softmax_scale, causal, kernel, arrays.current_stream(q))
    except TypeError as e:  # the extension's conversion ('q: unsupported dtype ...'), named like the library's
        raise TypeError(f"mha_prefill: {e}") from None
    return out, lse
