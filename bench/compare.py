#!/usr/bin/env python3
"""Side-by-side benchmark: mlakit against FlashMLA (and PyTorch where a case family names it:
SDPA for the GQA decode and the MHA prefill and its backward, an eager merge for the merge of
partial states) on identical tensors, in one run, on the GPU machine. docs/benchmarking.md
explains the figures.

  python3 bench/compare.py [options]          run (GPU): table, JSON lines, chart
  python3 bench/compare.py chart [JSONL...]   redraw the PNG of each JSONL (no GPU needed)
  python3 bench/compare.py list [options]     the cases the options select (no GPU needed)
  python3 bench/compare.py selftest           generators, references, checks, the run loop and
                                              the chart on tiny CPU problems (needs torch;
                                              mlakit for the parts that call it)

mlakit comes from PYTHONPATH or --mlakit-path (the GPU script builds it into build-gpu/python),
FlashMLA from PYTHONPATH or --flashmla-path (.baselines/flashmla, its .so.xz decompressed).
"""

from __future__ import annotations

import argparse
import glob
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from comparison import cases as case_table  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def _csv(text: str):
    return [part for part in text.split(",") if part]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bench/compare.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--filter", "--cases", dest="filter", help="regular expression (or substring) on case names")
    p.add_argument("--families", type=_csv, help=f"comma list of {sorted(case_table.FAMILIES)} (default: "
                   + ",".join(n for n, f in case_table.FAMILIES.items() if f.default) + ")")
    p.add_argument("--sides", type=_csv, help=f"comma list of {case_table.SIDES} (default: every side a family names)")
    p.add_argument("--quick", action="store_true", help="a few small cases (smoke run)")
    p.add_argument("--rounds", type=int, default=2, help="rounds (>= 2: both orders), default 2")
    p.add_argument("--rep-ms", type=int, default=200, help="do_bench's rep: ms of continuous work per figure (>= 200 "
                   "for reported figures)")
    p.add_argument("--warmup-ms", type=int, default=25)
    p.add_argument("--pause-s", type=float, default=1.0, help="idle pause before the idle-pause figure")
    p.add_argument("--idle-runs", type=int, default=5)
    p.add_argument("--profile-calls", type=int, default=5)
    p.add_argument("--no-idle", dest="idle", action="store_false", help="skip the idle-pause figure")
    p.add_argument("--no-profile", dest="profile", action="store_false", help="skip the kernel-only profile")
    p.add_argument("--no-fresh", dest="fresh", action="store_false", help="skip plan + decode with a fresh schedule")
    p.add_argument("--no-ceilings", dest="ceilings", action="store_false", help="skip the copy and matmul ceilings")
    p.add_argument("--no-chart", dest="chart", action="store_false", help="skip the PNG")
    p.add_argument("--time-failed", action="store_true", help="time sides that fail their check too (still "
                   "reported as failed)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out-dir", default=RESULTS, help="where <gpu>-compare.jsonl and .png go (default bench/results)")
    p.add_argument("--mlakit-path", help="prepended to sys.path to import mlakit")
    p.add_argument("--flashmla-path", help="prepended to sys.path to import flash_mla")
    return p


def _select(opts: argparse.Namespace):
    try:
        chosen = case_table.select(case_table.all_cases(), opts.families, opts.filter, opts.quick)
    except ValueError as e:
        sys.exit(f"compare: {e}")
    if not chosen:
        sys.exit("compare: no case matches the options (see `bench/compare.py list`)")
    return chosen


def cmd_list(argv) -> int:
    opts = _parser().parse_args(argv)
    for case in _select(opts):
        print(case_table.describe(case))
    return 0


def cmd_chart(argv) -> int:
    p = argparse.ArgumentParser(prog="bench/compare.py chart", description="redraw <gpu>-compare.png from the JSONL")
    p.add_argument("jsonl", nargs="*", help="JSONL files (default: bench/results/*-compare.jsonl)")
    p.add_argument("--out", help="PNG path (one JSONL only; default: beside the JSONL)")
    p.add_argument("--last-runs", type=int, default=6, help="runs shown (the latest), default 6")
    opts = p.parse_args(argv)
    files = opts.jsonl or sorted(glob.glob(os.path.join(RESULTS, "*-compare.jsonl")))
    if not files:
        sys.exit("compare chart: no *-compare.jsonl given or found in bench/results")
    if opts.out and len(files) > 1:
        sys.exit("compare chart: --out takes one JSONL")
    try:
        import matplotlib  # noqa: F401
    except ImportError as e:
        sys.exit(f"compare chart: matplotlib is needed ({e}): pip install matplotlib")
    from comparison import chart

    for path in files:
        png = opts.out or path[: -len(".jsonl")] + ".png"
        print("chart:", chart.render(path, png, opts.last_runs))
    return 0


def cmd_run(argv) -> int:
    opts = _parser().parse_args(argv)
    if opts.rounds < 2:
        sys.exit("compare: --rounds must be >= 2 (each order of the sides at least once)")
    chosen = _select(opts)
    for path in (opts.flashmla_path, opts.mlakit_path):
        if path:
            sys.path.insert(0, os.path.abspath(path))
    try:
        import torch
    except ImportError as e:
        sys.exit(f"compare: PyTorch is needed ({e}); run on the GPU machine (scripts/gpu_check.sh --compare)")
    if not torch.cuda.is_available():
        sys.exit("compare: CUDA is not available (torch.cuda.is_available() is False): the benchmark runs on the "
                 "GPU machine; `bench/compare.py list` and `chart` work without one")
    from comparison import ceilings, gpu, report, runner, sides

    wanted = {s for c in chosen for s in case_table.FAMILIES[c.family].sides}
    wanted |= {s for c in chosen for s in case_table.FAMILIES[c.family].on_request if s in (opts.sides or ())}
    if opts.sides:
        unknown = set(opts.sides) - set(case_table.SIDES)
        if unknown:
            sys.exit(f"compare: unknown sides {sorted(unknown)}: expected some of {case_table.SIDES}")
        wanted &= set(opts.sides)
    try:
        handles = sides.load(sorted(wanted))
    except sides.SideUnavailable as e:
        sys.exit(f"compare: {e}\n(--sides limits the run to the sides at hand, e.g. --sides mlakit)")

    identity = gpu.identity()
    header = dict(run_id=report.run_id(), commit=report.commit(), **identity)
    header["options"] = {k: v for k, v in vars(opts).items() if k not in ("mlakit_path", "flashmla_path")}
    header["side_sources"] = sides.describe(handles)
    print(f"compare: {len(chosen)} cases on {identity['gpu']}, sides {sorted(handles)}, commit {header['commit']}",
          flush=True)
    header["ceilings"] = ceilings.measure(opts.warmup_ms, opts.rep_ms) if opts.ceilings else {}
    if header["ceilings"]:
        c = header["ceilings"]
        print(f"ceilings: copy {c['copy_gbps']:.0f} GB/s, bf16 matmul {c['matmul_tflops']:.0f} TFLOP/s", flush=True)
    measure = runner.CudaMeasure(opts)
    records = []
    for i, case in enumerate(chosen):
        rec = runner.run_case(case, handles, opts, measure)
        report.add_ceiling_fractions(rec, header["ceilings"])
        records.append(rec)
        print(f"[{i + 1}/{len(chosen)}] {report.progress(rec)}", flush=True)
    path = report.jsonl_path(opts.out_dir, identity["gpu"])
    report.append(path, header, records)
    print(f"\n{report.TABLE_MARK}")
    print(report.table(header, records))
    print(f"\njson lines: {path}")
    if opts.chart:
        from comparison import chart

        try:
            print("chart:", chart.render(path, path[: -len(".jsonl")] + ".png"))
        except ImportError as e:
            print(f"chart: skipped ({e}); `bench/compare.py chart` draws it where matplotlib is installed")
    failed = [
        r["case"] for r in records
        if r.get("error") or any(not s.get("check", {}).get("ok") for s in r["sides"].values())
    ]
    if failed:
        print(f"compare: {len(failed)} cases with an error or a failed check: {', '.join(failed)}")
    return 1 if failed else 0


SKIPPED = 77  # the exit status ctest reads as a skipped test (tests/CMakeLists.txt)


def main(argv) -> int:
    commands = {"chart": cmd_chart, "list": cmd_list}
    if argv and argv[0] == "selftest":
        try:
            import torch  # noqa: F401  (every side and generator is PyTorch)
        except ImportError:
            print("selftest: skipped: PyTorch is not installed")
            return SKIPPED
        from comparison import selftest

        return selftest.main(argv[1:])
    if argv and argv[0] in commands:
        return commands[argv[0]](argv[1:])
    return cmd_run(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
