"""Merging partial attention states (include/mlakit/merge.h; docs/contract.md, Merging states):
the float64 CPU reference on host arrays, the GPU merge on device arrays."""

from __future__ import annotations

from typing import Any, List, Optional, Tuple

from . import _arrays as arrays
from . import _checks as checks
from . import _mlakit as _C
from ._gqa_cache import call, same_place

LSE_BASES = ("e", "2")
MAX_ROW_DIMS = 3  # a state's rows: [tokens, heads], [b, s_q, h_q], ...


def merge_states(
    o: Any,
    lse: Any,
    out: Optional[Any] = None,
    out_lse: Optional[Any] = None,
    *,
    lse_base: str = "e",
    out_lse_base: Optional[str] = None,
) -> Tuple[Any, Any]:
    """Merges N partial attention states of the same rows, computed over disjoint parts of one
    key set (the KV shards of several GPUs, a shared prefix and a suffix, split-KV pieces):
    per row ``lse = log(sum_i exp(lse_i))`` and ``out = sum_i o_i * exp(lse_i - lse)``,
    computed stably in float32 on the GPU (float64 on the host).

    ``o``: a list (or tuple) of N arrays [rows..., d] (1 to 3 row dimensions; bfloat16, float16
    or float32, all of one dtype, shape and strides; the last dimension contiguous), or one
    array [N, rows..., d] stacking them. ``lse``: the same for the float32 LSEs [rows...] (or
    [N, rows...]); any strides, e.g. the transposed view of a [heads, tokens] LSE.
    ``lse_base``: 'e' or '2', the base of every ``lse[i]``; ``out_lse_base`` that of
    ``out_lse`` (None: the same).

    - A state with LSE -inf or +inf is empty: it contributes nothing and its o is not read
      (it may hold NaN). A row whose states are all empty gets out 0 and lse +inf. A NaN LSE
      makes its row's out and lse NaN.
    - ``out``: [rows..., d] bfloat16, float16 or float32 (allocated in o's dtype when None),
      disjoint from the inputs or one of the o arrays (in place); ``out_lse``: [rows...]
      float32 (allocated when None), disjoint or one of the lse arrays.

    Returns ``(out, out_lse)``. Host arrays run the float64 CPU reference (out rounded once);
    device arrays the GPU merge on the current stream (asynchronous, capturable in a CUDA
    graph). N is at most 128 per call; merging in groups gives the same result up to rounding.
    """
    op = "merge_states"
    o_states = _states(op, "o", o, "[rows..., d]", 2)
    lse_states = _states(op, "lse", lse, "[rows...]", 1)
    if len(lse_states) != len(o_states):
        raise ValueError(f"{op}: lse: expected {len(o_states)} states (one per state of o), got {len(lse_states)}")
    if out is not None:
        checks.writable(op, "out", checks.array_of_rank(op, "out", out, "[rows..., d]", 2, 1 + MAX_ROW_DIMS))
    if out_lse is not None:
        checks.writable(op, "out_lse", checks.array_of_rank(op, "out_lse", out_lse, "[rows...]", 1, MAX_ROW_DIMS))
    checks.choice(op, "lse_base", lse_base, LSE_BASES)
    if out_lse_base is None:
        out_lse_base = lse_base
    checks.choice(op, "out_lse_base", out_lse_base, LSE_BASES)
    first = o_states[0]
    named = {f"o[{i}]": x for i, x in enumerate(o_states)}
    named.update({f"lse[{i}]": x for i, x in enumerate(lse_states)}, out=out, out_lse=out_lse)
    same_place(op, "o[0]", first, named)

    shape = tuple(int(n) for n in first.shape)
    if out is None:
        out = arrays.empty(first, shape)
    if out_lse is None:
        out_lse = arrays.empty(first, shape[:-1], "float32")
    v = arrays.extension_view
    args = ([v(x) for x in o_states], [v(x) for x in lse_states], v(out), v(out_lse), lse_base, out_lse_base)
    if arrays.on_host(first):
        call(op, _C.merge_states_reference, *args)
    else:
        with arrays.device_scope(first):
            call(op, _C.merge_states, *args, arrays.current_stream(first))
    return out, out_lse


def _states(op: str, name: str, states: Any, dims: str, low: int) -> List[Any]:
    """`states`, a list or tuple of arrays `dims` of `low` to `low + 2` dimensions or one array
    stacking them along a new first axis, as the list of per-state arrays (the stacked form
    split into views: nothing is copied)."""
    high = low + MAX_ROW_DIMS - 1
    if isinstance(states, (list, tuple)):
        items = list(states)
        for i, x in enumerate(items):
            checks.array_of_rank(op, f"{name}[{i}]", x, dims, low, high)
    else:
        checks.array_of_rank(op, name, states, "[n, " + dims[1:], low + 1, high + 1)
        items = [states[i] for i in range(int(states.shape[0]))]
    if not items:
        raise ValueError(f"{op}: {name}: expected at least one state, got none")
    if len(items) > _C.MAX_MERGE_STATES:
        raise ValueError(f"{op}: {name}: expected at most {_C.MAX_MERGE_STATES} states per call (merging in groups "
                         f"gives the same result), got {len(items)}")
    return items
