#!/usr/bin/env python3
"""Checks that #include arrows in include/, src/ and reference/ follow the layer rule of
docs/design.md (Layers). Prints every include that breaks it (file:line, the include, why)
and exits 1; prints one line and exits 0 when there is none.

Usage: python3 scripts/check_layers.py [SOURCE_TREE]        (default: the repository)

Includes are root-relative ("host/check.h", "mlakit/tensor.h"), so the first path component
names the layer. <...> includes whose first component is no layer (the C++ library, CUDA,
cub) are outside the rule; a "..." include that names no layer is reported, since every
library include is root-relative.
"""
import pathlib
import re
import sys

# Which layer a file belongs to, by its path in the repository.
FILE_LAYERS = {
    "include/mlakit": "public",
    "src/host": "host",
    "src/dispatch": "dispatch",
    "src/kernels": "kernels",
    "src/device": "device",
    "src/common": "common",
    "reference": "reference",
}

# Which layer an include points to, by its first path component.
INCLUDE_LAYERS = {
    "mlakit": "public",
    "host": "host",
    "dispatch": "dispatch",
    "kernels": "kernels",
    "device": "device",
    "common": "common",
    "reference": "reference",
    # Users of the library: nothing in it may include them.
    "support": "support",
    "bench": "bench",
    "tests": "tests",
    "apps": "apps",
}

# The rule: each layer includes itself, the layer right below it and common/; only the host
# and the dispatch see the public API (the types of the arguments they take), the kernels
# and below see plain data only.
ALLOWED = {
    "public": {"public"},
    "host": {"public", "host", "dispatch", "common"},
    "dispatch": {"public", "dispatch", "kernels", "common"},
    "kernels": {"kernels", "device", "common"},
    "device": {"device", "common"},
    "common": {"common"},
    # The CPU reference stands beside the stack. It validates its arguments with the host
    # layer's validation (host/*_validate.h, host/fp8_cache_args.h, host/decode_layout.h), so
    # the reference and the library accept and reject the same inputs with the same messages;
    # it calls no dispatch or kernel code.
    "reference": {"public", "reference", "host", "common"},
}

# Kernel families: one folder each under src/kernels/, none includes another, and the code
# they share (src/kernels/*.h, schedule/, combine/) includes none of them.
KERNEL_FAMILIES = {"portable", "sm90"}


def kernel_family(path):
    """'portable' / 'sm90' for src/kernels/<family>/..., None for shared kernel code."""
    parts = path.split("/")
    return parts[1] if len(parts) > 2 and parts[1] in KERNEL_FAMILIES else None


def is_sm90(path):
    return "/sm90/" in "/" + path


def file_layer(rel):
    for prefix, layer in FILE_LAYERS.items():
        if rel.startswith(prefix + "/"):
            return layer
    return None


def src_path(rel):
    """A file's path as an include would name it (src/ and include/ are include roots)."""
    for root in ("src/", "include/"):
        if rel.startswith(root):
            return rel[len(root):]
    return rel


INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')


def check_include(rel, layer, target, quoted):
    """The reason `target` may not be included from `rel` (in `layer`), or None."""
    first = target.split("/", 1)[0]
    to = INCLUDE_LAYERS.get(first)
    if to is None:
        return "names no layer (library includes are root-relative)" if quoted else None
    if to not in ALLOWED[layer]:
        allowed = ", ".join(sorted(ALLOWED[layer]))
        return f"{layer} may not include the {to} layer (it may include: {allowed})"
    here = src_path(rel)
    if layer == "kernels" and to == "kernels":
        mine, theirs = kernel_family(here), kernel_family(target)
        if theirs is not None and mine != theirs:
            who = f"the {mine} kernels" if mine else "shared kernel code"
            return f"{who} may not include the {theirs} family (shared code goes to src/kernels/ or a shared folder)"
    # sm_90a-only code (wgmma, TMA, mbarrier) is for sm90/ folders: the portable kernels and
    # the shared device and kernel code compile for sm_80 too.
    if to in ("kernels", "device") and layer in ("kernels", "device") and is_sm90(target) and not is_sm90(here):
        return "only sm90/ code may include sm90/ code (the rest compiles for sm_80 too)"
    return None


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parent.parent)
    problems = []
    checked = 0
    for top in ("include", "src", "reference"):
        for path in sorted((root / top).rglob("*")):
            if not path.is_file() or path.suffix not in (".h", ".cuh", ".cpp", ".cu"):
                continue
            rel = path.relative_to(root).as_posix()
            layer = file_layer(rel)
            if layer is None:
                problems.append(f"{rel}: in no layer (docs/design.md, Layers)")
                continue
            checked += 1
            for number, line in enumerate(path.read_text().splitlines(), 1):
                m = INCLUDE.match(line)
                if not m:
                    continue
                why = check_include(rel, layer, m.group(2), m.group(1) == '"')
                if why:
                    close = ">" if m.group(1) == "<" else '"'
                    problems.append(f"{rel}:{number}: #include {m.group(1)}{m.group(2)}{close}: {why}")
    for p in problems:
        print(p)
    if problems:
        print(f"check_layers: {len(problems)} include(s) break the layer rule (docs/design.md, Layers)")
        return 1
    print(f"check_layers: {checked} files, every include follows the layer rule", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
