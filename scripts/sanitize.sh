#!/usr/bin/env bash
# Builds the CPU test suite host-only with AddressSanitizer + UndefinedBehaviorSanitizer and
# runs it; any sanitizer report fails the run (exit status != 0). Usage:
#   bash scripts/sanitize.sh [build-dir]        (default build-asan)
#
# Why a separate build and script: the sanitizers need their own compile and link flags on
# every object, and CUDA code cannot take them (nvcc's host pass and the kernels would need
# a different toolchain), so this is a CUDA-off, apps-off, Python-off configuration of its
# own. .ci/run runs it after scripts/test.sh. scripts/test.sh does not run it: test.sh is the
# README's "build everything and run the tests" command, and this build costs a second full
# compile of the host layer and the tests (docs/testing.md has the measured times).
#
# Why -fno-sanitize-recover=all and halt_on_error: the first report ends the process with a
# non-zero status, so ctest marks the test failed and this script (set -e) fails with it.
# The output is also scanned for report headers, so a report from a process whose exit
# status is not checked (a child process, a test that catches a crash) still fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build-asan}"
bash scripts/setup.sh >/dev/null  # installs cmake, ninja, g++, gtest when missing
sanitize="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
# -O1 -g: readable stack traces at a moderate slowdown; NDEBUG is left out so asserts run too.
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g" \
  -DCMAKE_CXX_FLAGS="$sanitize" \
  -DCMAKE_EXE_LINKER_FLAGS="$sanitize" \
  -DCMAKE_SHARED_LINKER_FLAGS="$sanitize" \
  -DMLAKIT_ENABLE_CUDA=OFF -DMLAKIT_BUILD_APPS=OFF -DMLAKIT_BUILD_PYTHON=OFF -DMLAKIT_BUILD_TESTS=ON
cmake --build "$build" -j "$(nproc 2>/dev/null || echo 2)" --target mlakit_cpu_tests

# abort_on_error: a report ends in abort(), where the fuzz test prints the case it was running.
export ASAN_OPTIONS="halt_on_error=1:abort_on_error=1:detect_leaks=1:detect_stack_use_after_return=1:check_initialization_order=1:strict_init_order=1:strict_string_checks=1"
export UBSAN_OPTIONS="halt_on_error=1:abort_on_error=1:print_stacktrace=1"
log="$build/sanitize.log"
status=0
ctest --test-dir "$build" -L cpu --output-on-failure 2>&1 | tee "$log" || status=$?
if grep -qE 'ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:' "$log"; then
  echo "sanitize.sh: sanitizer report in $log" >&2
  exit 1
fi
if [ "$status" -ne 0 ]; then
  echo "sanitize.sh: CPU suite failed under the sanitizers (see $log)" >&2
  exit "$status"
fi
echo "sanitize.sh: CPU suite clean under ASan + UBSan"
