"""Checks of the Python entry points' arguments, run before anything is allocated.

Outputs are allocated from the inputs' shapes, and the extension's argument conversion
answers a wrong type with a generic ``TypeError`` naming no argument. So every entry point
first checks here what that allocation and that conversion rely on: each array is an array
(not None, not a list) of the expected number of dimensions, exportable through DLPack
(native byte order, a numeric dtype) and, where mlakit writes into it, writable; each scalar
has its type. The errors name the operation and the argument, like the library's:
``mla_decode: q: expected a 4-d array [b, s_q, h_q, d_qk], got shape (64, 4096, 576)``.
Everything else (dtypes, shape agreement, strides, values) the library checks, with messages
of the same form.
"""

from __future__ import annotations

import functools
import numbers
from typing import Any, Optional, Sequence, Tuple

_FRAMEWORKS = "an array (NumPy, PyTorch, CuPy or another DLPack array)"


def _type_name(x: Any) -> str:
    return type(x).__name__


@functools.lru_cache(maxsize=None)
def _dims(dims: str) -> Tuple[Sequence[str], bool]:
    """'[b, s_q, h_q, d_qk]' -> (names, False); '[..., 576]' -> (['576'], True). Cached: the
    entry points pass a few constant strings, and a decode call checks several arrays."""
    names = tuple(d.strip() for d in dims.strip("[]").split(","))
    return (names[1:], True) if names[0] == "..." else (names, False)


def array(op: str, name: str, x: Any, dims: str) -> Any:
    """`x` is an array whose dimensions `dims` names as the docs write them ('[b, s_q, h_q,
    d_qk]'; a leading '...' admits any number of leading dimensions). Returns `x`."""
    names, leading = _dims(dims)
    shape = _exportable_shape(op, name, x, dims)
    if leading and len(shape) < len(names):
        raise ValueError(f"{op}: {name}: expected an array {dims} of rank >= {len(names)}, got shape {shape}")
    if not leading and len(shape) != len(names):
        raise ValueError(f"{op}: {name}: expected a {len(names)}-d array {dims}, got shape {shape}")
    return x


def array_of_rank(op: str, name: str, x: Any, dims: str, low: int, high: int) -> Any:
    """`x` is an array of `low` to `high` dimensions, which `dims` describes as the docs write
    them ('[rows..., d]'). Returns `x`."""
    shape = _exportable_shape(op, name, x, dims)
    if not low <= len(shape) <= high:
        raise ValueError(f"{op}: {name}: expected an array {dims} of {low} to {high} dimensions, got shape {shape}")
    return x


def _exportable_shape(op: str, name: str, x: Any, dims: str) -> Tuple[int, ...]:
    """The shape of `x`, once it is known to be an array DLPack can carry."""
    if type(x).__module__ == "torch" and type(x).__name__ in ("Tensor", "Parameter"):
        return tuple(x.shape)  # the common case, without the generic probes below (a torch.Size holds ints)
    if x is None or not (hasattr(x, "__dlpack__") and hasattr(x, "shape")):
        raise TypeError(f"{op}: {name}: expected {_FRAMEWORKS} {dims}, got {'None' if x is None else _type_name(x)}")
    _check_exportable(op, name, x)
    return tuple(int(n) for n in x.shape)


def optional_array(op: str, name: str, x: Any, dims: str) -> Any:
    """None, or an array as :func:`array` checks it."""
    return None if x is None else array(op, name, x, dims)


def writable(op: str, name: str, x: Any) -> Any:
    """An array mlakit writes into in place (NumPy marks read-only arrays; the other
    frameworks' arrays are writable)."""
    flags = getattr(x, "flags", None)
    if flags is not None and hasattr(flags, "writeable") and not flags.writeable:
        raise ValueError(f"{op}: {name}: expected a writable array (it is written in place), got a read-only one")
    return x


def _check_exportable(op: str, name: str, x: Any) -> None:
    """What NumPy cannot hand over through DLPack: non-native byte order, non-numeric dtypes
    (ml_dtypes' bfloat16 and float8 are viewed as bit patterns on the way, see
    _arrays.extension_view)."""
    dtype = getattr(x, "dtype", None)
    if type(x).__module__.split(".")[0] != "numpy" or dtype is None:
        return
    if not dtype.isnative:
        raise TypeError(
            f"{op}: {name}: expected an array in the machine's byte order, got dtype {dtype.str} "
            f"(convert it: x.astype(x.dtype.newbyteorder('=')))"
        )
    if dtype.kind not in "biuf" and not _is_ml_dtypes_bits(dtype):
        raise TypeError(f"{op}: {name}: expected a numeric array, got dtype {dtype}")


def _is_ml_dtypes_bits(dtype: Any) -> bool:
    return dtype.kind == "V" and dtype.names is None and dtype.name.startswith(("bfloat16", "float8"))


def scale(op: str, name: str, value: Any) -> Optional[float]:
    """None (the default, 1/sqrt(d_qk)) or a real number, as a float. The library refuses
    NaN and infinities, naming the argument too."""
    if value is None:
        return None
    if isinstance(value, (bool, str, bytes)) or not (isinstance(value, numbers.Real) or hasattr(value, "__float__")):
        raise TypeError(f"{op}: {name}: expected a float or None, got {_type_name(value)}")
    try:
        result = float(value)
    except (TypeError, ValueError) as e:  # e.g. an array of more than one element
        raise TypeError(f"{op}: {name}: expected a float or None, got {_type_name(value)} ({e})") from None
    return result


def real(op: str, name: str, value: Any) -> float:
    """A real number (NumPy's too; bool not), as a float. Ranges are the library's to check."""
    if value is None:
        raise TypeError(f"{op}: {name}: expected a float, got None")
    try:
        return scale(op, name, value)  # type: ignore[return-value]
    except TypeError as e:
        raise TypeError(str(e).replace("expected a float or None", "expected a float")) from None


def integer(op: str, name: str, value: Any, minimum: Optional[int] = None, bits: int = 32) -> int:
    """An int (NumPy integers too, bool not) that the extension's `bits`-bit parameter holds
    (the library checks the range that makes sense), at least `minimum` when given."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{op}: {name}: expected an int, got {_type_name(value)}")
    result = int(value)
    low, high = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    if minimum is not None and result < minimum:
        raise ValueError(f"{op}: {name}: expected >= {minimum}, got {result}")
    if not low <= result <= high:
        raise ValueError(f"{op}: {name}: expected an int in [-2^{bits - 1}, 2^{bits - 1} - 1], got {result}")
    return result


def flag(op: str, name: str, value: Any) -> bool:
    """A bool (NumPy's too)."""
    numpy_bool = type(value).__module__ == "numpy" and _type_name(value) in ("bool", "bool_")
    if not (isinstance(value, bool) or numpy_bool):
        raise TypeError(f"{op}: {name}: expected a bool, got {_type_name(value)}")
    return bool(value)


def choice(op: str, name: str, value: Any, choices: Sequence[str]) -> str:
    """One of the strings `choices`."""
    expected = " or ".join(repr(c) for c in choices)
    if not isinstance(value, str):
        raise TypeError(f"{op}: {name}: expected {expected}, got {_type_name(value)}")
    if value not in choices:
        raise ValueError(f"{op}: {name}: expected {expected}, got {value!r}")
    return value
