#!/usr/bin/env bash
# The one GPU-machine script: build (all cores), SASS resource check, CPU + GPU test suites,
# the main job, the benchmark; logs and JSON under $OUT; a short summary printed last.
# Usage (on the GPU machine): bash scripts/gpu_check.sh [--skip-tests] [--skip-bench] [--pip]
#                                 [--compare[=COMPARE_ARGS]] [--timeline=CASE_FILTER]
#                                 [--profile=KERNEL_REGEX:BENCH_FILTER]
#                                 [--profile-compare=KERNEL_REGEX:COMPARE_ARGS] [bench args...]
#   --compare[=ARGS]: bench/compare.py, mlakit (build-gpu/python) side by side with FlashMLA
#          (.baselines/flashmla, carried into the call; its .so.xz is decompressed here) on
#          identical tensors; ARGS (space-separated, e.g. --compare=--quick) go to compare.py.
#          The JSONL and PNG land in bench/results/ and $OUT. A compare-only call:
#          --skip-tests --skip-bench --compare (the build still runs: the package needs it).
#   --compare-before=DIR[,DIR...]: before / after in one call: each DIR is another source tree
#          (carried, e.g. `git archive <commit> | tar -x -C .before`, or a variant under test);
#          their Python packages are built too and compare.py (with COMPARE_ARGS) runs for each
#          build in turn and then in reverse order (DIRs, after, after, DIRs reversed), each run
#          against FlashMLA on the same tensors; a run is labelled with its DIR's name.
#   --stress[=CASES]: the GPU stress test at length (Stress/*: every case called 20 times on the
#          same tensors, checked against the reference and bit for bit against its first call;
#          CASES cases per family and kernel, default 500: >= 10,000 calls each), and the FP8
#          sparse decode's race reproducer (the first sparse coverage case) called 1,000 times.
#   --sanitize: compute-sanitizer memcheck, racecheck, synccheck and initcheck over the reduced
#          stress suite (its first 13 cases per family: the coverage cases, which reach every kernel
#          instance, the V4 sparse decode's included; 2 calls each).
#   --pip: also `pip install .` into a fresh venv (build dependencies from .pip-wheels/ when the
#          machine has no index: the device has no internet) and run the Python tests against
#          the installed package, from outside the repository.
#   --timeline=CASE_FILTER: mlakit-decode-timeline on the dense- and sparse-decode benchmark
#          cases matching the filter (per-CTA spans, per-segment and per-tile phases).
#   GPU_TEST_FILTER=PATTERN (environment): a gtest filter for the GPU suite (default: all).
#   --profile: Nsight Compute on one launch of the kernels matching KERNEL_REGEX while the
#          benchmark runs the BENCH_FILTER cases: the details page and the per-SASS-instruction
#          source page (stall sampling) as CSV under $OUT.
#   --profile-compare=KERNEL_REGEX:COMPARE_ARGS: the same Nsight Compute sections on the first
#          PROFILE_LAUNCHES (default 4) launches matching KERNEL_REGEX while bench/compare.py runs
#          with COMPARE_ARGS (space-separated, e.g. "--families mha_backward --filter
#          s4096_d128_128$ --sides sdpa_cudnn,mlakit"): both sides of a gap in one report, for the
#          operations mlakit-bench does not run (the regex can match the baseline's kernels too).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/out}"
mkdir -p "$OUT"
# Pass MLAKIT_COMMIT=<hash> from the development machine: the git metadata that reaches the GPU
# machine can be stale (a run labelled itself with an older commit).
export MLAKIT_COMMIT="${MLAKIT_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
run_tests=1
run_bench=1
run_pip=0
run_compare=0
compare_args=""
compare_before=""
stress_cases=0
run_sanitize=0
profile=""
profile_compare=""
timeline=""
bench_args=()
for arg in "$@"; do
  case "$arg" in
    --skip-tests) run_tests=0 ;;
    --skip-bench) run_bench=0 ;;
    --pip) run_pip=1 ;;
    --stress) stress_cases=500 ;;
    --stress=*) stress_cases="${arg#--stress=}" ;;
    --sanitize) run_sanitize=1 ;;
    --compare) run_compare=1 ;;
    --compare=*) run_compare=1; compare_args="${arg#--compare=}" ;;
    --compare-before=*) run_compare=1; compare_before="${arg#--compare-before=}" ;;
    --profile=*) profile="${arg#--profile=}" ;;
    --profile-compare=*) profile_compare="${arg#--profile-compare=}" ;;
    --timeline=*) timeline="${arg#--timeline=}" ;;
    *) bench_args+=("$arg") ;;
  esac
done
build=build-gpu
summary="$OUT/summary.txt"
: >"$summary"
note() { echo "$*" | tee -a "$summary"; }

start=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader >"$OUT/gpu.txt" 2>&1
note "gpu: $(head -1 "$OUT/gpu.txt")  commit: $MLAKIT_COMMIT"

# The Python package is built too where python3 has nanobind (the device image has it).
python_options=""
if python3 -c "import nanobind, pytest" >/dev/null 2>&1; then
  python_options="-DMLAKIT_BUILD_PYTHON=ON -DPython_EXECUTABLE=$(command -v python3)"
fi
if ! { cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMLAKIT_ENABLE_CUDA=ON $python_options &&
       cmake --build "$build" -j "$(nproc)"; } >"$OUT/build.log" 2>&1; then
  tail -40 "$OUT/build.log"
  note "build: FAILED (see build.log)"
  exit 1
fi
note "build: ok ($(( $(date +%s) - start )) s)"

# ptxas on the Hopper kernel: wgmma serialisation (C7514-C7520 "Potential Performance Loss")
# and spills silently cost 20-30%; report them.
for unit in src/kernels/sm90/mla_decode_sm90_bf16.cu src/kernels/sm90/mla_sparse_prefill_sm90_bf16.cu \
            src/kernels/sm90/mla_sparse_decode_sm90.cu; do
  nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -Xptxas -v -I include -I src -c "$unit" -o /dev/null 2>&1 |
    grep -E "Performance Loss|[1-9][0-9]* bytes spill" | cut -c1-160 | sed "s|^|ptxas warning ($unit): |" | tee -a "$summary"
done

# SASS: the matrix instructions present, and no local-memory traffic in the kernels.
cuobjdump --dump-sass "$build/libmlakit.so" >"$OUT/sass.txt" 2>&1
awk '/Function :/{f=$3} /HGMMA/{g[f]++} /HMMA/{h[f]++} /LDL|STL/{l[f]++}
     END{for(k in g) print "sass: HGMMA " g[k] " " k; for(k in h) print "sass: HMMA " h[k] " " k;
         for(k in l) print "sass: LDL/STL " l[k] " " k}' "$OUT/sass.txt" | sed 's/_ZN6mlakit6detail//' | tee -a "$summary"
gzip -f "$OUT/sass.txt"

if [ "$run_tests" = 1 ]; then
  "$build/tests/mlakit_cpu_tests" --gtest_brief=1 >"$OUT/cpu_tests.log" 2>&1
  note "cpu tests: rc=$? $(grep -E '^\[  PASSED  \]|FAILED TEST' "$OUT/cpu_tests.log" | head -3 | tr '\n' ' ')"
  timeout "${GPU_TEST_TIMEOUT:-300}" "$build/tests/mlakit_gpu_tests" --gtest_brief=1 \
    --gtest_filter="${GPU_TEST_FILTER:-*}" >"$OUT/gpu_tests.log" 2>&1
  note "gpu tests: rc=$? $(grep -E '^\[  PASSED  \]|^\[  FAILED  \]|SKIPPED' "$OUT/gpu_tests.log" | head -12 | tr '\n' ' ')"
  grep -E "^\[  FAILED  \]" "$OUT/gpu_tests.log" | head -8 | tee -a "$summary"
  grep -B1 -A3 "Failure" "$OUT/gpu_tests.log" | grep -E "got|differ|Expected|status" | head -8 | tee -a "$summary"
  if [ -n "$python_options" ]; then
    PYTHONPATH="$PWD/$build/python" timeout 300 python3 -m pytest -q -rs tests/python >"$OUT/python_tests.log" 2>&1
    note "python tests: rc=$? $(tail -1 "$OUT/python_tests.log")"
    grep -E "^(FAILED|ERROR) |^E  " "$OUT/python_tests.log" | head -12 | tee -a "$summary"
  fi
  timeout 120 "$build/apps/mlakit-run" >"$OUT/main_job.log" 2>&1
  note "main job: rc=$?"; tail -6 "$OUT/main_job.log" | tee -a "$summary"
fi

gpu_tests="$build/tests/mlakit_gpu_tests"
if [ "$stress_cases" -gt 0 ]; then
  stress_start=$(date +%s)
  MLAKIT_STRESS_CASES="$stress_cases" timeout "${STRESS_TIMEOUT:-420}" "$gpu_tests" --gtest_filter='Stress/*' \
    --gtest_brief=1 >"$OUT/stress.log" 2>&1
  note "stress ($stress_cases cases per family and kernel): rc=$? ($(( $(date +%s) - stress_start )) s)"
  grep -E "^\[stress\]|FAILED|differ" "$OUT/stress.log" | head -12 | tee -a "$summary"
  MLAKIT_STRESS_CASES=1 MLAKIT_STRESS_CALLS=1000 timeout 300 "$gpu_tests" \
    --gtest_filter='Stress/SparseDecode.*/sm90' --gtest_brief=1 >"$OUT/race_case.log" 2>&1
  note "race reproducer x1000 (sm90 sparse decode): rc=$? $(grep -E '^\[stress\]' "$OUT/race_case.log" | head -2 | tr '\n' ' ')"
fi
if [ "$run_sanitize" = 1 ]; then
  # Each tool over the reduced stress suite: every kernel instance, 2 calls per case. A tool's
  # report is an error exit (--error-exitcode), and its summary line goes to the summary.
  for tool in memcheck synccheck initcheck racecheck; do
    tool_start=$(date +%s)
    MLAKIT_STRESS_CALLS=2 MLAKIT_STRESS_CASES="${SANITIZE_CASES:-13}" timeout "${SANITIZE_TIMEOUT:-300}" \
      compute-sanitizer --tool "$tool" --error-exitcode 9 --print-limit 20 "$gpu_tests" \
      --gtest_filter='Stress/*:MergeStatesGpu.*' --gtest_brief=1 >"$OUT/sanitize_$tool.log" 2>&1
    note "$tool: rc=$? ($(( $(date +%s) - tool_start )) s) $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|^\[  (PASSED|FAILED)' "$OUT/sanitize_$tool.log" | tr '\n' ' ' | cut -c1-200)"
    grep -m4 -E "Race reported|Invalid|Uninitialized|Barrier" "$OUT/sanitize_$tool.log" | cut -c1-220 | tee -a "$summary"
  done
fi

if [ "$run_pip" = 1 ]; then
  pip_start=$(date +%s)
  # Into the machine's own python3, whose numpy and PyTorch the tests need. Offline (the
  # device has no index), build dependencies come from .pip-wheels/ and are installed first:
  # an isolated build environment could not run the cmake of that python's environment (a
  # pip shim), so the build runs in the environment itself (--no-build-isolation).
  pip_args=(--break-system-packages)
  if [ -d .pip-wheels ]; then
    pip_args+=(--no-index --find-links "$PWD/.pip-wheels")
    python3 -m pip install "${pip_args[@]}" scikit-build-core nanobind >"$OUT/pip_build_deps.log" 2>&1
    pip_args+=(--no-build-isolation)
  fi
  CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" python3 -m pip install -v "${pip_args[@]}" . >"$OUT/pip_install.log" 2>&1
  note "pip install .: rc=$? ($(( $(date +%s) - pip_start )) s) $(grep -E '^Successfully installed' "$OUT/pip_install.log")"
  repo="$PWD"
  (cd "$(mktemp -d)" && timeout 300 python3 -c "import mlakit; print('mlakit from', mlakit.__file__)" &&
   timeout 300 python3 -m pytest -q -rs -p no:cacheprovider "$repo/tests/python") >"$OUT/pip_python_tests.log" 2>&1
  note "python tests (installed package): rc=$? $(grep -E '^mlakit from' "$OUT/pip_python_tests.log") $(tail -1 "$OUT/pip_python_tests.log")"
  grep -E "^(FAILED|ERROR) |^E  " "$OUT/pip_python_tests.log" | head -12 | tee -a "$summary"
fi

if [ "$run_bench" = 1 ]; then
  timeout 60 "$build/bench/mlakit-dequant-rates" >"$OUT/dequant_rates.log" 2>&1
  note "dequant rates: rc=$?"; tee -a "$summary" <"$OUT/dequant_rates.log"
  timeout 60 "$build/bench/mlakit-gather-rates" >"$OUT/gather_rates.log" 2>&1
  note "gather rates: rc=$?"; tee -a "$summary" <"$OUT/gather_rates.log"
  timeout 60 "$build/bench/mlakit-cluster-fill-rates" >"$OUT/cluster_fill_rates.log" 2>&1
  note "cluster fill rates: rc=$?"; tee -a "$summary" <"$OUT/cluster_fill_rates.log"
  timeout 240 "$build/bench/mlakit-bench" --out bench/results "${bench_args[@]}" >"$OUT/bench.log" 2>&1
  note "bench: rc=$?"
  find bench/results -name '*.jsonl' -newer "$OUT/gpu.txt" -exec cp {} "$OUT/" \;  # this GPU's file
  tail -25 "$OUT/bench.log" | tee -a "$summary"
fi
if [ "$run_compare" = 1 ]; then
  so=.baselines/flashmla/flash_mla/cuda.cpython-312-x86_64-linux-gnu.so
  if [ -f "$so.xz" ] && [ ! -f "$so" ]; then xz -dk "$so.xz"; fi
  [ -d .baselines/flashmla ] || note "compare: .baselines/flashmla missing (carry it, see ../shared/baselines/README.md)"
  # One compare.py run of the mlakit package in python dir $1, labelled $2 (extra arguments
  # after it go to compare.py).
  compare_runs=0
  compare_run() {
    local compare_start python_dir="$1" label="$2" log
    shift 2
    compare_runs=$((compare_runs + 1))
    log="$OUT/compare_${compare_runs}_$label.log"
    compare_start=$(date +%s)
    # shellcheck disable=SC2086  # compare_args: several arguments on purpose
    PYTHONPATH="$python_dir:$PWD/.baselines/flashmla${PYTHONPATH:+:$PYTHONPATH}" \
      timeout "${COMPARE_TIMEOUT:-480}" python3 bench/compare.py $compare_args "$@" >"$log" 2>&1
    note "compare ($label): rc=$? ($(( $(date +%s) - compare_start )) s)"
    if grep -q "^== side by side ==" "$log"; then
      sed -n '/^== side by side ==/,$p' "$log" | tee -a "$summary"
    else
      tail -30 "$log" | tee -a "$summary"
    fi
  }
  if [ -n "$compare_before" ]; then
    IFS=, read -r -a before_dirs <<<"$compare_before"
    built=()
    for dir in "${before_dirs[@]}"; do
      label="$(basename "$dir")"; label="${label#.}"
      if { cmake -S "$dir" -B "$dir/build-gpu" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMLAKIT_ENABLE_CUDA=ON \
             $python_options && cmake --build "$dir/build-gpu" -j "$(nproc)" --target _mlakit; } >"$OUT/build_$label.log" 2>&1; then
        built+=("$dir")
      else
        note "compare-before: build of $dir FAILED (build_$label.log)"
      fi
    done
    order=("${built[@]}" after after)
    for ((i = ${#built[@]} - 1; i >= 0; i--)); do order+=("${built[$i]}"); done
    for side in "${order[@]}"; do
      if [ "$side" = after ]; then
        compare_run "$PWD/$build/python" after
      else
        # The other builds' results stay out of bench/results.
        label="$(basename "$side")"; label="${label#.}"
        compare_run "$PWD/$side/build-gpu/python" "$label" --out-dir "$OUT/${label}_results" --no-chart
      fi
    done
  else
    compare_run "$PWD/$build/python" mlakit
  fi
  find bench/results -name '*-compare.*' -newer "$OUT/gpu.txt" -exec cp {} "$OUT/" \;
fi
if [ -n "$timeline" ]; then
  timeout 300 "$build/bench/mlakit-decode-timeline" "$timeline" 8192 >"$OUT/decode_timeline.log" 2>&1
  note "decode timeline ($timeline): rc=$?"; tee -a "$summary" <"$OUT/decode_timeline.log"
fi
ncu_sections=(--section SpeedOfLight --section WarpStateStats --section SourceCounters --section SchedulerStats
              --section InstructionStats --section MemoryWorkloadAnalysis --section LaunchStats --import-source no)
# The report's details page and per-SASS-instruction source page as CSV, the report removed.
export_profile() {
  ncu -i "$OUT/profile.ncu-rep" --page details --csv >"$OUT/profile_details.csv" 2>&1
  ncu -i "$OUT/profile.ncu-rep" --page source --csv --print-source sass >"$OUT/profile_sass.csv" 2>&1
  gzip -f "$OUT/profile_sass.csv"
  rm -f "$OUT/profile.ncu-rep"
}
if [ -n "$profile" ]; then
  kernel_regex="${profile%%:*}" bench_filter="${profile#*:}"
  timeout 300 ncu --clock-control none --kernel-name "regex:$kernel_regex" --launch-skip 2 --launch-count 1 \
    "${ncu_sections[@]}" -f -o "$OUT/profile" "$build/bench/mlakit-bench" --quick --runs 3 --filter "$bench_filter" \
    --out /tmp/profile-bench >"$OUT/profile.log" 2>&1
  note "profile ($profile): rc=$?"; tail -3 "$OUT/profile.log" | tee -a "$summary"
  export_profile
fi
if [ -n "$profile_compare" ]; then
  kernel_regex="${profile_compare%%:*}" compare_profile_args="${profile_compare#*:}"
  # shellcheck disable=SC2086  # compare_profile_args: several arguments on purpose
  PYTHONPATH="$PWD/$build/python:$PWD/.baselines/flashmla${PYTHONPATH:+:$PYTHONPATH}" \
    timeout 400 ncu --clock-control none --kernel-name "regex:$kernel_regex" --launch-count "${PROFILE_LAUNCHES:-4}" \
    "${ncu_sections[@]}" -f -o "$OUT/profile" python3 bench/compare.py $compare_profile_args --rounds 2 --rep-ms 20 \
    --warmup-ms 5 --no-idle --no-profile --no-fresh --no-ceilings --no-chart --out-dir /tmp/profile-compare \
    >"$OUT/profile.log" 2>&1
  note "profile-compare ($profile_compare): rc=$?"; tail -3 "$OUT/profile.log" | tee -a "$summary"
  export_profile
fi
note "total: $(( $(date +%s) - start )) s"
# The device returns a few files per call: the logs travel as one archive.
(cd "$OUT" && tar czf logs.tgz --remove-files ./*.log sass.txt.gz ./*_results 2>/dev/null) || true  # no *_results dirs: not an error
