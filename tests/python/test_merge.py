"""mlakit.merge_states against a NumPy float64 formula written here (docs/contract.md, Merging
states): host arrays (the CPU reference) with every dtype pair, 1 to 3 row dimensions, empty
states (+-inf LSE, NaN in their o) and all-empty rows, NaN LSEs, both LSE bases, the stacked
and list forms, in place, a transposed LSE view, ml_dtypes bfloat16, and the argument errors;
PyTorch CUDA tensors (skipped without a GPU) under the accuracy rules, bitwise repeatable,
captured in a CUDA graph and compiled with fullgraph=True."""

import math

import numpy as np
import pytest

import mlakit
from accuracy import check_out, check_stat
from numpy_cases import as_float, to_bf16

LN2 = math.log(2)
DTYPES = ["bfloat16", "float16", "float32"]
# (states, rows, d): one to three row dimensions, d of 16-byte chunks and of single values.
SHAPES = [(2, (7,), 64), (1, (5, 3), 24), (6, (2, 3, 4), 20)]
# How far a merged value may be from the float64 formula: rounded once to its dtype.
ROUNDING = {"bfloat16": 2**-8, "float16": 2**-11, "float32": 2**-23}


def formula(o, lse, lse_base="e", out_lse_base=None):
    """Stacked states o [n, rows..., d], lse [n, rows...] merged in float64: (out [rows..., d],
    lse [rows...]). Empty states (+-inf) weigh 0 and their o is never used; all empty: 0 and
    +inf; a NaN LSE: a NaN row."""
    o, lse = as_float(o), np.asarray(lse, dtype=np.float64)
    natural = lse * LN2 if lse_base == "2" else lse
    empty = np.isinf(natural)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        top = np.where(empty, -np.inf, natural).max(axis=0)
        shift = np.where(np.isfinite(top), top, 0.0)
        weights = np.where(empty, 0.0, np.exp(natural - shift))
        total = weights.sum(axis=0)
        out = (np.where(empty[..., None], 0.0, o) * weights[..., None]).sum(axis=0) / total[..., None]
        merged = shift + np.log(total)
    all_empty = empty.all(axis=0)
    out[all_empty], merged[all_empty] = 0.0, np.inf
    broken = np.isnan(natural).any(axis=0)
    out[broken], merged[broken] = np.nan, np.nan
    return out, merged / LN2 if (out_lse_base or lse_base) == "2" else merged


def cast(x, dtype):
    return to_bf16(x) if dtype == "bfloat16" else np.asarray(x, dtype=dtype)


def states(rng, n, rows, d, dtype="float32"):
    """Stacked random states: o [n, rows..., d] ~ N(0, 1) / 4 in `dtype`, lse [n, rows...]
    float32 ~ N(4, 3) (weights spread over orders of magnitude)."""
    o = cast(rng.standard_normal((n, *rows, d)) / 4, dtype)
    return o, rng.normal(4.0, 3.0, (n, *rows)).astype(np.float32)


def empty_output(rows, d, dtype):
    return cast(np.full((*rows, d), np.nan), dtype)


def check_rounded(out, want, dtype):
    """out is the formula rounded once to `dtype` (NaN where it is NaN)."""
    got = as_float(out)
    assert np.array_equal(np.isnan(got), np.isnan(want))
    fine = ~np.isnan(want)
    err = np.abs(got[fine] - want[fine])
    assert np.all(err <= ROUNDING[dtype] * np.abs(want[fine]) + 1e-7), f"worst error {err.max():.3g}"


@pytest.mark.parametrize("n,rows,d", SHAPES)
@pytest.mark.parametrize("out_dtype", DTYPES)
@pytest.mark.parametrize("in_dtype", DTYPES)
def test_matches_the_formula(in_dtype, out_dtype, n, rows, d):
    rng = np.random.default_rng(len(rows) * 10 + n)
    o, lse = states(rng, n, rows, d, in_dtype)
    out, out_lse = mlakit.merge_states(list(o), list(lse), empty_output(rows, d, out_dtype))
    want, want_lse = formula(o, lse)
    check_rounded(out, want, out_dtype)
    check_out(as_float(out), want)
    check_stat(out_lse, want_lse)
    assert out_lse.dtype == np.float32 and out_lse.shape == rows


def test_out_is_allocated_in_the_states_dtype():
    o, lse = states(np.random.default_rng(1), 3, (4, 2), 16, "float16")
    out, out_lse = mlakit.merge_states(o, lse)
    assert out.dtype == np.float16 and out.shape == (4, 2, 16) and out_lse.shape == (4, 2)
    check_rounded(out, formula(o, lse)[0], "float16")


def with_empty_states(rng, o, lse):
    """A copy of (o, lse) where about a third of the states are empty, half of them -inf and
    half +inf, with NaN in their o; and the mask of those states."""
    o, lse = o.copy(), lse.copy()
    empty = rng.random(lse.shape) < 0.35
    lse[empty] = np.where(rng.random(lse.shape) < 0.5, -np.inf, np.inf)[empty]
    o[empty] = to_bf16(np.nan) if o.dtype == np.uint16 else np.nan
    return o, lse, empty


def test_empty_states_contribute_nothing_and_their_o_is_not_read():
    rng = np.random.default_rng(2)
    o, lse = states(rng, 5, (40,), 32, "bfloat16")
    o, lse, empty = with_empty_states(rng, o, lse)
    out, out_lse = mlakit.merge_states(o, lse)
    want, want_lse = formula(o, lse)
    check_out(as_float(out), want)
    check_stat(out_lse, want_lse)
    # A row with one non-empty state is that state (its LSE bit for bit).
    lone = empty.sum(axis=0) == 4
    assert lone.any()
    keep = np.argmin(empty, axis=0)[lone]
    np.testing.assert_array_equal(out[lone], o[keep, np.flatnonzero(lone)])
    np.testing.assert_array_equal(out_lse[lone], lse[keep, np.flatnonzero(lone)])


def test_rows_whose_states_are_all_empty_get_zero_and_plus_inf():
    rng = np.random.default_rng(3)
    o, lse = states(rng, 3, (6, 2), 16)
    lse[:, 1] = [[-np.inf, np.inf]] * 3  # row (1, 0) empty by -inf, (1, 1) by +inf in every state
    lse[:, 4, 0] = [np.inf, -np.inf, np.inf]  # row (4, 0): both kinds
    o[:, 1], o[:, 4, 0] = np.nan, np.nan
    out, out_lse = mlakit.merge_states(o, lse)
    for row in ((1, 0), (1, 1), (4, 0)):
        assert np.all(out[row] == 0) and out_lse[row] == np.inf, row
    check_stat(out_lse, formula(o, lse)[1])
    assert not np.isnan(out).any()


def test_a_nan_lse_makes_its_row_nan():
    o, lse = states(np.random.default_rng(4), 3, (5,), 8)
    lse[1, 2] = np.nan
    out, out_lse = mlakit.merge_states(o, lse)
    assert np.isnan(out[2]).all() and np.isnan(out_lse[2])
    rest = [0, 1, 3, 4]
    check_out(out[rest], formula(o, lse)[0][rest])


@pytest.mark.parametrize("lse_base,out_lse_base", [("2", "e"), ("e", "2"), ("2", None)])
def test_lse_bases(lse_base, out_lse_base):
    o, natural = states(np.random.default_rng(5), 4, (9, 3), 16)
    given = (natural / LN2).astype(np.float32) if lse_base == "2" else natural
    out, out_lse = mlakit.merge_states(o, given, lse_base=lse_base, out_lse_base=out_lse_base)
    want, want_lse = formula(o, given, lse_base, out_lse_base)
    check_rounded(out, want, "float32")
    check_stat(out_lse, want_lse)
    natural_out = mlakit.merge_states(o, natural)[1]  # the same merge in another base
    check_stat(out_lse * LN2 if (out_lse_base or lse_base) == "2" else out_lse, natural_out)


def test_stacked_and_list_forms_give_the_same_result():
    o, lse = states(np.random.default_rng(6), 4, (3, 5), 24, "bfloat16")
    stacked = mlakit.merge_states(o, lse)
    for form in (list, tuple):
        again = mlakit.merge_states(form(o), form(lse))
        for a, b in zip(stacked, again):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("stacked", [False, True])
def test_in_place_into_one_of_the_states(stacked):
    o, lse = states(np.random.default_rng(7), 3, (4, 6), 32, "float16")
    want, want_lse = mlakit.merge_states(o, lse)
    if stacked:
        o_arg, lse_arg, out, out_lse = o, lse, o[1], lse[1]
    else:  # separately allocated states of equal strides
        o_arg, lse_arg = [x.copy() for x in o], [x.copy() for x in lse]
        out, out_lse = o_arg[1], lse_arg[1]
    got, got_lse = mlakit.merge_states(o_arg, lse_arg, out, out_lse)
    assert got is out and got_lse is out_lse
    np.testing.assert_array_equal(out, want)
    np.testing.assert_array_equal(out_lse, want_lse)


def test_a_transposed_lse_view_in_and_out():
    """An engine's LSE [heads, tokens] passed as its [tokens, heads] view, no copy."""
    rng = np.random.default_rng(8)
    o, _ = states(rng, 3, (10, 4), 16, "bfloat16")
    heads_first = rng.normal(4.0, 3.0, (3, 4, 10)).astype(np.float32)
    out_lse = np.full((4, 10), np.nan, np.float32)
    _, got = mlakit.merge_states(o, heads_first.transpose(0, 2, 1), out_lse=out_lse.T)
    assert got.base is out_lse
    want, want_lse = formula(o, heads_first.transpose(0, 2, 1))
    check_stat(out_lse.T, want_lse)
    check_out(as_float(mlakit.merge_states(o, heads_first.transpose(0, 2, 1))[0]), want)


def test_ml_dtypes_bfloat16_arrays():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    o, lse = states(np.random.default_rng(9), 3, (5, 2), 16)
    bf16 = o.astype(ml_dtypes.bfloat16)
    out, _ = mlakit.merge_states(list(bf16), list(lse))
    assert out.dtype == ml_dtypes.bfloat16
    want = formula(bf16.astype(np.float64), lse)[0]
    check_rounded(out.astype(np.float64), want, "bfloat16")
    out32, _ = mlakit.merge_states(bf16, lse, np.empty((5, 2, 16), np.float32))
    check_rounded(out32, want, "float32")


def test_rows_of_no_elements():
    o, lse = states(np.random.default_rng(10), 2, (0, 4), 16)
    out, out_lse = mlakit.merge_states(o, lse)
    assert out.shape == (0, 4, 16) and out_lse.shape == (0, 4)


def test_the_docs_snippet_merges_decode_states():
    """docs/python.md, Merging partial states: its snippet, run on CPU tensors."""
    torch = pytest.importorskip("torch")
    import os

    path = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "python.md")
    with open(path) as f:
        code = f.read().split("\n## Merging partial states\n", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    o, lse = states(np.random.default_rng(12), 3, (2, 1, 4), 512, "bfloat16")
    scope = dict(mlakit=mlakit, out_all=torch.from_numpy(o.astype(np.int16)).view(torch.bfloat16),
                 lse_all=torch.from_numpy(lse).transpose(2, 3).contiguous())
    exec(code, scope)
    want, want_lse = formula(o, lse)
    check_out(scope["out"].double().numpy(), want)
    check_stat(scope["lse"].numpy(), want_lse.transpose(0, 2, 1))


class DeviceArray:
    """Stands for an array in device memory (DLPack device kDLCUDA): the place check runs
    before anything reads it."""

    def __init__(self, like):
        self.shape, self.dtype = like.shape, like.dtype

    def __dlpack__(self, stream=None):
        raise AssertionError("a device array was read")

    def __dlpack_device__(self):
        return (2, 0)


def _args():
    o, lse = states(np.random.default_rng(11), 3, (4, 2), 8)
    return dict(o=list(o), lse=list(lse))


def _replace(name, index, value):
    def change(args):
        args[name][index] = value(args[name][index])
    return change


def _set(name, value):
    def change(args):
        args[name] = value(args)
    return change


def _overlapping_out(args):
    """States as views of one stacked array, out straddling o[0] and o[1]."""
    stacked = np.stack(args["o"])
    args["o"] = list(stacked)
    args["out"] = stacked.reshape(-1)[4 : 4 + 64].reshape(4, 2, 8)


# (what is wrong, the change to valid arguments, the error, its message)
WRONG = [
    ("no states", _set("o", lambda a: []), ValueError, r"^merge_states: o: expected at least one state, got none"),
    ("no stacked states", _set("o", lambda a: np.stack(a["o"])[:0]), ValueError,
     r"^merge_states: o: expected at least one"),
    ("fewer lse", _set("lse", lambda a: a["lse"][:2]), ValueError,
     r"^merge_states: lse: expected 3 states \(one per state of o\), got 2"),
    ("a None state", _replace("o", 1, lambda x: None), TypeError,
     r"^merge_states: o\[1\]: expected an array .*got None"),
    ("rank 1 state", _replace("o", 2, lambda x: x[0, 0]), ValueError,
     r"^merge_states: o\[2\]: expected an array \[rows\.\.\., d\] of 2 to 4 dimensions, got shape \(8,\)"),
    ("rank 6 stack", _set("o", lambda a: np.stack(a["o"])[:, None, None, None]), ValueError,
     r"^merge_states: o: expected an array \[n, rows\.\.\., d\] of 3 to 5 dimensions, got shape \(3, 1, 1, 1, "),
    ("rank 4 lse", _replace("lse", 0, lambda x: x[None, None]), ValueError,
     r"^merge_states: lse\[0\]: expected an array \[rows\.\.\.\] of 1 to 3 dimensions"),
    ("another shape", _replace("o", 1, lambda x: np.zeros((4, 3, 8), x.dtype)), ValueError,
     r"merge_states: o\[1\]\.shape\[1\]: expected 2 .*got 3"),
    ("another lse shape", _replace("lse", 2, lambda x: x[:3]), ValueError,
     r"merge_states: lse\[2\]\.shape\[0\]: expected 4"),
    ("float64 o", _replace("o", 0, lambda x: x.astype(np.float64)), TypeError,
     r"^merge_states: o\[0\]: unsupported dtype"),
    ("int32 o", _replace("o", 0, lambda x: x.astype(np.int32)), ValueError, r"merge_states: o\[0\]\.dtype"),
    ("mixed dtypes", _replace("o", 1, lambda x: x.astype(np.float16)), ValueError, r"merge_states: o\[1\]"),
    ("float16 lse", _replace("lse", 1, lambda x: x.astype(np.float16)), ValueError, r"merge_states: lse\[1\]\.dtype"),
    ("int8 out", _set("out", lambda a: np.zeros((4, 2, 8), np.int8)), ValueError, r"merge_states: out\.dtype"),
    ("out of another shape", _set("out", lambda a: np.zeros((4, 2, 9), np.float32)), ValueError,
     r"merge_states: out\.shape\[2\]: expected 8"),
    ("read-only out", _set("out", lambda a: np.broadcast_to(np.float32(0), (4, 2, 8))), ValueError,
     r"^merge_states: out: expected a writable array"),
    ("out over two inputs", _overlapping_out, ValueError, r"merge_states: out: expected memory disjoint from o\[0\]"),
    ("bad base", _set("lse_base", lambda a: "natural"), ValueError,
     r"^merge_states: lse_base: expected 'e' or '2', got 'natural'"),
    ("bad out base", _set("out_lse_base", lambda a: 2), TypeError,
     r"^merge_states: out_lse_base: expected 'e' or '2', got int"),
    ("129 states", lambda a: a.update(o=a["o"] * 43, lse=a["lse"] * 43), ValueError,
     r"^merge_states: o: expected at most 128 states per call .*got 129"),
    ("a device lse", _replace("lse", 1, DeviceArray), ValueError,
     r"^merge_states: lse\[1\]: expected host memory \(o\[0\] is a host array\), got a device array"),
    ("device states, host lse", _set("o", lambda a: [DeviceArray(x) for x in a["o"]]), ValueError,
     r"^merge_states: lse\[0\]: expected device memory \(o\[0\] is a device array\), got a host array"),
]


@pytest.mark.parametrize("change,error,message", [w[1:] for w in WRONG], ids=[w[0] for w in WRONG])
def test_argument_errors_name_the_argument(change, error, message):
    args = _args()
    change(args)
    with pytest.raises(error, match=message):
        mlakit.merge_states(**args)


# ---- PyTorch CUDA tensors -------------------------------------------------------------------


@pytest.fixture
def torch():
    """PyTorch with a CUDA device and an mlakit built with CUDA, or the test is skipped."""
    torch = pytest.importorskip("torch")
    from torch_cases import require_gpu

    require_gpu()
    return torch


def cuda_states(torch, seed, n, rows, d, dtype, empties=True):
    """Random states on the GPU (float32 LSEs), a third of them empty (+-inf, NaN in their o)
    with `empties`, and every state of row 0 empty."""
    rng = np.random.default_rng(seed)
    o, lse = states(rng, n, rows, d)
    if empties:
        o, lse, _ = with_empty_states(rng, o, lse)
        lse.reshape(n, -1)[:, 0] = np.inf
    return torch.from_numpy(o).to(getattr(torch, dtype)).cuda(), torch.from_numpy(lse).cuda()


def host(t):
    return t.detach().double().cpu().numpy()


# MLA decode states (d 512), GQA's (d 128), and a d of single values (not 16-byte chunks).
CUDA_SHAPES = [(4, (3, 2, 16), 512), (2, (37, 8), 128), (5, (9,), 20)]


@pytest.mark.parametrize("n,rows,d", CUDA_SHAPES)
@pytest.mark.parametrize("out_dtype", DTYPES)
@pytest.mark.parametrize("in_dtype", DTYPES)
def test_cuda_matches_the_formula_within_the_accuracy_rules(torch, in_dtype, out_dtype, n, rows, d):
    o, lse = cuda_states(torch, n * d, n, rows, d, in_dtype)
    out = torch.full((*rows, d), math.nan, dtype=getattr(torch, out_dtype), device="cuda")
    got, got_lse = mlakit.merge_states(o, lse, out)
    want, want_lse = formula(host(o), host(lse))
    check_out(host(got), want)
    check_stat(host(got_lse), want_lse)


def test_cuda_bases_transposed_lse_in_place_and_nan_lse(torch):
    o, lse = cuda_states(torch, 1, 3, (6, 4), 128, "bfloat16")
    for lse_base, out_lse_base in (("2", "e"), ("e", "2")):
        given = lse / LN2 if lse_base == "2" else lse
        _, merged = mlakit.merge_states(o, given, lse_base=lse_base, out_lse_base=out_lse_base)
        check_stat(host(merged), formula(host(o), host(given), lse_base, out_lse_base)[1])
    want, want_lse = mlakit.merge_states(o, lse)
    heads_first = lse.transpose(1, 2).contiguous()  # [n, heads, tokens] memory, passed as its view
    out_lse = torch.empty((4, 6), device="cuda")
    mlakit.merge_states(o, heads_first.transpose(1, 2), out_lse=out_lse.T)
    assert torch.equal(out_lse.T, want_lse)
    mlakit.merge_states(o, lse, o[1], lse[1])
    assert torch.equal(o[1], want) and torch.equal(lse[1], want_lse)
    o, lse = cuda_states(torch, 1, 3, (6, 4), 128, "bfloat16", empties=False)
    lse[1, 2, 3] = math.nan
    got, got_lse = mlakit.merge_states(o, lse)
    assert torch.isnan(got[2, 3]).all() and torch.isnan(got_lse[2, 3])
    assert torch.isnan(got).sum() == 128 and torch.isnan(got_lse).sum() == 1


def test_cuda_repeated_calls_are_bitwise_identical(torch):
    o, lse = cuda_states(torch, 2, 8, (64, 16), 512, "bfloat16")
    first = mlakit.merge_states(o, lse)
    for _ in range(20):
        for a, b in zip(first, mlakit.merge_states(o, lse)):
            assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def test_cuda_graph_replays_the_merge_of_new_states(torch):
    from torch_cases import capture

    o, lse = cuda_states(torch, 3, 4, (32, 8), 128, "bfloat16")
    out = torch.empty((32, 8, 128), dtype=torch.bfloat16, device="cuda")
    out_lse = torch.empty((32, 8), device="cuda")
    graph, _ = capture(lambda: mlakit.merge_states(list(o), list(lse), out, out_lse))
    for seed in range(4, 7):
        new_o, new_lse = cuda_states(torch, seed, 4, (32, 8), 128, "bfloat16")
        o.copy_(new_o)
        lse.copy_(new_lse)
        graph.replay()
        want, want_lse = mlakit.merge_states(o, lse)
        assert torch.equal(out, want) and torch.equal(out_lse, want_lse), seed


def test_cuda_compiled_merge_has_no_graph_break_and_matches_eager(torch):
    """The merge of a context-parallel decode: gathered decode states [W, b, s_q, h_q, d] and
    their LSEs [W, b, h_q, s_q], the LSE passed as a view, through torch.ops.mlakit."""
    import mlakit.torch_ops  # noqa: F401  (registers the ops)

    o, lse = cuda_states(torch, 8, 3, (4, 1, 16), 512, "bfloat16")
    gathered_lse = lse.transpose(2, 3).contiguous()  # the decode's [W, b, h_q, s_q]

    def step(o, gathered_lse):
        out, out_lse = torch.ops.mlakit.merge_states(list(o), list(gathered_lse.transpose(2, 3)), "e",
                                                     "e")
        return out * 2, out_lse.transpose(1, 2)

    eager = step(o, gathered_lse)
    explained = torch._dynamo.explain(step)(o, gathered_lse)
    assert explained.graph_break_count == 0, explained.break_reasons
    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True)(o, gathered_lse)
    for a, b in zip(eager, compiled):
        assert torch.equal(a.nan_to_num(), b.nan_to_num())
