#!/usr/bin/env python3
"""I7 check: vector loads/stores addressed off the stack in the built SIMD kernel objects.

    python tools/check_spills.py [BUILD_DIR ...]      (default: build/*/ and build/)

Disassembles every object of the SIMD levels (CMakeFiles/lowbit_{avx2,avx2vnni,avx512}.dir)
with objdump and counts, per function, instructions that move an xmm/ymm/zmm register to or
from memory at (%rsp) or (%rbp): register spills of per-token accumulators or decoded
weights. Prints one line per function that has any, and a total per level; exits 1 if any
row kernel (a function whose name contains "rows" or "gemm") has one.
"""
from __future__ import annotations

import glob
import os
import re
import subprocess
import sys

LEVELS = ("avx2", "avx2vnni", "avx512")
FUNC = re.compile(r"^[0-9a-f]+ <(.+)>:$")
VEC_STACK = re.compile(r"%[xyz]mm\d+.*\(%[re](sp|bp)\)|\(%[re](sp|bp)\).*%[xyz]mm\d+")


def objects(build_dirs: list[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {lv: [] for lv in LEVELS}
    for b in build_dirs:
        for lv in LEVELS:
            out[lv] += glob.glob(os.path.join(b, "**", f"lowbit_{lv}.dir", "**", "*.o"), recursive=True)
    return out


def spills(obj: str) -> dict[str, int]:
    asm = subprocess.run(["objdump", "-d", "-C", "--no-show-raw-insn", obj],
                         capture_output=True, text=True, check=True).stdout
    counts: dict[str, int] = {}
    fn = None
    for line in asm.splitlines():
        m = FUNC.match(line)
        if m:
            fn = m.group(1)
            counts.setdefault(fn, 0)
        elif fn and VEC_STACK.search(line):
            counts[fn] += 1
    return counts


def is_kernel(fn: str) -> bool:
    return "rows" in fn or "gemm" in fn


def main(argv: list[str]) -> int:
    dirs = argv or [d for d in glob.glob("build/*/") + ["build/"] if os.path.isdir(d)]
    objs = objects(dirs)
    if not any(objs.values()):
        print(f"check_spills: no SIMD kernel objects under {dirs or '(no build dir)'}", file=sys.stderr)
        return 2
    bad = 0
    for lv in LEVELS:
        total, nfn = 0, 0
        for o in sorted(objs[lv]):
            for fn, c in spills(o).items():
                nfn += is_kernel(fn)
                total += c
                if c:
                    kernel = is_kernel(fn)
                    bad += kernel
                    print(f"{lv:<9} {c:4d} stack vector moves in {fn[:150]}{'' if kernel else '  (not a row kernel)'}")
        print(f"{lv:<9} {nfn} row-kernel functions, {total} stack vector moves in all functions")
    if bad:
        print(f"check_spills: {bad} row kernel(s) move vectors to or from the stack (I7)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
