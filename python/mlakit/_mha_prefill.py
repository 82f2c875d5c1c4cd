"""Dense MHA prefill over variable-length sequences (include/mlakit/mha_prefill.h), forward and
backward: the float64 CPU reference on host arrays, the GPU kernels on device arrays."""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional, Sequence, Tuple

from . import _arrays as arrays
from . import _checks as checks
from . import _mlakit as _C

KERNELS = ("auto", "portable", "sm90")


class Varlen(NamedTuple):
    """The checked arguments the forward and the backward share after q, k, v: the sequences
    (cu_seqlens_q / cu_seqlens_k as given, the max lengths as ints) and the softmax options,
    in the order of the public signatures and of the extension's entries."""

    cu_seqlens_q: Any
    cu_seqlens_k: Any
    max_seqlen_q: int
    max_seqlen_k: int
    softmax_scale: Optional[float]
    causal: bool

    def sequences(self) -> Tuple[Any, Any, int, int]:
        """What the extension's entries take after the input arrays (before the outputs)."""
        return self.cu_seqlens_q, self.cu_seqlens_k, self.max_seqlen_q, self.max_seqlen_k

    def softmax(self) -> Tuple[Optional[float], bool]:
        """What they take after the outputs (and the workspace), before their own options."""
        return self.softmax_scale, self.causal


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
    PyTorch tensors that require grad (grad mode on), and calls that torch.compile traces,
    run through ``torch.ops.mlakit.mha_prefill``, whose gradient is
    :func:`mha_prefill_backward`'s.
    """
    varlen = check_arguments("mha_prefill", q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                             softmax_scale, causal, kernel)
    return forward(q, k, v, varlen, kernel)


def mha_prefill_backward(
    dout: Any,
    q: Any,
    k: Any,
    v: Any,
    out: Any,
    lse: Any,
    cu_seqlens_q: Any,
    cu_seqlens_k: Any,
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    deterministic: bool = False,
    kernel: str = "auto",
) -> Tuple[Any, Any, Any]:
    """The gradients of :func:`mha_prefill`: from ``dout`` [total_q, h_q, d_v] (dL/dout, q's
    dtype), the forward's inputs and arguments, and its ``out`` [total_q, h_q, d_v] and
    ``lse`` [h_q, total_q] float32 (used as given, not recomputed: FlashAttention's
    ``P = exp(s - lse)``, ``D = rowsum(dout * out)``), returns ``(dq [total_q, h_q, d_qk], dk
    [total_k, h_kv, d_qk], dv [total_k, h_kv, d_v])`` in q's dtype. dk and dv of a kv head
    are summed over the h_q / h_kv query heads that share it. A query that sees no key gets
    dq 0; a key row of a sequence without queries gets dk = dv = 0; rows in no sequence are 0
    on the host and not written on the device.

    ``deterministic`` (device arrays): bitwise-identical gradients from run to run (without
    it the order of the kernels' float32 accumulation may vary). ``kernel`` (device arrays):
    'portable' (the portable kernels, on any GPU of compute capability 8.0+), 'sm90' (the
    Hopper main kernel: (d_qk, d_v) = (64, 64), (128, 128) or (192, 128) with 16-byte rows of q, k, v and dout, else an error
    saying why), 'auto' (the Hopper kernel where 'sm90' would run, else the portable ones).
    Host arrays run the float64 CPU reference (deterministic; it ignores both, and checks the
    prefix sums' values); device arrays the GPU kernels on the current stream, with a workspace
    allocated by the inputs' framework.
    """
    op = "mha_prefill_backward"
    checks.array(op, "dout", dout, "[total_q, h_q, d_v]")
    varlen = check_arguments(op, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
                             causal, kernel)
    checks.array(op, "out", out, "[total_q, h_q, d_v]")
    checks.array(op, "lse", lse, "[h_q, total_q]")
    deterministic = checks.flag(op, "deterministic", deterministic)
    _check_where(op, q, (("dout", dout), ("out", out), ("lse", lse)))
    return run_backward(dout, q, k, v, out, lse, varlen, deterministic, kernel)


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
) -> Varlen:
    """The argument checks of mha_prefill (what the output allocation and the extension's
    conversion rely on, and that every array is where q is), named after `op` and, for the
    sequence arguments, `names` (the caller's parameter names); returns the checked
    :class:`Varlen`. Everything else is the library's to check."""
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
    _check_where(op, q, (("k", k), ("v", v), (cu_q_name, cu_seqlens_q), (cu_k_name, cu_seqlens_k)))
    return Varlen(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal)


def _check_where(op: str, q: Any, named: Sequence[Tuple[str, Any]]) -> None:
    """Every array of `named` is in host memory if q is, in device memory if q is: the
    reference must not read device memory, nor the kernels host memory."""
    host = _on_host(q)
    for name, x in named:
        if _on_host(x) != host:
            where, other = ("host", "device") if host else ("device", "host")
            raise ValueError(f"{op}: {name}: expected {where} memory (q is a {where} array), got a {other} array")


def _on_host(x: Any) -> bool:
    """arrays.on_host, PyTorch tensors by their device (what torch.compile traces: the
    flash_attn_varlen functions run these checks inside compiled code)."""
    if arrays.framework(x) == "torch":
        return x.device.type == "cpu"
    return arrays.on_host(x)


def needs_grad(*xs: Any) -> bool:
    """Whether autograd would record a call on these arrays (PyTorch tensors, grad mode on,
    one of them requiring grad): such a call goes through torch.ops.mlakit.mha_prefill, which
    has the backward; others go straight to the extension (see arrays.traced)."""
    if arrays.framework(xs[0]) != "torch":
        return False
    import torch

    return torch.is_grad_enabled() and any(getattr(x, "requires_grad", False) for x in xs)


def forward(q: Any, k: Any, v: Any, varlen: Varlen, kernel: str, deterministic: bool = False) -> Tuple[Any, Any]:
    """mha_prefill on checked arguments: through ``torch.ops.mlakit.mha_prefill`` (which has
    the backward, given ``deterministic``) when torch.compile traces the call or autograd
    records it, else straight to :func:`run`."""
    if arrays.traced(q) or needs_grad(q, k, v):
        import torch

        from . import torch_ops  # noqa: F401  (registers the ops)

        return torch.ops.mlakit.mha_prefill(q, k, v, *varlen, kernel, deterministic)
    return run(q, k, v, varlen, kernel)


def run(q: Any, k: Any, v: Any, varlen: Varlen, kernel: str) -> Tuple[Any, Any]:
    """mha_prefill on checked arguments: allocates the outputs (rows in no sequence: 0 on the
    host, unwritten on the device) and runs the reference or the GPU kernels."""
    total_q, h_q = int(q.shape[0]), int(q.shape[1])
    out = _output(q, (total_q, h_q, int(v.shape[2])))
    lse = _output(q, (h_q, total_q), "float32")
    x = arrays.extension_view
    args = (x(q), x(k), x(v), *varlen.sequences(), x(out), lse)
    softmax = varlen.softmax()
    _call("mha_prefill", q, args, softmax, (*softmax, kernel), _C.mha_prefill_reference,
          _C.mha_prefill_workspace_size, _C.mha_prefill)
    return out, lse


def run_backward(
    dout: Any, q: Any, k: Any, v: Any, out: Any, lse: Any, varlen: Varlen, deterministic: bool, kernel: str
) -> Tuple[Any, Any, Any]:
    """mha_prefill_backward on checked arguments: allocates dq, dk, dv in q's dtype (rows in no
    sequence: 0 on the host, unwritten on the device) and runs the reference or the GPU
    kernels."""
    dq, dk, dv = (_output(q, tuple(int(n) for n in x.shape)) for x in (q, k, v))
    x = arrays.extension_view
    args = (x(dout), x(q), x(k), x(v), x(out), lse, *varlen.sequences(), x(dq), x(dk), x(dv))
    softmax = varlen.softmax()
    _call("mha_prefill_backward", q, args, softmax, (*softmax, deterministic, kernel),
          _C.mha_prefill_backward_reference, _C.mha_prefill_backward_workspace_size, _C.mha_prefill_backward)
    return dq, dk, dv


def _output(like: Any, shape: Tuple[int, ...], dtype_name: Optional[str] = None) -> Any:
    """An output array: zero-filled on the host (the reference leaves rows in no sequence as
    they are), uninitialised on the device (the kernels do too: no memset per call)."""
    if arrays.on_host(like):
        return arrays.full(like, shape, dtype_name, 0)
    return arrays.empty(like, shape, dtype_name)


def _call(
    op: str,
    like: Any,
    args: Tuple[Any, ...],
    reference_options: Tuple[Any, ...],
    device_options: Tuple[Any, ...],
    reference: Callable[..., None],
    workspace_size: Callable[..., int],
    device_entry: Callable[..., None],
) -> None:
    """One call of the extension, the forward's or the backward's: `reference` on host
    arrays; on device arrays `workspace_size`, a workspace of that many bytes from `like`'s
    framework, then `device_entry` on the current stream. The extension's conversion errors
    ('q: unsupported dtype ...') are named after `op`, like the library's."""
    try:
        if arrays.on_host(like):
            reference(*args, *reference_options)
            return
        with arrays.device_scope(like):
            size = workspace_size(*args, *device_options)
            workspace = arrays.empty(like, (size,), "uint8") if size > 0 else None
            device_entry(*args, workspace, *device_options, arrays.current_stream(like))
    except TypeError as e:
        raise TypeError(f"{op}: {e}") from None
