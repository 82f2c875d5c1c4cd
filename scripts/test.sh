#!/usr/bin/env bash
# Builds mlakit and runs the test suite (CPU tests always; GPU tests run on a GPU machine and
# skip, saying so, without one). Usage: bash scripts/test.sh [build-dir]
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build}"
options=$(bash scripts/setup.sh)
# The Python package's tests (NumPy, CPU reference path) run too when its build
# dependencies can be installed from PyPI.
if command -v python3 >/dev/null 2>&1 &&
   python3 -m pip install -q nanobind numpy pytest >/dev/null 2>&1 &&
   python3 -c "import nanobind, numpy, pytest" >/dev/null 2>&1; then
  options="$options -DMLAKIT_BUILD_PYTHON=ON -DPython_EXECUTABLE=$(command -v python3)"
else
  echo "test.sh: python3 with nanobind/numpy/pytest unavailable: skipping the Python package" >&2
fi
jobs=$(nproc 2>/dev/null || echo 2)
# shellcheck disable=SC2086
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release $options
cmake --build "$build" -j "$jobs"
ctest --test-dir "$build" --output-on-failure
