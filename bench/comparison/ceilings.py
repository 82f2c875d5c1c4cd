"""The ceilings of the run, measured the way the sides are (do_bench, sustained, L2 flushed):
device-to-device copy of 4 GiB (bytes read + written per second) and the 8192^3 bf16
matmul (torch.matmul, TFLOP/s)."""

from __future__ import annotations

from typing import Dict

import torch

from . import gpu, timing

COPY_BYTES = 4 << 30
MATMUL_N = 8192


def _copy_us(warmup_ms: int, rep_ms: int) -> tuple:
    src = torch.empty(COPY_BYTES // 2, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    with gpu.ClockSampler() as clock:
        us = timing.sustained_us(lambda: dst.copy_(src), warmup_ms, rep_ms)
    return us, clock.median


def _matmul_us(warmup_ms: int, rep_ms: int) -> tuple:
    a = torch.randn(MATMUL_N, MATMUL_N, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(MATMUL_N, MATMUL_N, dtype=torch.bfloat16, device="cuda")
    with gpu.ClockSampler() as clock:
        us = timing.sustained_us(lambda: torch.matmul(a, b), warmup_ms, rep_ms)
    return us, clock.median


def measure(warmup_ms: int, rep_ms: int) -> Dict[str, float]:
    copy_us, copy_mhz = _copy_us(warmup_ms, rep_ms)
    matmul_us, matmul_mhz = _matmul_us(warmup_ms, rep_ms)
    torch.cuda.empty_cache()
    return dict(
        copy_gbps=2 * COPY_BYTES / (copy_us * 1e-6) / 1e9,
        copy_us=copy_us,
        copy_mhz=copy_mhz,
        matmul_tflops=2 * MATMUL_N**3 / (matmul_us * 1e-6) / 1e12,
        matmul_us=matmul_us,
        matmul_mhz=matmul_mhz,
    )
