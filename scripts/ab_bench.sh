#!/usr/bin/env bash
# A/B timing on the GPU machine, within one call (timings of separate calls differ by up to
# ~10% on the same code, so variants are only compared side by side): builds mlakit-bench for
# the working tree ("base") and for each variant directory, whose files replace the same
# paths of the tree while it builds, then runs every binary on the filtered cases, rounds
# interleaved, and prints the benchmark's table lines per binary.
# Usage (on the GPU machine): bash scripts/ab_bench.sh FILTER [VARIANT_DIR...]
#   env AB_ROUNDS (default 2), OUT (logs); AB_TIMELINE="h_q s_kv" also builds each variant's
#   mlakit-timeline (the sparse prefill traced, in clock-independent cycles) and runs it once
#   ($OUT/tl-<name>.txt; its pair lines are printed). An empty FILTER runs no benchmark.
set -uo pipefail
cd "$(dirname "$0")/.."
filter="$1"
shift
OUT="${OUT:-$PWD/out}"
build=build-gpu
bins=/tmp/ab-bins
mkdir -p "$OUT" "$bins"

build_bench() {  # $1: name of the binary copy
  if ! { cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMLAKIT_ENABLE_CUDA=ON &&
         cmake --build "$build" -j "$(nproc)" --target mlakit-bench ${AB_TIMELINE:+mlakit-timeline}; } \
       >"$OUT/ab-build-$1.log" 2>&1; then
    tail -30 "$OUT/ab-build-$1.log"
    echo "ab: build of $1 FAILED"
    exit 1
  fi
  cp "$build/bench/mlakit-bench" "$bins/$1"
  if [ -n "${AB_TIMELINE:-}" ]; then cp "$build/bench/mlakit-timeline" "$bins/tl-$1"; fi
}

build_bench base
names=(base)
for variant in "$@"; do
  name=$(basename "$variant")
  files=$(cd "$variant" && find . -type f)
  for f in $files; do cp "$f" "$bins/orig-${f//\//_}" 2>/dev/null; cp "$variant/$f" "$f"; done
  build_bench "$name"
  for f in $files; do cp "$bins/orig-${f//\//_}" "$f"; done
  names+=("$name")
done

[ -n "$filter" ] || AB_ROUNDS=0
for round in $(seq "${AB_ROUNDS:-2}"); do
  for name in "${names[@]}"; do
    echo "== $name (round $round)"
    timeout 120 "$bins/$name" --filter "$filter" --out "/tmp/ab-json-$name" 2>&1 | tee -a "$OUT/ab-$name.log" |
      grep -E "^(sparse_|prefill_|b[0-9]|h[0-9])" | cut -c1-110
  done
done

if [ -n "${AB_TIMELINE:-}" ]; then
  for name in "${names[@]}"; do
    # shellcheck disable=SC2086  # "h_q s_kv": two arguments
    timeout 60 "$bins/tl-$name" $AB_TIMELINE >"$OUT/tl-$name.txt" 2>&1
    echo "== timeline $name: $(grep -m1 'traced kernel' "$OUT/tl-$name.txt")"
    grep -E "^C[01] pair  " "$OUT/tl-$name.txt"
  done
fi
