"""The PNG of a GPU's compare JSONL: per case, the ratio t_baseline / t_mlakit against the
1.0 line, cases grouped and coloured by operation, one marker shape per run (filled: the
sustained headline; hollow: the idle-pause figure). Needs matplotlib only (no GPU)."""

from __future__ import annotations

import os
import re
from typing import Any, Dict, List

from .cases import FAMILIES
from .report import SIDE_LABELS, read

MARKERS = "osD^vPX*<>"
COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf"]


def _label(case: str, family: str) -> str:
    """`dense_b128_hq128_sq1_sk32768` -> `b128 hq128 sq1 sk32k` (the family is the band)."""
    for prefix in (family + "_", family.split("_")[0] + "_"):
        if case.startswith(prefix):
            case = case[len(prefix) :]
            break
    case = re.sub(r"(?<=[a-z])(\d+)", lambda m: _kilo(int(m.group(1))), case)
    return case.replace("_", " ")


def _kilo(n: int) -> str:
    return f"{n // 1024}k" if n >= 4096 and n % 1024 == 0 else str(n)


def _order(records: List[Dict[str, Any]]) -> List[tuple]:
    """(family, case) in family order, then order of first appearance."""
    families = list(FAMILIES) + sorted({r["family"] for r in records} - set(FAMILIES))
    seen: Dict[tuple, int] = {}
    for r in records:
        seen.setdefault((r["family"], r["case"]), len(seen))
    return sorted(seen, key=lambda key: (families.index(key[0]), seen[key]))


def render(jsonl: str, png: str, last_runs: int = 6) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    records = read(jsonl)
    if not records:
        raise ValueError(f"{jsonl}: no records")
    runs = sorted({r["run_id"] for r in records})[-last_runs:]
    records = [r for r in records if r["run_id"] in runs]
    keys = _order(records)
    x_of = {key: i for i, key in enumerate(keys)}
    families = list(dict.fromkeys(f for f, _ in keys))
    color = {f: COLORS[i % len(COLORS)] for i, f in enumerate(families)}

    fig, ax = plt.subplots(figsize=(max(10.0, 0.42 * len(keys) + 3), 6.5))
    ax.axhline(1.0, color="black", linewidth=1.0, zorder=1)
    for i, fam in enumerate(families):  # a band and a label per operation
        xs = [x_of[k] for k in keys if k[0] == fam]
        ax.axvspan(min(xs) - 0.5, max(xs) + 0.5, color="0.93" if i % 2 == 0 else "white", zorder=0)
        label = FAMILIES[fam].label if fam in FAMILIES else fam
        ax.text((min(xs) + max(xs)) / 2, 0.985, label, transform=ax.get_xaxis_transform(), ha="center", va="top",
                fontsize=9, color=color[fam], fontweight="bold")
    ys = [1.0]
    width = min(0.6, 0.12 * len(runs))
    for k, run in enumerate(runs):
        dx = (k - (len(runs) - 1) / 2) * (width / max(1, len(runs) - 1)) if len(runs) > 1 else 0.0
        marker = MARKERS[k % len(MARKERS)]
        for r in (r for r in records if r["run_id"] == run):
            x = x_of[(r["family"], r["case"])] + dx
            c = color[r["family"]]
            if r.get("ratio") is not None:
                ax.scatter(x, r["ratio"], marker=marker, s=46, color=c, edgecolors="black", linewidths=0.5, zorder=3)
                ys.append(r["ratio"])
            if r.get("ratio_idle") is not None:
                ax.scatter(x, r["ratio_idle"], marker=marker, s=22, facecolors="none", edgecolors=c, zorder=2)
                ys.append(r["ratio_idle"])
            failed = r.get("error") or any(not s.get("check", {}).get("ok", False) for s in r["sides"].values())
            if failed:
                ax.scatter(x, 0.02, marker="x", color="red", s=40, transform=ax.get_xaxis_transform(), zorder=3)
    low, high = min(ys), max(ys)
    pad = max(0.02, 0.08 * (high - low))
    ax.set_ylim(low - pad, high + pad * 2.5)
    ax.set_xlim(-0.6, len(keys) - 0.4)
    ax.set_xticks(range(len(keys)))
    ax.set_xticklabels([_label(c, f) for f, c in keys], rotation=60, ha="right", fontsize=8)
    subjects = sorted({SIDE_LABELS.get(r["subject"], r["subject"]) for r in records})
    bases = sorted({SIDE_LABELS.get(r["baseline"], r["baseline"]) for r in records})
    ax.set_ylabel(f"t_baseline / t_subject  (> 1: {', '.join(subjects)} faster)")
    commits = list(dict.fromkeys(r["commit"] for r in records))
    ax.set_title(
        f"{records[-1]['gpu']}: side by side, same tensors, same run (baseline: {', '.join(bases)})\n"
        f"mlakit commit{'s' if len(commits) > 1 else ''} {', '.join(commits)}; filled: sustained (do_bench), "
        "hollow: after an idle pause; red x: a side failed its check",
        fontsize=10,
    )
    handles = []
    for k, run in enumerate(runs):
        first = next(r for r in records if r["run_id"] == run)
        handles.append(Line2D([], [], marker=MARKERS[k % len(MARKERS)], linestyle="", color="0.4",
                              label=f"{run}  {first['commit']}"))
    ax.legend(handles=handles, title="run", fontsize=8, title_fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.grid(axis="y", color="0.8", linewidth=0.5)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(png)), exist_ok=True)
    fig.savefig(png, dpi=120)
    plt.close(fig)
    return png
