"""mlakit: multi-head latent attention (MLA) and GQA decode kernels for LLM serving, over
DLPack arrays.

Arrays may come from NumPy, PyTorch or CuPy. Host arrays run the float64 CPU reference;
device arrays run the GPU kernels on the caller's current stream (for PyTorch,
``torch.cuda.current_stream()``). Outputs and workspaces are allocated by the framework the
inputs come from, after the arguments they depend on are checked. Invalid arguments raise
``TypeError`` (not an array, a scalar of the wrong type) or ``ValueError`` (wrong rank, and
the library's checks), naming the function, the argument, the expected and the actual value.
Empty inputs (b, s_q or h_q of 0) give empty outputs.

NumPy has no bfloat16: pass ``ml_dtypes.bfloat16`` arrays, or uint16 arrays of bfloat16 bit
patterns. ``mlakit.flash_mla`` is a drop-in for FlashMLA's Python API; ``mlakit.torch_ops``
registers the operations as PyTorch custom ops (``torch.ops.mlakit.*``) for ``torch.compile``.
The dense prefill (``mha_prefill``, ``mha_prefill_backward``) is differentiable on PyTorch
tensors that require grad (through ``torch.ops.mlakit.mha_prefill``'s autograd formula).
"""

from __future__ import annotations

import sys as _sys

from ._decode import MlaDecodePlan, mla_decode, mla_decode_plan
from ._fp8_cache import (
    append_fp8_cache,
    append_fp8_v4_cache,
    dequantize_fp8_cache,
    dequantize_fp8_v4_cache,
    quantize_fp8_cache,
    quantize_fp8_v4_cache,
)
from ._gqa_cache import dequantize_gqa_cache, gqa_cache_append, quantize_gqa_cache
from ._gqa_decode import GqaDecodePlan, gqa_decode, gqa_decode_plan
from ._merge import merge_states
from ._mha_prefill import mha_prefill, mha_prefill_backward
from ._sparse_decode import mla_sparse_decode, mla_sparse_decode_plan
from ._sparse_prefill import mla_sparse_prefill

if "torch" in _sys.modules:  # register torch.ops.mlakit.* (import mlakit.torch_ops to do it later)
    from . import torch_ops  # noqa: F401

__all__ = [
    "MlaDecodePlan",
    "mla_decode",
    "mla_decode_plan",
    "mla_sparse_decode",
    "mla_sparse_decode_plan",
    "mla_sparse_prefill",
    "quantize_fp8_cache",
    "dequantize_fp8_cache",
    "append_fp8_cache",
    "quantize_fp8_v4_cache",
    "dequantize_fp8_v4_cache",
    "append_fp8_v4_cache",
    "GqaDecodePlan",
    "gqa_decode",
    "gqa_decode_plan",
    "quantize_gqa_cache",
    "dequantize_gqa_cache",
    "gqa_cache_append",
    "mha_prefill",
    "mha_prefill_backward",
    "merge_states",
]
