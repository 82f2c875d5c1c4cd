"""The side-by-side benchmark behind bench/compare.py: mlakit against the libraries a user
would pick instead (FlashMLA, PyTorch SDPA), on identical tensors, in one run.

One concept per module: cases (the case table of docs/benchmarking.md and its families), data (FlashMLA's
data conventions), reference (float64 references and the docs/contract.md accuracy checks), sides (how
each library is called), timing (sustained, idle-pause, profiler kernel-only), gpu (clocks,
GPU identity), runner (rounds and orders), report (table, JSON lines), chart (the PNG),
selftest (what can be checked without a GPU)."""
