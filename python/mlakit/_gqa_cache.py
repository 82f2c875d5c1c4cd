"""The GQA decode's paged caches (docs/contract.md, GQA decode): quantize a bf16 / fp16 cache
to int8 or fp8 with scales, dequantize it back, append a step's new rows (keys rotated)
outside the decode. Device arrays run on the current stream; host arrays run the CPU
version, which stores identical bytes and scales.

A cache is ``values [num_blocks, page_size, h_kv, d]`` with its ``scale``:

- q's dtype (bfloat16 / float16): no scale (``None``);
- int8 or fp8 (float8 e4m3) with one float32 scale per (token, kv head): ``scale
  [num_blocks, page_size, h_kv]``;
- fp8 with one scale for the whole tensor: ``scale [1]`` float32 (or a float, which the
  functions turn into that array).

fp8 values are ``torch.float8_e4m3fn`` tensors, ``ml_dtypes.float8_e4m3fn`` NumPy arrays, or
uint8 arrays of their bytes (CuPy, NumPy without ml_dtypes): mlakit reads uint8 cache values
as float8 e4m3. Dequantized value = stored * scale.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

from . import _arrays as arrays
from . import _checks as checks
from . import _mlakit as _C

CACHE_DIMS = "[num_blocks, page_size, h_kv, d]"
SCALE_DIMS = "[num_blocks, page_size, h_kv] or [1]"
ROPE_STYLES = ("none", "neox", "gptj")
QUANTIZED = ("int8", "fp8")
HALF_DTYPES = ("bfloat16", "float16")


def _dtype_name(x: Any) -> str:
    return str(getattr(x, "dtype", "")).replace("torch.", "")


def check_cache(op: str, name: str, x: Any) -> Any:
    """A cache's values: a 4-d array whose float8 flavour, if any, is e4m3fn (the bytes of the
    others would be read as e4m3)."""
    checks.array(op, name, x, CACHE_DIMS)
    dtype = _dtype_name(x)
    if dtype.startswith("float8") and dtype != "float8_e4m3fn":
        raise TypeError(
            f"{op}: {name}: expected bfloat16, float16, int8 or float8_e4m3fn (or uint8 bytes of e4m3), got {dtype}"
        )
    return x


def scale_argument(op: str, name: str, value: Any, like: Any) -> Any:
    """None (a cache in q's dtype), a float (one fp8 scale for the tensor: made a [1] float32
    array of `like`'s framework and device) or a float32 array [num_blocks, page_size, h_kv]
    (per token and kv head) or [1] (per tensor)."""
    if value is None:
        return None
    if not hasattr(value, "__dlpack__"):
        if isinstance(value, (bool, str, bytes)) or not hasattr(value, "__float__"):
            raise TypeError(
                f"{op}: {name}: expected None, a float or a float32 array {SCALE_DIMS}, got {type(value).__name__}"
            )
        return arrays.full(like, (1,), "float32", checks.real(op, name, value))
    checks.array(op, name, value, "[...]")
    if len(value.shape) not in (1, 3):
        raise ValueError(
            f"{op}: {name}: expected a float32 array {SCALE_DIMS}, got shape {tuple(int(n) for n in value.shape)}"
        )
    return value


def rope_arguments(op: str, rope_style: Any, rope_theta: Any, rotary_dim: Any) -> Tuple[str, float, int]:
    """(style, theta, rotary_dim) as the extension takes them: style None means 'none'."""
    style = "none" if rope_style is None else checks.choice(op, "rope_style", rope_style, ("neox", "gptj", "none"))
    return style, checks.real(op, "rope_theta", rope_theta), checks.integer(op, "rotary_dim", rotary_dim)


def same_place(op: str, like_name: str, like: Any, named: Dict[str, Any]) -> None:
    """Every array of `named` in the memory `like` is in: host arrays run the CPU reference,
    which must not read device pointers, and device arrays the GPU."""
    host = arrays.on_host(like)
    for name, x in named.items():
        if x is None or not hasattr(x, "__dlpack__") or arrays.on_host(x) == host:
            continue
        where, other = ("host", "device") if host else ("device", "host")
        raise ValueError(
            f"{op}: {name}: expected {where} memory ({like_name} is a {where} array), got a {other} array"
        )


def call(op: str, fn: Any, *args: Any) -> Any:
    """fn(*args), its TypeErrors (an array dtype the extension cannot read: 'q: unsupported
    dtype ...') named after the function like the library's errors."""
    try:
        return fn(*args)
    except TypeError as e:
        raise TypeError(f"{op}: {e}") from None


def run(op: str, name: str, like: Any, *args: Any) -> None:
    """The host (`<name>_reference`) or device (`<name>` on the current stream) tool."""
    args = tuple(arrays.extension_view(a) for a in args)
    if arrays.on_host(like):
        call(op, getattr(_C, name + "_reference"), *args)
        return
    with arrays.device_scope(like):
        call(op, getattr(_C, name), *args, arrays.current_stream(like))


def quantize_gqa_cache(src: Any, dtype: str = "int8", scale: Optional[Any] = None) -> Tuple[Any, Any]:
    """src [num_blocks, page_size, h_kv, d] bfloat16 / float16 -> ``(values, scale)``, new
    arrays of src's framework and device.

    ``dtype='int8'``: int8 values, per-(token, kv head) scales ``max|x| / 127`` (values
    rounded to nearest even). ``dtype='fp8'``: float8 e4m3 values (``torch.float8_e4m3fn``,
    ``ml_dtypes.float8_e4m3fn``, or uint8 bytes where the framework has none), per-(token, kv
    head) scales ``max|x| / 448`` (saturating), or, with ``scale`` given (a float or a [1]
    float32 array), that one scale for the whole tensor: the returned scale is then [1].
    An all-zero row stores scale 0.
    """
    op = "quantize_gqa_cache"
    check_cache(op, "src", src)
    checks.choice(op, "dtype", dtype, QUANTIZED)
    if scale is not None and dtype == "int8":
        raise ValueError(f"{op}: scale: expected None for int8 (per-token scales only), got {type(scale).__name__}")
    scale = scale_argument(op, "scale", scale, src)
    if scale is not None and len(scale.shape) != 1:
        raise ValueError(f"{op}: scale: expected a float or a [1] float32 array (one fp8 scale per tensor), "
                         f"got shape {tuple(int(n) for n in scale.shape)}")
    same_place(op, "src", src, {"scale": scale})
    shape = tuple(int(n) for n in src.shape)
    values = arrays.empty(src, shape, "int8" if dtype == "int8" else "float8_e4m3fn")
    if scale is None:
        scale = arrays.empty(src, shape[:3], "float32")
    run(op, "quantize_gqa_cache", src, src, values, scale)
    return values, scale


def dequantize_gqa_cache(values: Any, scale: Any, dtype: str = "bfloat16") -> Any:
    """values [num_blocks, page_size, h_kv, d] (int8 or fp8) with their scale ([num_blocks,
    page_size, h_kv] or [1] float32, or a float) -> a new array of ``dtype`` ('bfloat16' or
    'float16'; NumPy without ml_dtypes and CuPy: bfloat16 as uint16 bit patterns):
    ``stored * scale``, rounded once."""
    op = "dequantize_gqa_cache"
    check_cache(op, "values", values)
    if scale is None:
        raise TypeError(f"{op}: scale: expected a float or a float32 array {SCALE_DIMS}, got None")
    scale = scale_argument(op, "scale", scale, values)
    checks.choice(op, "dtype", dtype, HALF_DTYPES)
    same_place(op, "values", values, {"scale": scale})
    out = arrays.empty(values, tuple(int(n) for n in values.shape), dtype)
    run(op, "dequantize_gqa_cache", values, values, scale, out)
    return out


def gqa_cache_append(
    k_new: Any,
    v_new: Any,
    k_cache: Any,
    v_cache: Any,
    block_table: Any,
    cache_seqlens: Any,
    *,
    k_scale: Optional[Any] = None,
    v_scale: Optional[Any] = None,
    rope_style: Optional[str] = None,
    rope_theta: float = 10000.0,
    rotary_dim: int = 0,
    finished: Optional[Any] = None,
) -> None:
    """Writes k_new / v_new [b, s_q, h_kv, d] (q's dtype: bfloat16 / float16) into the paged
    caches at positions ``[L - s_q, L)`` of each entry (L = cache_seqlens[i], the lengths
    after the append; block_table [b, max_blocks] int32), in place: k rotated by
    ``rope_style`` ('neox' or 'gptj'; ``rotary_dim`` 0 = d) at its position, both stored in
    the caches' format (per-token scales written; a per-tensor fp8 scale read).
    ``finished`` [b] uint8: nonzero entries are skipped. Exactly what :func:`gqa_decode`
    appends with ``k_new`` / ``v_new``; block ids and positions outside the cache are skipped."""
    op = "gqa_cache_append"
    checks.array(op, "k_new", k_new, "[b, s_q, h_kv, d]")
    checks.array(op, "v_new", v_new, "[b, s_q, h_kv, d]")
    checks.writable(op, "k_cache", check_cache(op, "k_cache", k_cache))
    checks.writable(op, "v_cache", check_cache(op, "v_cache", v_cache))
    checks.array(op, "block_table", block_table, "[b, max_blocks_per_seq]")
    checks.array(op, "cache_seqlens", cache_seqlens, "[b]")
    k_scale = scale_argument(op, "k_scale", k_scale, k_cache)
    v_scale = scale_argument(op, "v_scale", v_scale, k_cache)
    for name, scale in (("k_scale", k_scale), ("v_scale", v_scale)):
        if scale is not None and len(scale.shape) == 3:
            checks.writable(op, name, scale)
    style, theta, rot = rope_arguments(op, rope_style, rope_theta, rotary_dim)
    checks.optional_array(op, "finished", finished, "[b]")
    same_place(op, "k_cache", k_cache, dict(k_new=k_new, v_new=v_new, v_cache=v_cache, block_table=block_table,
                                             cache_seqlens=cache_seqlens, k_scale=k_scale, v_scale=v_scale,
                                             finished=finished))
    run(op, "gqa_cache_append", k_cache, k_new, v_new, k_cache, k_scale, v_cache, v_scale, block_table, cache_seqlens,
        style, theta, rot, finished)
