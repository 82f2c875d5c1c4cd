"""The run's outputs: JSON lines (one per case, each complete on its own: the run's header
fields repeated) appended to <out_dir>/<gpu>-compare.jsonl, and the table printed last."""

from __future__ import annotations

import datetime
import json
import math
import os
import subprocess
from typing import Any, Dict, Iterable, List, Optional

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TABLE_MARK = "== side by side =="
SIDE_LABELS = {"flashmla": "FlashMLA", "mlakit": "mlakit", "mlakit_deterministic": "mlakit-det",
               "mlakit_sm90": "mlakit-sm90", "mlakit_sm90_deterministic": "mlakit-sm90-det", "sdpa_cudnn": "cuDNN",
               "sdpa_flash": "SDPA-flash", "torch": "PyTorch"}


def commit() -> str:
    """MLAKIT_COMMIT (the GPU script passes it: git metadata on the GPU machine can be stale), else git."""
    if os.environ.get("MLAKIT_COMMIT"):
        return os.environ["MLAKIT_COMMIT"]
    try:
        out = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
        return out.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def run_id() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def jsonl_path(out_dir: str, gpu_name: str) -> str:
    return os.path.join(out_dir, gpu_name.replace(" ", "_") + "-compare.jsonl")


def _clean(value: Any) -> Any:
    """JSON has no NaN / inf: null instead."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def append(path: str, header: Dict[str, Any], records: Iterable[Dict[str, Any]]) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "a") as f:
        for rec in records:
            f.write(json.dumps(_clean(dict(header, **rec)), sort_keys=False) + "\n")


def read(path: str) -> List[Dict[str, Any]]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def add_ceiling_fractions(rec: Dict[str, Any], ceilings: Dict[str, Any]) -> None:
    """Each timed side's GB/s as a fraction of the run's copy ceiling (`copy_fraction`): how
    close a memory-bound operation comes to the bandwidth a plain copy gets."""
    copy = (ceilings or {}).get("copy_gbps")
    for side in rec.get("sides", {}).values():
        if copy and side.get("gbps") is not None:
            side["copy_fraction"] = side["gbps"] / copy


def bandwidth_line(rec: Dict[str, Any]) -> Optional[str]:
    """'GB/s ... tokens/s ...' per side, for the cases that count tokens (the GQA decode)."""
    parts = []
    for name, side in rec.get("sides", {}).items():
        if side.get("gbps") is None or side.get("tokens_per_s") is None:
            continue
        ceiling = f", {side['copy_fraction']:.2f} of copy" if side.get("copy_fraction") is not None else ""
        parts.append(f"{SIDE_LABELS.get(name, name)} {side['gbps']:.0f} GB/s{ceiling}, "
                     f"{side['tokens_per_s'] / 1e6:.3g}M tokens/s")
    return "    " + "; ".join(parts) if parts else None


def unsupported(side: Dict[str, Any]) -> Optional[str]:
    """Why a side could not run the case (sides.SideUnsupported), or None. The run loop records
    it as check {"ok": true, "unsupported": why}; a run loop that does not know the exception
    yet records it as a failed check whose error names it, read here alike."""
    check = side.get("check", {})
    if check.get("unsupported"):
        return check["unsupported"]
    error = check.get("error", "")
    return error[len("SideUnsupported: "):] if error.startswith("SideUnsupported: ") else None


def other_sides_line(rec: Dict[str, Any]) -> Optional[str]:
    """The sides besides the baseline and the subject (the MHA prefill's SDPA flash backend, the
    backward's mlakit_deterministic and mlakit_sm90): sustained us, their ratios to the subject
    (t_side / t_subject: for mlakit-det, the deterministic mode's cost) and the baseline's
    ratio to them (t_baseline / t_side, as the table's ratio column)."""
    parts = []
    base = rec.get("sides", {}).get(rec["baseline"], {}).get("sustained_us")
    for name, side in rec.get("sides", {}).items():
        if name in (rec["baseline"], rec["subject"]) or side.get("sustained_us") is None:
            continue  # not timed: its check or not-supported line says why
        r = rec.get("ratios", {}).get(name, {})
        vs_base = _x(base / side["sustained_us"]) if base else "-"
        parts.append(f"{SIDE_LABELS.get(name, name)} {_side_cell(rec, name, 'sustained_us', _us)} us, ratio "
                     f"{_x(r.get('sustained'))} (idle {_x(r.get('idle'))}, kernel {_x(r.get('kernel'))}), "
                     f"main {_side_cell(rec, name, 'kernel_main_us', _us)} us, "
                     f"{SIDE_LABELS.get(rec['baseline'], rec['baseline'])} / it {vs_base}")
    return "    " + "; ".join(parts) if parts else None


def _us(value: Optional[float]) -> str:
    return "-" if value is None else (f"{value:.1f}" if value < 1000 else f"{value:.0f}")


def _x(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.3f}"


def _whole(value: Optional[float]) -> str:
    """MHz, watts: whole numbers."""
    return "-" if value is None else f"{value:.0f}"


def _side_cell(rec: Dict[str, Any], name: str, key: str, fmt) -> str:
    side = rec["sides"].get(name)
    if side is None:
        return "n/a"
    if unsupported(side):
        return "n/s"  # not supported: the table's line below says why
    failed = not side.get("check", {}).get("ok", False)
    if side.get(key) is None:
        return "FAILED" if failed else "-"
    return fmt(side.get(key)) + ("*" if failed else "")  # *: timed, but missed its check


def table(header: Dict[str, Any], records: List[Dict[str, Any]]) -> str:
    """Per case: baseline and subject sustained us, the ratios (sustained, idle-pause,
    kernel-only), kernel-only main us, the SM clock and the mean board power of each side."""
    c = header["ceilings"]
    ceiling = (f"copy {c['copy_gbps']:.0f} GB/s, bf16 matmul {c['matmul_tflops']:.0f} TFLOP/s" if c
               else "ceilings not measured")
    lines = [
        f"{header['gpu']} (driver {header['driver']}), mlakit {header['commit']}, run {header['run_id']}; {ceiling}",
        "ratio = t_baseline / t_subject (> 1: the subject, mlakit, is faster); sustained = do_bench, "
        f"{header['options']['rep_ms']} ms, L2 flushed; decode: schedule reused across calls",
        "",
        f"{'case':54s} {'base':>9s} {'base us':>8s} {'subj us':>8s} {'ratio':>6s} {'idle':>6s} {'kernel':>6s} "
        f"{'main b/s us':>15s} {'MHz b/s':>10s} {'W b/s':>8s}",
    ]
    for rec in records:
        base, subj = rec["baseline"], rec["subject"]
        if rec.get("error"):
            lines.append(f"{rec['case']:54s} ERROR {rec['error'][:100]}")
            continue
        main = f"{_side_cell(rec, base, 'kernel_main_us', _us)}/{_side_cell(rec, subj, 'kernel_main_us', _us)}"
        mhz = f"{_side_cell(rec, base, 'mhz', _whole)}/{_side_cell(rec, subj, 'mhz', _whole)}"
        watts = f"{_side_cell(rec, base, 'watts', _whole)}/{_side_cell(rec, subj, 'watts', _whole)}"
        times = f"{_side_cell(rec, base, 'sustained_us', _us):>8s} {_side_cell(rec, subj, 'sustained_us', _us):>8s}"
        ratios = " ".join(f"{_x(rec.get(k)):>6s}" for k in ("ratio", "ratio_idle", "ratio_kernel"))
        lines.append(f"{rec['case']:54s} {SIDE_LABELS.get(base, base):>9s} {times} {ratios} {main:>15s} {mhz:>10s} {watts:>8s}")
        for extra in (bandwidth_line(rec), other_sides_line(rec)):
            if extra:
                lines.append(extra)
        for name, side in rec["sides"].items():
            check = side.get("check", {})
            if unsupported(side):
                lines.append(f"    {name} not supported (n/s): {unsupported(side)[:300]}")
            elif not check.get("ok", False):
                lines.append(f"    {name} failed its check (figures marked *): {_failure(check)}")
    return "\n".join(lines)


def progress(rec: Dict[str, Any]) -> str:
    """One line per case as the run goes."""
    if rec.get("error"):
        return f"{rec['case']}: ERROR {rec['error']}"
    parts = []
    for name, side in rec["sides"].items():
        if unsupported(side):
            parts.append(f"{name} not supported")
            continue
        state = "" if side.get("check", {}).get("ok") else " (check FAILED)"
        parts.append(f"{name} {_us(side.get('sustained_us'))} us{state}")
    return f"{rec['case']}: {', '.join(parts)}; ratio {_x(rec.get('ratio'))} (idle {_x(rec.get('ratio_idle'))})"


def _failure(check: Dict[str, Any]) -> str:
    if "error" in check:
        return check["error"][:300]
    parts = []
    for name, one in check.items():
        if isinstance(one, dict) and not one.get("ok", True):
            parts.append(f"{name}: " + ", ".join(f"{k}={v}" for k, v in one.items() if k != "ok"))
    return "; ".join(parts)
