"""The FP8 MLA caches (docs/contract.md). DeepSeek-V3.2's FP8-with-scale cache, 656 bytes per
token: 512 float8 e4m3 NoPE values in 4 tiles of 128, 4 float32 tile scales, 64 bfloat16 RoPE
values. DeepSeek V4's cache, 584 bytes per token kept per page block: the block's 576-byte
records (448 float8 e4m3 NoPE values in 7 tiles of 64, 64 bfloat16 RoPE values), then its
8-byte scale records (7 power-of-two UE8M0 scales, one unused byte). Device arrays run on the
current stream; host arrays run the CPU version (bit-identical)."""

from __future__ import annotations

from typing import Any

from . import _arrays as arrays
from . import _checks as checks
from . import _mlakit as _C

TOKEN_BYTES = 656
D_QK = 576
V4_TOKEN_BYTES = 584
V4_D_QK = 512
V4_BLOCK_ALIGN = 576  # FlashMLA pads a V4 page block to a multiple of one record


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


def v4_block_stride(page_size: int) -> int:
    """The bytes between page blocks of a V4 cache that quantize_fp8_v4_cache allocates:
    page_size * 584 rounded up to a multiple of 576, as FlashMLA pads them (page_size 64:
    37376 -> 37440)."""
    return -(-page_size * V4_TOKEN_BYTES // V4_BLOCK_ALIGN) * V4_BLOCK_ALIGN


def quantize_fp8_v4_cache(kv: Any) -> Any:
    """kv [num_blocks, page_size, 1, 512] (or [num_blocks, page_size, 512]) bfloat16 -> a new
    DeepSeek V4 FP8 cache: a uint8 view [num_blocks, page_size, 1, 584] whose blocks lie
    v4_block_stride(page_size) bytes apart (FlashMLA's padding; the padding bytes are 0)."""
    op = "quantize_fp8_v4_cache"
    checks.array_of_rank(op, "kv", kv, "[num_blocks, page_size, 1, 512]", 3, 4)
    num_blocks, page_size = int(kv.shape[0]), int(kv.shape[1])
    if page_size < 1:
        raise ValueError(f"{op}: kv.shape[1] (page_size): expected >= 1, got {page_size}")
    stride = v4_block_stride(page_size)
    buffer = arrays.full(kv, (num_blocks, stride), "uint8", 0)
    shape = (num_blocks, page_size, 1, V4_TOKEN_BYTES)
    cache = arrays.strided_view(buffer, shape, (stride, V4_TOKEN_BYTES, V4_TOKEN_BYTES, 1))
    _run("quantize_mla_cache_fp8_v4", kv, kv, cache)
    return cache


def dequantize_fp8_v4_cache(cache: Any) -> Any:
    """A DeepSeek V4 FP8 cache [num_blocks, page_size, 1, 584] -> a new bfloat16 array
    [num_blocks, page_size, 1, 512] (uint16 bit patterns where the framework has no bfloat16)."""
    checks.array("dequantize_fp8_v4_cache", "cache", cache, "[num_blocks, page_size, 1, 584]")
    out = arrays.empty(cache, tuple(cache.shape[:-1]) + (V4_D_QK,), "bfloat16")
    _run("dequantize_mla_cache_fp8_v4", cache, cache, out)
    return out


def append_fp8_v4_cache(tokens: Any, slots: Any, cache: Any) -> None:
    """Quantizes tokens [n, 512] bfloat16 into the DeepSeek V4 FP8 cache [num_blocks,
    page_size, 1, 584] at slots [n] int32 (``block * page_size + offset``; -1 and out-of-range
    slots are skipped), in place: only those tokens' records and scale records are written."""
    op = "append_fp8_v4_cache"
    checks.array(op, "tokens", tokens, "[n, 512]")
    checks.array(op, "slots", slots, "[n]")
    checks.writable(op, "cache", checks.array(op, "cache", cache, "[num_blocks, page_size, 1, 584]"))
    _run("append_mla_cache_fp8_v4", cache, tokens, slots, cache)
