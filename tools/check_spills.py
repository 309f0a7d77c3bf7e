#!/usr/bin/env python3
"""I7 check: vector loads/stores addressed off the stack in the built SIMD kernel objects.

    python tools/check_spills.py [BUILD_DIR ...]      (default: build/*/ and build/)

Disassembles every object of the SIMD levels (CMakeFiles/lowbit_<level>.dir: x86 avx, avx2,
avx2vnni, avx512, amx; aarch64 neon, dotprod, i8mm, with aarch64-linux-gnu-objdump when this host
is not aarch64) and counts, per function, instructions that move an xmm/ymm/zmm register to or
from memory at (%rsp), or at (%rbp) where the function made %rbp its frame pointer (aarch64: a
q register loaded or stored at [sp ...]; the d8-d15 callee saves are 64-bit and not counted):
register spills of per-token accumulators or decoded weights. Prints which compiler built
each build directory (CMakeCache.txt's CMAKE_CXX_COMPILER and the version CMake found), one
line per function that has any stack vector move, and a total per level; exits 1 if any row kernel (a function whose name contains
"rows" or "gemm") has one.

I7 holds for GCC and for clang; CI checks both builds (.ci/run). The clang check by hand:

    apt-get install -y clang
    cmake -S . -B /tmp/build-clang -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER=clang++
    cmake --build /tmp/build-clang
    python tools/check_spills.py /tmp/build-clang
"""
from __future__ import annotations

import glob
import os
import re
import subprocess
import sys

LEVELS = ("avx", "avx2", "avx2vnni", "avx512", "amx", "neon", "dotprod", "i8mm")
# Levels whose spills are reported but do not fail the check (yet): avx (Sandy Bridge: 16 xmm,
# 128-bit integer ops) keeps its window kernels bitwise the reference (tests/test_reference_levels.py)
# but GCC still moves some of their vectors through the stack (54 of 112 row kernels, mostly
# K-quants at nt >= 3); issue 25 tracks making them spill-free.
ADVISORY = {"avx"}
ARM_LEVELS = ("neon", "dotprod", "i8mm")
# ldr/str/ldp/stp/ldur/stur of a 128-bit q register addressed off sp
ARM_VEC_SP = re.compile(r"\b(ld|st)(r|p|ur)\s+q\d+(,\s*q\d+)?,\s*\[sp")
FUNC = re.compile(r"^[0-9a-f]+ <(.+)>:$")
VEC_RSP = re.compile(r"%[xyz]mm\d+.*\(%rsp\)|\(%rsp\).*%[xyz]mm\d+")
VEC_RBP = re.compile(r"%[xyz]mm\d+.*\(%rbp\)|\(%rbp\).*%[xyz]mm\d+")
# %rbp addresses the stack only in a function that makes it its frame pointer (GCC does, to
# realign the stack); elsewhere it is one more general register (clang uses it so).
FRAME_PTR = re.compile(r"\bmov\s+%rsp,%rbp$")


def objects(build_dirs: list[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {lv: [] for lv in LEVELS}
    for b in build_dirs:
        for lv in LEVELS:
            out[lv] += glob.glob(os.path.join(b, "**", f"lowbit_{lv}.dir", "**", "*.o"), recursive=True)
    return out


def compiler(build_dir: str) -> str:
    """The C++ compiler CMake configured in build_dir, e.g. "/usr/bin/clang++ (Clang 14.0.6)"."""
    exe = ident = ver = None
    try:
        with open(os.path.join(build_dir, "CMakeCache.txt"), errors="replace") as f:
            for line in f:
                if line.startswith("CMAKE_CXX_COMPILER:"):
                    exe = line.split("=", 1)[1].strip()
    except OSError:
        pass
    for cfg in glob.glob(os.path.join(build_dir, "CMakeFiles", "*", "CMakeCXXCompiler.cmake")):
        with open(cfg, errors="replace") as f:
            for line in f:
                m = re.match(r'set\(CMAKE_CXX_COMPILER_(ID|VERSION) "([^"]*)"\)', line)
                if m and m.group(1) == "ID":
                    ident = m.group(2)
                elif m:
                    ver = m.group(2)
    if not exe and not ident:
        return "unknown compiler (no CMakeCache.txt)"
    return f"{exe or '?'} ({ident or '?'} {ver or '?'})"


def objdump(arm: bool) -> str:
    if arm and os.uname().machine not in ("aarch64", "arm64"):
        return "aarch64-linux-gnu-objdump"
    return "objdump"


def spills(obj: str, arm: bool = False) -> dict[str, int]:
    asm = subprocess.run([objdump(arm), "-d", "-C", "--no-show-raw-insn", obj],
                         capture_output=True, text=True, check=True).stdout
    counts: dict[str, int] = {}
    fn = None
    rbp_moves: dict[str, int] = {}
    frame: set[str] = set()
    for line in asm.splitlines():
        m = FUNC.match(line)
        if m:
            fn = m.group(1)
            counts.setdefault(fn, 0)
            rbp_moves.setdefault(fn, 0)
        elif fn and arm:
            counts[fn] += bool(ARM_VEC_SP.search(line))
        elif fn:
            if VEC_RSP.search(line):
                counts[fn] += 1
            elif VEC_RBP.search(line):
                rbp_moves[fn] += 1
            if FRAME_PTR.search(line.rstrip()):
                frame.add(fn)
    for f in frame:
        counts[f] += rbp_moves[f]
    return counts


def is_kernel(fn: str) -> bool:
    return "rows" in fn or "gemm" in fn


def main(argv: list[str]) -> int:
    dirs = argv or [d for d in glob.glob("build/*/") + ["build/"] if os.path.isdir(d)]
    objs = objects(dirs)
    if not any(objs.values()):
        print(f"check_spills: no SIMD kernel objects under {dirs or '(no build dir)'}", file=sys.stderr)
        return 2
    for b in dirs:
        print(f"# {b}: built by {compiler(b)}")
    bad = 0
    for lv in LEVELS:
        if not objs[lv]:
            continue
        total, nfn, nbad = 0, 0, 0
        for o in sorted(objs[lv]):
            for fn, c in spills(o, lv in ARM_LEVELS).items():
                nfn += is_kernel(fn)
                total += c
                if c:
                    kernel = is_kernel(fn)
                    bad += kernel and lv not in ADVISORY
                    nbad += kernel
                    print(f"{lv:<9} {c:4d} stack vector moves in {fn[:150]}{'' if kernel else '  (not a row kernel)'}")
        print(f"{lv:<9} {nfn} row-kernel functions ({nbad} with stack vector moves), "
              f"{total} stack vector moves in all functions{'  (advisory: not failing)' if lv in ADVISORY else ''}")
    if bad:
        print(f"check_spills: {bad} row kernel(s) move vectors to or from the stack (I7)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
