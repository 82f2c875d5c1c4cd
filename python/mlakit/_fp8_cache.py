"""The FP8-with-scale MLA cache (docs/contract.md), 656 bytes per token: 512 float8 e4m3 NoPE
values in 4 tiles of 128, 4 float32 tile scales, 64 bfloat16 RoPE values. Device arrays run
on the current stream; host arrays run the CPU version (bit-identical)."""

from __future__ import annotations

from typing import Any

from . import _arrays as arrays
from . import _checks as checks
from . import _mlakit as _C

TOKEN_BYTES = 656
D_QK = 576


def _run(name: str, like: Any, *args: Any) -> None:
    """The host (`<name>_reference`) or device (`<name>` on the current stream) tool."""
    args = tuple(arrays.extension_view(a) for a in args)
    if arrays.on_host(like):
        getattr(_C, name + "_reference")(*args)
        return
    with arrays.device_scope(like):
        getattr(_C, name)(*args, arrays.current_stream(like))


def quantize_fp8_cache(kv: Any) -> Any:
    """kv [..., 576] bfloat16 -> a new uint8 array [..., 656] in the FP8-with-scale format
    (FlashMLA's FP8 sparse-decode cache when kv is [num_blocks, page_size, 1, 576])."""
    checks.array("quantize_fp8_cache", "kv", kv, "[..., 576]")
    out = arrays.empty(kv, tuple(kv.shape[:-1]) + (TOKEN_BYTES,), "uint8")
    _run("quantize_mla_cache_fp8", kv, kv, out)
    return out


def dequantize_fp8_cache(cache: Any) -> Any:
    """cache [..., 656] FP8-with-scale bytes -> a new bfloat16 array [..., 576] (uint16 bit
    patterns where the framework has no bfloat16: CuPy, NumPy without ml_dtypes)."""
    checks.array("dequantize_fp8_cache", "cache", cache, "[..., 656]")
    out = arrays.empty(cache, tuple(cache.shape[:-1]) + (D_QK,), "bfloat16")
    _run("dequantize_mla_cache_fp8", cache, cache, out)
    return out


def append_fp8_cache(tokens: Any, slots: Any, cache: Any) -> None:
    """Quantizes tokens [n, 576] bfloat16 into the paged FP8 cache [num_blocks, page_size, 1,
    656] at slots [n] int32 (``block * page_size + offset``; -1 and out-of-range slots are
    skipped), in place."""
    op = "append_fp8_cache"
    checks.array(op, "tokens", tokens, "[n, 576]")
    checks.array(op, "slots", slots, "[n]")
    checks.writable(op, "cache", checks.array(op, "cache", cache, "[num_blocks, page_block_size, 1, 656]"))
    _run("append_mla_cache_fp8", cache, tokens, slots, cache)
