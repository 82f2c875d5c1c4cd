"""How each side is loaded and called.

mlakit and FlashMLA are called through the same function with literally the same
arguments: mlakit through its drop-in `mlakit.flash_mla`, FlashMLA through its `flash_mla`
package. The decode schedule is made by the first call of a step and reused by the others
(`get_mla_metadata()` objects, as an engine reuses one per layer); `fresh` makes a new one
per call (plan + decode). The SDPA sides pin one PyTorch backend each.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import os
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import torch

from .cases import SIDES
from .data import D_V, Inputs


class SideUnavailable(RuntimeError):
    """A side asked for that cannot be imported; the message says how to provide it."""


@dataclasses.dataclass
class Runner:
    side: str
    call: Callable[[], Any]  # the timed call: one layer, schedule reused
    fresh: Optional[Callable[[], Any]]  # plan + call, where the operation has a plan
    names: Tuple[str, ...]  # names of the call's outputs, in order

    def outputs(self, result: Any) -> Dict[str, torch.Tensor]:
        return dict(zip(self.names, result))


def _load_mlakit() -> Any:
    try:
        return importlib.import_module("mlakit.flash_mla")
    except ImportError as e:
        raise SideUnavailable(
            f"mlakit: cannot import mlakit.flash_mla ({e}); put the built package on the path "
            "(PYTHONPATH=build-gpu/python or --mlakit-path)"
        ) from e


def _load_flashmla() -> Any:
    try:
        module = importlib.import_module("flash_mla")
    except ImportError as e:
        raise SideUnavailable(
            f"flashmla: cannot import flash_mla ({e}); copy ../shared/baselines/flashmla to .baselines/, "
            "decompress flash_mla/cuda.cpython-312-x86_64-linux-gnu.so.xz with `xz -dk`, and put "
            ".baselines/flashmla on PYTHONPATH (or --flashmla-path)"
        ) from e
    if getattr(module, "MLAKIT_ALIAS", False) or importlib.util.find_spec("flash_mla.cuda") is None:
        raise SideUnavailable(
            f"flashmla: the flash_mla found at {os.path.dirname(module.__file__)} is not FlashMLA's build "
            "(mlakit's alias package, or no compiled flash_mla.cuda extension: was the .so.xz decompressed?)"
        )
    return module


def _load_sdpa(side: str) -> Any:
    from torch.nn.attention import SDPBackend

    return {"sdpa_cudnn": SDPBackend.CUDNN_ATTENTION, "sdpa_flash": SDPBackend.FLASH_ATTENTION}[side]


def load(names: Sequence[str]) -> Dict[str, Any]:
    """Handles of the named sides (modules or SDPA backends); SideUnavailable if one is missing."""
    handles = {}
    for name in names:
        if name not in SIDES:
            raise ValueError(f"unknown side {name!r}: expected one of {SIDES}")
        if name == "mlakit":
            handles[name] = _load_mlakit()
        elif name == "flashmla":
            handles[name] = _load_flashmla()
        else:
            handles[name] = _load_sdpa(name)
    return handles


def describe(handles: Dict[str, Any]) -> Dict[str, str]:
    """Where each side came from, for the JSON lines."""
    out = {}
    for name, handle in handles.items():
        if name in ("mlakit", "flashmla"):
            package = importlib.import_module(handle.__name__.split(".")[0])
            version = getattr(package, "__version__", "?")
            out[name] = f"{package.__name__} {version} from {os.path.dirname(os.path.abspath(package.__file__))}"
        else:
            out[name] = f"torch {torch.__version__} SDPA {handle}"
    return out


def flash_api_runner(side: str, api: Any, family: str, x: Inputs) -> Runner:
    """mlakit.flash_mla or flash_mla, called the same way."""
    t = x.tensors
    if family == "dense_decode":
        def run(meta: Any) -> Any:
            return api.flash_mla_with_kvcache(
                t["q"], t["k_cache"], t["block_table"], t["cache_seqlens"], D_V, meta, None, causal=t["causal"]
            )
    elif family == "sparse_decode":
        def run(meta: Any) -> Any:
            return api.flash_mla_with_kvcache(
                t["q"], t["k_cache"], None, None, D_V, meta, None, is_fp8_kvcache=True, indices=t["indices"]
            )
    elif family == "sparse_prefill":
        def call() -> Any:
            return api.flash_mla_sparse_fwd(t["q"], t["kv"], t["indices"], t["sm_scale"], D_V)

        return Runner(side, call, None, ("out", "max_logits", "lse"))
    else:
        raise NotImplementedError(f"{side}: no {family} operation")

    step_meta, _ = api.get_mla_metadata()
    return Runner(
        side, lambda: run(step_meta), lambda: run(api.get_mla_metadata()[0]), ("out", "lse")
    )


def sdpa_runner(side: str, backend: Any, family: str, x: Inputs) -> Runner:
    """torch SDPA with one backend pinned (an unavailable backend raises at the call)."""
    from torch.nn.attention import sdpa_kernel

    if family != "sdpa_mha":
        raise NotImplementedError(f"{side}: no {family} operation")
    t = x.tensors

    def call() -> Any:
        with sdpa_kernel([backend]):
            return (torch.nn.functional.scaled_dot_product_attention(t["q"], t["k"], t["v"], is_causal=t["causal"]),)

    return Runner(side, call, None, ("out",))


def runner(side: str, handle: Any, family: str, x: Inputs) -> Runner:
    if side in ("mlakit", "flashmla"):
        return flash_api_runner(side, handle, family, x)
    return sdpa_runner(side, handle, family, x)
