"""One case, side by side: the same inputs to every side, each side checked against the
reference before it is timed (a side that fails is reported, not timed), then R rounds in
which the sides alternate, in the family's order in even rounds and reversed in odd ones.
Within a round: every side's sustained figure (SM clock sampled during it and read right
after), then every side's idle-pause figure, then every side's kernel-only profile."""

from __future__ import annotations

import gc
from typing import Any, Callable, Dict, List, Optional

import torch

from . import data, gpu, reference, sides, timing
from .cases import FAMILIES, Case

SCHEDULE_NOTE = "reused: the step's first call makes the schedule, the timed per-layer calls reuse it"


class CudaMeasure:
    """The measurements on the GPU (selftest substitutes wall-clock ones on the CPU)."""

    def __init__(self, opts: Any) -> None:
        self.opts = opts
        self.flush = timing.Flush()

    def sync(self) -> None:
        torch.cuda.synchronize()

    def sustained(self, fn: Callable[[], Any], rep_ms: Optional[int] = None) -> float:
        return timing.sustained_us(fn, self.opts.warmup_ms, rep_ms or self.opts.rep_ms)

    def idle(self, fn: Callable[[], Any]) -> List[float]:
        return timing.idle_us(fn, self.flush, self.opts.pause_s, self.opts.idle_runs)

    def kernels(self, fn: Callable[[], Any]) -> Dict[str, Any]:
        return timing.kernel_us(fn, self.flush, self.opts.profile_calls)

    def host(self, fn: Callable[[], Any]) -> float:
        return timing.host_us(fn)

    def clock(self) -> gpu.ClockSampler:
        return gpu.ClockSampler()

    def clock_now(self) -> Optional[float]:
        return gpu.sm_clock_mhz()


def _median(values: List[Optional[float]]) -> Optional[float]:
    kept = [v for v in values if v is not None]
    return timing.median(kept) if kept else None


def _check_sides(case: Case, handles: Dict[str, Any], x: data.Inputs, measure: Any, opts: Any, rec: Dict[str, Any]):
    """Each side's outputs against the reference; the runners of the sides that pass."""
    family = FAMILIES[case.family]
    ref = reference.REFERENCES[case.family](x)
    runners, outputs = {}, {}
    for name in [s for s in family.every_side if s in handles]:
        side = rec["sides"].setdefault(name, {})
        try:
            runner = sides.runner(name, handles[name], case.family, x)
            runner.call()  # the step's first call: makes the schedule the timed calls reuse
            outputs[name] = runner.outputs(runner.call())
            measure.sync()
            side["check"] = reference.check(case.family, outputs[name], ref)
        except sides.SideUnsupported as e:  # this side cannot run this case: said so, not timed, not a failure
            side["check"] = {"ok": True, "unsupported": str(e)}
            continue
        except Exception as e:  # reported in the line and the table; the other sides go on
            side["check"] = {"ok": False, "error": f"{type(e).__name__}: {e}"}
            continue
        # The baseline is timed even when it misses the accuracy rules (its accuracy is reported, the
        # comparison still stands); mlakit only when it passes, or with --time-failed.
        if side["check"]["ok"] or name == family.baseline or getattr(opts, "time_failed", False):
            runners[name] = runner
    if family.baseline in outputs and family.subject in outputs:
        rec["cross"] = reference.cross(outputs[family.baseline], outputs[family.subject])
    return runners


def _round(rnd: int, order: List[str], runners: Dict[str, Any], measure: Any, opts: Any) -> Dict[str, Dict]:
    seq = order if rnd % 2 == 0 else order[::-1]
    entries = {name: {"round": rnd, "position": i} for i, name in enumerate(seq)}
    for name in seq:
        with measure.clock() as clock:
            entries[name]["sustained_us"] = measure.sustained(runners[name].call)
        entries[name]["mhz_during"] = clock.median
        entries[name]["watts_during"] = clock.watts
        entries[name]["mhz_after"] = measure.clock_now()
    if opts.idle:
        for name in seq:
            times = measure.idle(runners[name].call)
            entries[name].update(idle_us=times, idle_median_us=timing.median(times), idle_mhz_after=measure.clock_now())
    if opts.profile:
        for name in seq:
            entries[name]["kernel_us"] = measure.kernels(runners[name].call)
    return entries


def _summarise(side: Dict[str, Any], runner: Any, x: data.Inputs, measure: Any, opts: Any) -> None:
    rounds = side["rounds"]
    side["sustained_us"] = _median([r["sustained_us"] for r in rounds])
    side["idle_us"] = _median([r.get("idle_median_us") for r in rounds])
    side["kernel_main_us"] = _median([r["kernel_us"]["main"] for r in rounds if "kernel_us" in r])
    side["kernel_total_us"] = _median([r["kernel_us"]["total"] for r in rounds if "kernel_us" in r])
    side["mhz"] = _median([r["mhz_during"] or r["mhz_after"] for r in rounds])
    side["watts"] = _median([r.get("watts_during") for r in rounds])
    seconds = side["sustained_us"] * 1e-6
    # Energy per call at the sustained rate (the board's, so idle and other draw included).
    side["mj_per_call"] = side["watts"] * seconds * 1e3 if side["watts"] is not None else None
    side["tflops"] = x.info["flops"] / seconds / 1e12
    # Bytes this side reads (a quantized cache's side reads fewer than SDPA's bf16 copy).
    side["gbps"] = x.info.get("side_bytes", {}).get(runner.side, x.info["bytes"]) / seconds / 1e9
    if "tokens" in x.info:
        side["tokens_per_s"] = x.info["tokens"] / seconds
    names = sorted({n for r in rounds if "kernel_us" in r for n in r["kernel_us"].pop("raw_names")})
    side["kernel_raw_names"] = names  # once per side: templated names are long
    side["host_us"] = measure.host(runner.call)
    if opts.fresh and runner.fresh is not None:
        with measure.clock() as clock:
            side["fresh_us"] = measure.sustained(runner.fresh, max(50, opts.rep_ms // 4))
        side["fresh_mhz"] = clock.median
        if opts.profile:
            side["fresh_kernel_us"] = measure.kernels(runner.fresh)


def _ratios(rec: Dict[str, Any], subject: str) -> None:
    """t_side / t_subject per round (the same round's figures), median over rounds."""
    timed = {n: s for n, s in rec["sides"].items() if s.get("rounds")}
    rec["ratios"] = {}
    if subject not in timed:
        return
    mine = timed[subject]["rounds"]
    for name, side in timed.items():
        if name == subject:
            continue
        per_round = {"sustained": [], "idle": [], "kernel": []}
        for theirs, ours in zip(side["rounds"], mine):
            per_round["sustained"].append(theirs["sustained_us"] / ours["sustained_us"])
            if "idle_median_us" in theirs:
                per_round["idle"].append(theirs["idle_median_us"] / ours["idle_median_us"])
            if "kernel_us" in theirs and ours["kernel_us"]["total"] > 0:
                per_round["kernel"].append(theirs["kernel_us"]["total"] / ours["kernel_us"]["total"])
        rec["ratios"][name] = {k: _median(v) for k, v in per_round.items()}
        rec["ratios"][name]["per_round"] = per_round["sustained"]


def run_case(case: Case, handles: Dict[str, Any], opts: Any, measure: Any, device: str = "cuda") -> Dict[str, Any]:
    family = FAMILIES[case.family]
    rec: Dict[str, Any] = dict(
        case=case.name, family=case.family, op=family.label, params=dict(case.params),
        baseline=family.baseline, subject=family.subject, sides={},
        schedule=SCHEDULE_NOTE if case.family.endswith("_decode") or case.family == "gqa" else "none",
    )
    x = None
    try:
        x = data.generate(case, opts.seed, device)
        rec.update({k: x.info[k] for k in ("seed", "mean_s_k", "flops", "bytes", "side_bytes", "tokens")
                    if k in x.info})
        runners = _check_sides(case, handles, x, measure, opts, rec)
        gc.collect()  # the checked outputs and the reference
        order = [name for name in family.every_side if name in runners]
        for name in order:
            rec["sides"][name]["rounds"] = []
        for rnd in range(opts.rounds):
            for name, entry in _round(rnd, order, runners, measure, opts).items():
                rec["sides"][name]["rounds"].append(entry)
        for name in order:
            _summarise(rec["sides"][name], runners[name], x, measure, opts)
        _ratios(rec, family.subject)
    except Exception as e:  # e.g. out of memory: the case is reported, the run goes on
        rec["error"] = f"{type(e).__name__}: {e}"
    finally:
        del x
        runners = None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    base = rec.get("ratios", {}).get(family.baseline, {})
    rec["ratio"], rec["ratio_idle"], rec["ratio_kernel"] = base.get("sustained"), base.get("idle"), base.get("kernel")
    return rec
