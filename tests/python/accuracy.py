"""The accuracy rules of docs/contract.md on NumPy arrays (shared by the CPU and GPU tests; GPU results
are compared after .cpu()). The reference is float64 and unrounded."""

import numpy as np


def _same_specials(actual, expected, name):
    assert not np.isnan(actual).any(), f"{name}: NaN in the result"
    for special in (np.inf, -np.inf):
        assert np.array_equal(actual == special, expected == special), f"{name}: {special} at other positions"


def check_out(actual, expected, name="out"):
    """bf16/fp16 outputs: |a - e| <= max(1e-3, 2/128 |e|) everywhere, and the cosine
    difference 1 - 2<a,e>/(|a|^2 + |e|^2) <= 5e-6 over the whole tensor."""
    a = np.asarray(actual, dtype=np.float64)
    e = np.asarray(expected, dtype=np.float64)
    assert a.shape == e.shape, f"{name}: shape {a.shape}, expected {e.shape}"
    _same_specials(a, e, name)
    err = np.abs(a - e)
    bad = err > np.maximum(1e-3, 2 / 128 * np.abs(e))
    assert not bad.any(), f"{name}: {bad.sum()} elements out of tolerance, worst error {err.max():.3g}"
    norms = (a * a).sum() + (e * e).sum()
    if norms > 0:
        cos_diff = 1 - 2 * (a * e).sum() / norms
        assert cos_diff <= 5e-6, f"{name}: cosine difference {cos_diff:.3g} > 5e-6"


def check_stat(actual, expected, name="lse"):
    """LSE and max_logits: |a - e| <= max(1e-6, 8/65536 |e|) where finite; infinities at the
    same positions; no NaN."""
    a = np.asarray(actual, dtype=np.float64)
    e = np.asarray(expected, dtype=np.float64)
    assert a.shape == e.shape, f"{name}: shape {a.shape}, expected {e.shape}"
    _same_specials(a, e, name)
    finite = np.isfinite(e)
    err = np.abs(a[finite] - e[finite])
    bad = err > np.maximum(1e-6, 8 / 65536 * np.abs(e[finite]))
    assert not bad.any(), f"{name}: {bad.sum()} values out of tolerance, worst error {err.max():.3g}"
