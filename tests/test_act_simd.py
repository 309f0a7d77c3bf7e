"""SIMD activation quantizers (csrc/x86/act.inl): Q8_0, Q8_1, Q8_K, I8_S.

Every level's bytes must equal the scalar reference's (csrc/ref/act.cpp, csrc/ref/ternary.cpp)
and, for the Q8 formats, ggml's from_float (I4), on worst cases built on purpose: zeros, a NaN
or an infinity at every position of a block (the max tree's NaN handling depends on the lane
and on the vector it sits in), denormals, exact .5 ties after scaling, FLT_MAX, equal |x| of
opposite signs (Q8_K keeps the first), random bit patterns. Lengths: one block, several, odd
block counts (and, for I8_S, lengths that are no multiple of the 32-value SIMD chunk).
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import LEVELS

from lowbit._native import lib
from lowbit.formats import BY_NAME as F

ISA = list(lib.isa_names())
FORMATS = ["Q8_0", "Q8_1", "Q8_K", "I8_S"]
GGML_HAS = {"Q8_0", "Q8_1", "Q8_K"}
# the unit a quantizer works in: its block (I8_S: one scale per row)
UNIT = {"Q8_0": 32, "Q8_1": 32, "Q8_K": 256, "I8_S": None}
# lengths in values; odd block counts on purpose
LENGTHS = {
    # Q8_0 / Q8_1 run 8 blocks at a time, then one at a time: 7 = only the second way,
    # 8 and 24 only the first, 11 both
    "Q8_0": [32, 32 * 7, 32 * 8, 32 * 11, 256 * 3],
    "Q8_1": [32, 32 * 7, 32 * 8, 32 * 11, 256 * 3],
    "Q8_K": [256, 256 * 3, 256 * 5],
    "I8_S": [1, 31, 32, 33, 32 * 7, 256 * 3 + 5],
}
FMAX = np.finfo(np.float32).max
TINY = np.finfo(np.float32).tiny          # smallest normal
DENORM = np.float32(1e-45)                # smallest denormal
NEG_NAN = np.array([0xFFC00000], np.uint32).view(np.float32)[0]   # x86's default NaN
PAY_NAN = np.array([0x7FA12345], np.uint32).view(np.float32)[0]   # signalling, with a payload


def _unit(name: str, n: int) -> int:
    return UNIT[name] or n


def _rows_each_position(name: str, n: int, fill, value) -> np.ndarray:
    """One row per position p of the unit: `value` at position p of every unit, `fill` (an
    array of n values) elsewhere. I8_S units are whole rows: at most 64 positions, spread."""
    u = _unit(name, n)
    ps = range(u) if u <= 256 else np.linspace(0, u - 1, 64).astype(int)
    rows = []
    for p in ps:
        r = np.array(fill, np.float32).copy()
        r[p::u] = value
        rows.append(r)
    return np.stack(rows)


def case_rows(case: str, name: str, n: int, rng) -> np.ndarray:
    u = _unit(name, n)
    normal = rng.standard_normal(n).astype(np.float32)
    if case == "zeros":
        return np.stack([np.zeros(n, np.float32), -np.zeros(n, np.float32),
                         np.where(rng.random(n) < 0.5, 0.0, -0.0).astype(np.float32)])
    if case == "nan_each_position":
        return np.concatenate([_rows_each_position(name, n, normal, v) for v in (np.nan, NEG_NAN, PAY_NAN)])
    if case == "nan_blocks":  # all NaN; NaN and zeros; two NaNs of different payloads
        r2 = np.zeros(n, np.float32)
        r2[::3] = np.nan
        r3 = normal.copy()
        r3[1::u] = PAY_NAN
        r3[u - 1::u] = NEG_NAN
        return np.stack([np.full(n, np.nan, np.float32), r2, r3])
    if case == "inf_each_position":
        return np.concatenate([_rows_each_position(name, n, normal, v) for v in (np.inf, -np.inf)])
    if case == "inf_and_nan":
        r = normal.copy()
        r[::u] = np.inf
        r2 = normal.copy()
        r2[::u] = -np.inf
        r2[min(5, u - 1)::u] = np.nan
        r3 = np.zeros(n, np.float32)
        r3[::u] = np.inf
        return np.stack([r, r2, r3, np.full(n, -np.inf, np.float32)])
    if case == "denormals":
        d = (rng.integers(1, 1 << 23, n).astype(np.uint32)).view(np.float32) * np.where(rng.random(n) < 0.5, 1, -1)
        d = d.astype(np.float32)
        mixed = np.where(rng.random(n) < 0.5, d, np.float32(TINY) * rng.integers(1, 64, n)).astype(np.float32)
        # around 127 / FLT_MAX (~3.7e-37), where 127 / amax overflows
        thr = np.float32(127) / FMAX
        edge = np.nextafter(thr, np.float32(0), dtype=np.float32)
        near = (rng.random(n) * thr).astype(np.float32)
        e1, e2, e3 = near.copy(), near.copy(), near.copy()
        e1[::u] = edge
        e2[::u] = thr
        e3[::u] = np.nextafter(thr, np.float32(1), dtype=np.float32)
        return np.stack([d, mixed, np.full(n, DENORM, np.float32), e1, e2, e3])
    if case == "ties":
        # amax = 127 * 2^e makes the scale an exact power of two, so x = (k + .5) * 2^e lands on
        # k + .5 exactly after scaling: every value of the row is a tie (sign of max varied)
        rows = []
        for e, sign in ((0, 1), (0, -1), (1, 1), (-3, -1), (5, 1)):
            k = rng.integers(-127, 127, n)
            r = ((k + 0.5) * 2.0 ** e).astype(np.float32)
            r[rng.integers(0, u)::u] = np.float32(sign * 127 * 2.0 ** e)
            rows.append(r)
        return np.stack(rows)
    if case == "flt_max":
        r1 = normal.copy()
        r1[::u] = FMAX
        r2 = (normal * np.float32(1e37)).astype(np.float32)
        r2[3 % u::u] = -FMAX
        r3 = np.where(rng.random(n) < 0.5, FMAX, -FMAX).astype(np.float32)
        r4 = np.full(n, np.nextafter(FMAX, np.float32(0), dtype=np.float32), np.float32)
        return np.stack([r1, r2, r3, r4])
    if case == "mixed":
        mag = np.exp(rng.uniform(np.log(1e-40), np.log(3e38), (4, n))).astype(np.float32)
        sgn = np.where(rng.random((4, n)) < 0.5, 1, -1).astype(np.float32)
        rows = list(mag * sgn) + [normal, -normal, (normal * 1e-3).astype(np.float32)]
        # equal |x| of opposite signs in one unit: the first one decides Q8_K's sign (pairs in
        # one 8-lane vector, in two vectors, at the unit's two ends; and three of them)
        for a, b in ((1, 6), (2, 9), (0, u - 1), (7, 8)):
            for first in (5.0, -5.0):
                r = (normal * 0.1).astype(np.float32)
                r[a % u::u] = first
                r[b % u::u] = -first
                if b % u != a % u and u > 12:
                    r[12::u] = first
                rows.append(r)
        return np.stack(rows).astype(np.float32)
    if case == "random_bits":  # any float32 at all
        return rng.integers(0, 1 << 32, (8, n), dtype=np.uint64).astype(np.uint32).view(np.float32)
    raise AssertionError(case)


CASES = ["zeros", "nan_each_position", "nan_blocks", "inf_each_position", "inf_and_nan", "denormals",
         "ties", "flt_max", "mixed", "random_bits"]


def first_difference(name: str, n: int, x: np.ndarray, a: np.ndarray, b: np.ndarray, what: str) -> str:
    """The first differing unit (row, block index, its inputs, both byte strings)."""
    f = F[name]
    rows = np.nonzero((a != b).any(axis=1))[0]
    r = int(rows[0])
    if UNIT[name] is None:
        return (f"{name} n={n} row {r} ({what}): header ours {a[r, :8].tobytes().hex()} "
                f"theirs {b[r, :8].tobytes().hex()}; first differing byte {int(np.nonzero(a[r] != b[r])[0][0])}; "
                f"input {x[r].tolist()}")
    bb = f.bytes
    blk = int(np.nonzero((a[r].reshape(-1, bb) != b[r].reshape(-1, bb)).any(axis=1))[0][0])
    u = UNIT[name]
    xin = x[r, blk * u:(blk + 1) * u]
    return (f"{name} n={n} row {r} block {blk} ({what}):\n  input {xin.tolist()}\n"
            f"  input bits {[hex(v) for v in xin.view(np.uint32).tolist()]}\n"
            f"  ours   {a[r, blk * bb:(blk + 1) * bb].tobytes().hex()}\n"
            f"  theirs {b[r, blk * bb:(blk + 1) * bb].tobytes().hex()}")


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("name", FORMATS)
def test_quant_act_bytes(request, ggml, name, level, case, rng):
    for n in LENGTHS[name]:
        x = np.ascontiguousarray(case_rows(case, name, n, rng), dtype=np.float32)
        ours = lib.quantize_act(F[name].id, x, ISA.index(level))
        ref = lib.quantize_act(F[name].id, x, 0)
        assert ours.tobytes() == ref.tobytes(), first_difference(name, n, x, ours, ref, f"{level} vs scalar")
        if name in GGML_HAS:
            theirs = ggml.from_float(name, x)
            assert ours.tobytes() == theirs.tobytes(), first_difference(name, n, x, ours, theirs, f"{level} vs ggml")


@pytest.mark.parametrize("name", FORMATS)
def test_rows_are_independent(name, rng):
    """A row's bytes do not depend on the rows quantized before it (no state carried over)."""
    n = LENGTHS[name][1]
    x = rng.standard_normal((5, n)).astype(np.float32)
    x[2, :] = np.nan
    for level in LEVELS:
        all_rows = lib.quantize_act(F[name].id, x, ISA.index(level))
        for r in range(5):
            one = lib.quantize_act(F[name].id, np.ascontiguousarray(x[r:r + 1]), ISA.index(level))
            assert one.tobytes() == all_rows[r:r + 1].tobytes(), f"{name}/{level} row {r}"


@pytest.mark.parametrize("level", [lv for lv in LEVELS if lv != "scalar"])
@pytest.mark.parametrize("name", FORMATS)
def test_simd_quantizer_runs_at_its_level(name, level):
    """Each SIMD level quantizes with its own kernel, named by operands and level."""
    k = lib.quant_act_kernel(F[name].id, ISA.index(level))
    disabled = lib.cpu_info()["disabled"]
    expect = f"quant_act_{name.lower()}_{level}"
    if expect in disabled:
        pytest.skip(f"{expect} turned off by LOWBIT_NO_")
    assert k == (expect, level)


def test_scalar_level_runs_the_reference():
    for name in FORMATS:
        assert lib.quant_act_kernel(F[name].id, 0) == (f"quant_act_{name.lower()}_scalar", "scalar")


def test_no_quantizer_switch_falls_back_and_is_reported():
    """LOWBIT_NO_<QUANTIZER>=1 turns one SIMD quantizer off: the level below runs it, lowbit
    info names it as disabled and lists the quantizer that runs."""
    probe = ("import json, lowbit; from lowbit._native import lib; "
             "print(json.dumps({f.name: lib.quant_act_kernel(f.id) for f in lowbit.formats() if f.activation}))")
    base = json.loads(subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout)
    assert base["Q8_0"] is not None
    name, level = base["Q8_0"]
    code = "import sys; from lowbit.cli import main; sys.argv = ['lowbit', 'info']; main()"
    info = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert name in info.stdout
    if level == "scalar":
        return  # the reference is never turned off
    env = {**os.environ, "LOWBIT_NO_" + name.upper(): "1"}
    after = json.loads(subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                                      env=env).stdout)
    assert after["Q8_0"][0] != name and after["Q8_1"] == base["Q8_1"]
    info = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    disabled = [ln for ln in info.stdout.splitlines() if ln.startswith("disabled")]
    assert disabled and name in disabled[0] and after["Q8_0"][0] in info.stdout


def test_bench_act_reports_each_format(ggml):
    """`lowbit bench act` times ours, the reference and ggml's from_float on one input (the
    numbers are not checked: timing never decides a test)."""
    import io

    from lowbit.bench import bench_act
    out = io.StringIO()
    res = bench_act(FORMATS, n=256, rows=2, reps=3, out=out)
    assert [r["format"] for r in res] == FORMATS
    for r in res:
        assert r["quantizer"] == lib.quant_act_kernel(F[r["format"]].id)[0]
        assert r["lowbit_ns_per_value"] > 0 and r["scalar_ns_per_value"] > 0
        assert (r["ggml_ns_per_value"] is None) == (r["format"] not in GGML_HAS)
        assert r["quantizer"] in out.getvalue()
