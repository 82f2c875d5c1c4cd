#!/usr/bin/env bash
# The main job: the dense MLA decode on a DeepSeek-V3-shaped problem (b=64, h_q=128, s_q=1,
# s_k ~ 4096, page 64), checked against the CPU reference and timed; without a GPU, the CPU
# reference on a small problem. Usage: bash scripts/run.sh [mlakit-run options] (--help lists
# them). mlakit-run checks every flag: a bad one prints what was expected and the usage, and
# exits with status 2.
set -euo pipefail
cd "$(dirname "$0")/.."
build="${MLAKIT_BUILD_DIR:-build}"
options=$(bash scripts/setup.sh)
jobs=$(nproc 2>/dev/null || echo 2)
# The build is quiet unless it fails: then its log says why.
log=$(mktemp)
trap 'rm -f "$log"' EXIT
# shellcheck disable=SC2086
if ! { cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release $options &&
       cmake --build "$build" -j "$jobs" --target mlakit-run; } >"$log" 2>&1; then
  cat "$log" >&2
  echo "run.sh: building mlakit-run failed (log above)" >&2
  exit 1
fi
"$build/apps/mlakit-run" "$@"
