#!/usr/bin/env bash
# SASS digest of every kernel the library builds, for refactors that must not change the
# machine code: compiles each .cu file listed in CMakeLists.txt for sm_80 and sm_90a (as the
# build does), disassembles it and prints one line per kernel: a sha256 of its SASS (addresses
# and encodings stripped), the architecture and the kernel's demangled name. Lines are per
# kernel, not per file, so they can be compared across file moves and renames of files.
# Usage: bash scripts/sass_digest.sh [SOURCE_TREE] > digests.txt        (default: .)
# Needs nvcc and cuobjdump (the CUDA toolkit's, or CUOBJDUMP=/path/to/cuobjdump).
set -euo pipefail
root="${1:-.}"
cuobjdump="${CUOBJDUMP:-$(command -v cuobjdump || echo /tmp/cutools/nvidia/cu13/bin/cuobjdump)}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
mapfile -t units < <(grep -oE 'src/[A-Za-z0-9_/]+\.cu\b' "$root/CMakeLists.txt" | sort -u)
for unit in "${units[@]}"; do
  for arch in 80 90a; do
    out="$tmp/$(echo "$unit" | tr / _).$arch.cubin"
    if ! nvcc -std=c++17 -O3 -DMLAKIT_WITH_CUDA=1 -gencode="arch=compute_$arch,code=sm_$arch" \
           -I "$root/include" -I "$root/src" -I "$root" -cubin "$root/$unit" -o "$out" 2>"$out.log"; then
      cat "$out.log" >&2
      exit 1
    fi
    "$cuobjdump" -sass "$out" >"$out.sass"
    python3 - "$out.sass" "sm_$arch" <<'PY'
import hashlib, re, subprocess, sys
text, arch = open(sys.argv[1]).read(), sys.argv[2]
functions = re.split(r"^\s*Function : (\S+)\s*$", text, flags=re.M)
for name, body in zip(functions[1::2], functions[2::2]):
    code = [re.sub(r"/\*[0-9a-f]{4,}\*/|/\* 0x[0-9a-f]+ \*/", "", line).strip() for line in body.splitlines()]
    code = [line for line in code if line and not line.startswith((".", "Fatbin", "code for", "arch", "host", "compile_size"))]
    try:
        name = subprocess.run(["c++filt", name], capture_output=True, text=True).stdout.strip() or name
    except OSError:
        pass
    print(hashlib.sha256("\n".join(code).encode()).hexdigest()[:16], arch, name)
PY
  done
done | sort -k3 -k2
