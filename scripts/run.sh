#!/usr/bin/env bash
# The main job: the dense MLA decode on a DeepSeek-V3-shaped problem (b=64, h_q=128, s_q=1,
# s_k ~ 4096, page 64), checked against the CPU reference and timed; without a GPU, the CPU
# reference on a small problem. Usage: bash scripts/run.sh [mlakit-run options]
set -euo pipefail
cd "$(dirname "$0")/.."
build="${MLAKIT_BUILD_DIR:-build}"
options=$(bash scripts/setup.sh)
jobs=$(nproc 2>/dev/null || echo 2)
# shellcheck disable=SC2086
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release $options >/dev/null
cmake --build "$build" -j "$jobs" --target mlakit-run >/dev/null
"$build/apps/mlakit-run" "$@"
