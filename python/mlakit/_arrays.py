"""How mlakit meets array frameworks (NumPy, PyTorch, CuPy): where an array lives, how its
framework allocates outputs and workspaces, which stream it runs on, and the view of it the
extension takes.

mlakit allocates nothing itself: every output and workspace comes from the framework of the
caller's arrays, on their device, so its memory pool, stream semantics and CUDA-graph
capture apply to it as to any other tensor of that framework.
"""

from __future__ import annotations

import contextlib
from typing import Any, ContextManager, Dict, Optional, Tuple

# DLPack device types that the CPU can read: kDLCPU and kDLCUDAHost (pinned memory).
_HOST_DEVICE_TYPES = (1, 3)


_FRAMEWORK_OF_TYPE: Dict[type, str] = {}


def framework(x: Any) -> str:
    """'numpy', 'torch', 'cupy' or 'other' (e.g. JAX, whose arrays are immutable). Memoised per
    type: a decode call asks ~20 times."""
    kind = _FRAMEWORK_OF_TYPE.get(type(x))
    if kind is None:
        module = type(x).__module__.split(".")[0]
        kind = _FRAMEWORK_OF_TYPE[type(x)] = module if module in ("numpy", "torch", "cupy") else "other"
    return kind


def on_host(x: Any) -> bool:
    """True for arrays in host memory: those run the float64 CPU reference."""
    kind = framework(x)
    if kind == "numpy":
        return True
    if kind == "torch":
        return not x.is_cuda  # pinned CPU tensors are host memory too
    return int(x.__dlpack_device__()[0]) in _HOST_DEVICE_TYPES


def _bfloat16_host_dtype() -> Any:
    """NumPy has no bfloat16: ml_dtypes' when installed, else uint16 bit patterns (which the
    extension reads as bfloat16)."""
    import numpy as np

    try:
        import ml_dtypes

        return ml_dtypes.bfloat16
    except ImportError:
        return np.uint16


def _float8_host_dtype() -> Any:
    """NumPy has no float8 either: ml_dtypes' float8_e4m3fn when installed, else uint8 bytes
    (which the GQA cache functions read as float8 e4m3)."""
    import numpy as np

    try:
        import ml_dtypes

        return ml_dtypes.float8_e4m3fn
    except ImportError:
        return np.uint8


def dtype(like: Any, name: str) -> Any:
    """The dtype called `name` ('float32', 'int32', 'int8', 'uint8', 'float16', 'bfloat16',
    'float8_e4m3fn') in `like`'s framework."""
    kind = framework(like)
    if kind == "torch":
        import torch

        return getattr(torch, name)
    if name == "bfloat16":
        # CuPy has no bfloat16 either: bit patterns there too.
        return _bfloat16_host_dtype() if kind == "numpy" else "uint16"
    if name == "float8_e4m3fn":
        # Nor float8: its bytes.
        return _float8_host_dtype() if kind == "numpy" else "uint8"
    return name


def empty(like: Any, shape: Tuple[int, ...], dtype_name: Optional[str] = None) -> Any:
    """An uninitialised array of `shape` in `like`'s framework and device, of dtype
    `dtype_name` or `like`'s dtype."""
    kind = framework(like)
    if kind == "numpy":
        import numpy as np

        return np.empty(shape, dtype=dtype(like, dtype_name) if dtype_name else like.dtype)
    if kind == "torch":
        import torch

        return torch.empty(shape, dtype=dtype(like, dtype_name) if dtype_name else like.dtype, device=like.device)
    if kind == "cupy":
        import cupy

        with like.device:
            return cupy.empty(shape, dtype=dtype(like, dtype_name) if dtype_name else like.dtype)
    raise TypeError(
        f"mlakit: cannot allocate outputs for arrays of type {type(like).__module__}.{type(like).__name__}: "
        "mlakit writes its outputs into arrays of the caller's framework, which must be NumPy, PyTorch or CuPy "
        "(JAX arrays are immutable: pass e.g. torch.from_dlpack(x) views)"
    )


def full(like: Any, shape: Tuple[int, ...], dtype_name: Optional[str], value: float) -> Any:
    """An array of `shape` filled with `value`, in `like`'s framework and device (on the
    device: an asynchronous fill on the current stream, so it can be captured in a CUDA graph)."""
    out = empty(like, shape, dtype_name)
    if framework(out) == "torch":
        out.fill_(value)
    elif framework(out) == "cupy":
        with like.device:
            out.fill(value)
    else:
        out[...] = value
    return out


def int32_view(buffer: Any, offset: int, shape: Tuple[int, ...]) -> Any:
    """The int32 array of `shape` at byte `offset` of the uint8 array `buffer` (a view: it
    shares buffer's memory and keeps it alive)."""
    count = 1
    for n in shape:
        count *= n
    region = buffer[offset : offset + 4 * count]
    return region.view(dtype(buffer, "int32")).reshape(shape)


def strided_view(base: Any, shape: Tuple[int, ...], strides: Tuple[int, ...]) -> Any:
    """The view of `base`'s memory (from its first element) of `shape` with `strides` in
    elements, in `base`'s framework (a view: it shares base's memory and keeps it alive)."""
    kind = framework(base)
    if kind == "torch":
        return base.as_strided(shape, strides)
    itemsize = base.dtype.itemsize
    byte_strides = tuple(s * itemsize for s in strides)
    if kind == "cupy":
        import cupy

        return cupy.lib.stride_tricks.as_strided(base, shape, byte_strides)
    import numpy as np

    return np.lib.stride_tricks.as_strided(base, shape, byte_strides)


def extension_view(x: Any) -> Any:
    """The view of `x` that DLPack can carry to the extension: ml_dtypes bfloat16 and float8
    arrays as uint16 / uint8 bit patterns (NumPy cannot export them), PyTorch float8 tensors
    (FlashMLA's FP8-cache dtype) as their bytes. Other arrays, and None, pass unchanged."""
    if x is None:
        return None
    kind = framework(x)
    if kind == "numpy" and x.dtype.kind == "V" and x.dtype.name.startswith(("bfloat16", "float8")):
        import numpy as np

        return x.view(np.uint16 if x.dtype.itemsize == 2 else np.uint8)
    if kind == "torch" and str(x.dtype).startswith("torch.float8"):
        import torch

        return x.view(torch.uint8)
    return x


def traced(x: Any) -> bool:
    """Whether torch.compile is tracing a call on `x` (a PyTorch tensor): such a call goes
    through its torch.ops.mlakit op, which the compiled graph keeps as one node. Eager calls go
    straight to the extension: the op's Python dispatch (autograd, ADInplaceOrView and backend
    layers, alias checks) costs 100-200 us of host time per call, more than a short decode
    kernel takes, and a decode step queued from Python would wait on it."""
    if framework(x) != "torch":
        return False
    import torch

    return torch.compiler.is_compiling()


def to_extension(x: Any) -> Any:
    """The argument the extension takes for array `x` on a hot path: a PyTorch tensor as a
    DLPack capsule made by torch.utils.dlpack.to_dlpack (float8 as its bytes), ~0.3 us where
    the extension's own import through Tensor.__dlpack__ costs ~3 us a tensor, a decode call
    passing seven or more; other arrays (and None) as extension_view gives them."""
    if x is None or framework(x) != "torch":
        return extension_view(x)
    import torch.utils.dlpack

    if x.is_floating_point() and x.element_size() == 1:  # float8: its bytes
        x = x.view(torch.uint8)
    return torch.utils.dlpack.to_dlpack(x)


def current_stream(like: Any) -> int:
    """The caller's current CUDA stream for `like`'s device, as an integer handle."""
    kind = framework(like)
    if kind == "torch":
        import torch

        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # 0.3 us; the public path takes ~4
        if raw is not None:
            return raw(like.device.index)
        return torch.cuda.current_stream(like.device).cuda_stream
    if kind == "cupy":
        import cupy

        with like.device:
            return cupy.cuda.get_current_stream().ptr
    return 0


def device_scope(like: Any) -> ContextManager[Any]:
    """Makes `like`'s GPU the current device: mlakit checks plans and pointers against it."""
    kind = framework(like)
    if kind == "torch" and like.is_cuda:
        import torch

        if like.device.index == torch.cuda.current_device():
            return contextlib.nullcontext()  # already current: no device switch (~3 us) per call
        return torch.cuda.device(like.device)
    if kind == "cupy":
        return like.device
    return contextlib.nullcontext()
