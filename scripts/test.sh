#!/usr/bin/env bash
# Builds mlakit and runs the test suite (CPU tests always; GPU tests run on a GPU machine and
# skip, saying so, without one). Usage: bash scripts/test.sh [build-dir]
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build}"
options=$(bash scripts/setup.sh)
jobs=$(nproc 2>/dev/null || echo 2)
# shellcheck disable=SC2086
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release $options
cmake --build "$build" -j "$jobs"
ctest --test-dir "$build" --output-on-failure
