"""The three figures of a side's call.

- sustained (the headline): `triton.testing.do_bench`, continuous repetition for `rep_ms`
  with a 256 MB buffer zeroed before every repetition (L2 flushed), median; the GPU never
  idles, as in a serving engine's layer loop.
- idle-pause: `pause_s` of sleep, then a few calls timed with CUDA events, each after an L2
  flush and a synchronisation: the GPU comes back from idle (clock and power state) for
  each side alike.
- kernel-only: torch.profiler over a few calls, every kernel's device time summed by name
  and per call, bucketed into plan (names with plan / metadata / sched), combine (combine)
  and main (the rest); memsets and copies go to `other`.
"""

from __future__ import annotations

import re
import statistics
import time
from collections import defaultdict
from typing import Any, Callable, Dict, List

import torch

FLUSH_BYTES = 256 << 20
PLAN_NAMES = re.compile(r"plan|metadata|sched", re.IGNORECASE)
COMBINE_NAMES = re.compile(r"combine", re.IGNORECASE)
COPY_NAMES = re.compile(r"^(Memset|Memcpy)", re.IGNORECASE)


def sustained_us(fn: Callable[[], Any], warmup_ms: int, rep_ms: int) -> float:
    try:
        import triton.testing
    except ImportError as e:
        raise RuntimeError(f"triton is needed for the sustained figure (triton.testing.do_bench): {e}") from e
    return 1e3 * triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median")


class Flush:
    """An L2 flush whose kernel is recognisable in a profile: bitwise-not of an int8 buffer
    (no side launches that), excluded from the kernel-only sums by its exact name."""

    def __init__(self) -> None:
        self.buffer = torch.empty(FLUSH_BYTES, dtype=torch.int8, device="cuda")
        self.names = self._names()

    def __call__(self) -> None:
        torch.bitwise_not(self.buffer, out=self.buffer)

    def _names(self) -> set:
        self()
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            self()
            torch.cuda.synchronize()
        return {e.name for e in _device_events(prof)}


def idle_us(fn: Callable[[], Any], flush: Flush, pause_s: float, runs: int) -> List[float]:
    times = []
    time.sleep(pause_s)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(runs):
        flush()
        torch.cuda.synchronize()
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(1e3 * start.elapsed_time(end))
    return times


def _device_events(prof: Any) -> List[Any]:
    return [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


def short_name(raw: str) -> str:
    """`void ns::kernel_name<...>(...)` -> `kernel_name`."""
    if COPY_NAMES.search(raw):
        return raw
    # "(anonymous namespace)::" is part of the scope, not the start of the argument list.
    name = raw.replace("(anonymous namespace)::", "").split("(")[0]
    depth, kept = 0, []
    for ch in name:  # drop template arguments
        depth += ch == "<"
        if depth == 0:
            kept.append(ch)
        depth -= ch == ">"
    name = "".join(kept).strip()
    return name.split()[-1].split("::")[-1] if name else raw


def bucket(name: str) -> str:
    if COPY_NAMES.search(name):
        return "other"
    if PLAN_NAMES.search(name):
        return "plan"
    if COMBINE_NAMES.search(name):
        return "combine"
    return "main"


def kernel_us(fn: Callable[[], Any], flush: Flush, calls: int) -> Dict[str, Any]:
    """Per call: {'plan', 'main', 'combine', 'other', 'total'} in us, and per kernel name."""
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            flush()
            fn()
        torch.cuda.synchronize()
    per_name: Dict[str, float] = defaultdict(float)
    raw_names = set()
    for event in _device_events(prof):
        if event.name in flush.names or "bitwise_not" in event.name:
            continue
        per_name[short_name(event.name)] += event.time_range.elapsed_us() / calls
        raw_names.add(event.name)
    buckets = {key: 0.0 for key in ("plan", "main", "combine", "other")}
    for name, us in per_name.items():
        buckets[bucket(name)] += us
    buckets["total"] = sum(buckets.values())
    return dict(buckets, kernels=dict(per_name), raw_names=sorted(raw_names))


def host_us(fn: Callable[[], Any], calls: int = 20) -> float:
    """Host time of one call, launches only (no synchronisation inside the loop): above the
    device time, the sustained figure would time the host instead of the kernels."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return 1e6 * elapsed / calls


def median(values: List[float]) -> float:
    return statistics.median(values) if values else float("nan")
