"""The amx level (csrc/x86/gemm.inl's mk_amx, mk_amx_legacy, mk_amx_i2s, csrc/x86/amx_tiles.h): the k-quant
family's, the legacy formats' and I2_S's GEMMs with AMX-INT8 tiles for the sub-block / block / row dots
(I2_S's at every level: tests/test_i2s_gemm.py), and the emulator that runs the same code on any x86 CPU with
avx2 (LOWBIT_AMX=emulate).

  - the emulator's tile product (TDPBUSD: a unsigned x b signed; TDPBSUD: a signed x b unsigned,
    b in the VNNI layout) equals numpy's int64 product reduced modulo 2^32, at the shapes the GEMM
    configures (K = 32 and 16 bytes, 16 and 8 tokens per row of B) and the largest (64 bytes);
    every byte value, the extremes included;
  - it raises on the shapes the hardware faults on (C's rows not A's, B's rows not A's bytes / 4,
    B's bytes not C's, more than 16 rows or 64 bytes), so a wrong configuration in the GEMM cannot
    pass the tests here and fault on an AMX CPU;
  - the amx GEMM of every k-quant-family and legacy format is BITWISE the windows at the level (I8), on the
    emulator (a child process with LOWBIT_AMX=emulate; .ci/run also runs tests/test_gemm.py so),
    and on the hardware where the CPU has AMX (tests/test_gemm.py at the amx level);
  - dispatch: LOWBIT_AMX=emulate adds the level (named amx, its GEMMs gemm_<format>_q8_k_amx in the
    counters, `lowbit info` saying it is emulated); any other value is a one-line error; a CPU with
    amx_tile and amx_int8 (and the avx512 level) gets the level, or a note saying why not.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from lowbit._native import lib

X86 = "avx2" in lib.isa_names() and "avx2" in lib.levels()
NEEDS_AVX2 = pytest.mark.skipif(not X86, reason="the AMX emulator runs at the avx2 level: needs CPU flags avx2, fma, f16c")


def tile_product(a, b, uw):
    """numpy's C = A . B of a tile product: a[M, 4K] bytes, b[K, 4N] bytes in the VNNI layout"""
    M, K4 = a.shape
    K, N4 = b.shape
    A = a.astype(np.int64) if uw else a.view(np.int8).astype(np.int64)
    B = b.view(np.int8).astype(np.int64) if uw else b.astype(np.int64)
    Bt = B.reshape(K, N4 // 4, 4).transpose(0, 2, 1).reshape(K * 4, N4 // 4)  # [k-group * 4 + i, n]
    C = A @ Bt
    return ((C + 2**31) % 2**32 - 2**31).astype(np.int32)


@NEEDS_AVX2
@pytest.mark.parametrize("uw", [True, False])
@pytest.mark.parametrize("m,kb,n", [(16, 32, 16), (16, 16, 16), (16, 32, 8), (16, 16, 8), (16, 64, 16), (5, 12, 3)])
def test_emulator_tile_product_equals_numpy(rng, uw, m, kb, n):
    for case in ("random", "extremes", "max"):
        if case == "random":
            a = rng.integers(0, 256, (m, kb), dtype=np.uint8)
            b = rng.integers(0, 256, (kb // 4, 4 * n), dtype=np.uint8)
        elif case == "extremes":  # 0, 127, 128, 255 as either operand's bytes
            a = rng.choice(np.array([0, 127, 128, 255], np.uint8), (m, kb))
            b = rng.choice(np.array([0, 127, 128, 255], np.uint8), (kb // 4, 4 * n))
        else:  # the largest magnitudes: 255 x -128 (uw) or -128 x 255
            a = np.full((m, kb), 255 if uw else 128, np.uint8)
            b = np.full((kb // 4, 4 * n), 128 if uw else 255, np.uint8)
        got = lib.amx_emulator_dp(a, b, uw, m, 4 * n)
        want = tile_product(a, b, uw)
        assert got.shape == want.shape and np.array_equal(got, want), (case, np.argwhere(got != want)[:4])


@NEEDS_AVX2
@pytest.mark.parametrize("a_shape,b_shape,c_rows,c_colsb,what", [
    ((16, 32), (8, 64), 8, 64, "rows"),        # C's rows are not A's
    ((16, 32), (4, 64), 16, 64, "B has 4 rows"),  # B's rows are not A's bytes / 4
    ((16, 32), (8, 64), 16, 32, "colsb"),      # B's bytes per row are not C's
    ((16, 32), (8, 64), 17, 64, "17 rows"),    # more than 16 rows
    ((16, 32), (8, 64), 16, 68, "68 bytes"),   # more than 64 bytes
])
def test_emulator_faults_where_the_hardware_would(a_shape, b_shape, c_rows, c_colsb, what):
    a = np.ones(a_shape, np.uint8)
    b = np.ones(b_shape, np.uint8)
    with pytest.raises(RuntimeError, match="AMX emulator") as e:
        lib.amx_emulator_dp(a, b, True, c_rows, c_colsb)
    assert what in str(e.value), str(e.value)


# The formats whose GEMM the amx level replaces (gemm.inl register_gemm under LOWBIT_AMX), emulated
# (over avx2: Q8_0 keeps avx2's GEMM, the sign trick's)
# (Q6_K, Q3_K, IQ2_XS, IQ2_S, IQ1_M: the amx level leaves them to the level below: gemm.inl amx_takes)
AMX_FORMATS = ["Q4_K", "Q5_K", "Q2_K", "IQ4_XS", "IQ3_XXS", "IQ3_S", "IQ2_XXS", "IQ1_S", "TQ2_0", "TQ1_0"]
AMX_LEGACY = ["Q4_0", "Q4_1", "Q5_0", "Q5_1"]
ACT = {"Q4_1": "Q8_1", "Q5_1": "Q8_1", "Q4_0": "Q8_0", "Q5_0": "Q8_0"}

# A child with LOWBIT_AMX=emulate: every format's amx GEMM (path 2) against the windows (path 1)
# at the amx level, bitwise, at token counts that cut lane vectors and row counts that cut 16-row
# groups and tiles; prints one JSON line {"bad": [...], "kernels": [...]}.
CHILD = r"""
import json, sys
import numpy as np
from lowbit._native import lib
from lowbit import kernels
from lowbit.formats import BY_NAME as F
fmts = sys.argv[1].split(",")
ISA = lib.isa_names(); lv = ISA.index("amx")
rng = np.random.default_rng(7)
bad = []
ACT = json.loads(sys.argv[2])
for name in fmts:
    for rows, nb in ((1, 1), (17, 2), (37, 3), (70, 1)):
        n = 256 * nb + (32 * 9 if name in ACT else 0)  # legacy rows: 17, 25, 33 blocks (classes cut)
        w = rng.standard_normal((rows, n)).astype(np.float32)
        w[rows // 2, n // 3] = 30.0
        raw = np.ascontiguousarray(kernels.quantize(name, w, imatrix=np.ones(n, np.float32)).reshape(rows, -1))
        act = lib.quantize_act(F[ACT.get(name, "Q8_K")].id, (rng.standard_normal((41, n)) * 2).astype(np.float32), lv)
        for nt in (1, 8, 9, 16, 17, 41):
            a = np.ascontiguousarray(act[:nt])
            o = [np.zeros((nt, rows), np.float32) for _ in range(2)]
            for path in (1, 2):
                lib.matmul_act(F[name].id, raw, a, n, 1.0, o[path - 1], 0, rows, 2 if nt == 41 else 1, lv, path, False)
            if not np.array_equal(o[0].view(np.uint32), o[1].view(np.uint32)):
                i = np.unravel_index(np.argmax(np.abs(o[0] - o[1])), o[0].shape)
                bad.append([name, rows, nb, nt, [int(v) for v in i], float(o[0][i]), float(o[1][i])])
print(json.dumps({"bad": bad, "kernels": sorted({s["kernel"] for s in kernels.stats() if s["nt"] == 0}),
                  "info": {k: lib.cpu_info()[k] for k in ("selected", "amx_emulated", "notes")}}))
"""


def run_emulated(code, *args, env=None):
    e = {**os.environ, "LOWBIT_AMX": "emulate", **(env or {})}
    e.pop("LOWBIT_MAX_ISA", None)
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=e, timeout=900)


@NEEDS_AVX2
@pytest.mark.parametrize("fmts", [AMX_FORMATS[:5], AMX_FORMATS[5:], AMX_LEGACY],
                         ids=["k-quants,IQ4_XS", "grid-i-quants,ternary", "legacy"])
def test_amx_gemm_emulated_bitwise_equals_windows(fmts):
    r = run_emulated(CHILD, ",".join(fmts), json.dumps(ACT))
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res["bad"] == [], res["bad"][:5]  # [format, rows, width, nt, worst (token, row), windows, amx]
    assert res["kernels"] == sorted(f"gemm_{f.lower()}_{ACT.get(f, 'Q8_K').lower()}_amx" for f in fmts), res["kernels"]
    assert res["info"]["selected"] == "amx" and res["info"]["amx_emulated"] is True
    assert any("emulated" in n for n in res["info"]["notes"]), res["info"]


@NEEDS_AVX2
def test_amx_emulated_level_in_info_and_bad_setting():
    r = run_emulated("from lowbit.cli import main; raise SystemExit(main(['info']))")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "emulated" in r.stdout and "gemm_q4_k_q8_k_amx" in r.stdout, r.stdout[-3000:]
    r = run_emulated("from lowbit.cli import main; raise SystemExit(main(['info']))", env={"LOWBIT_AMX": "yes"})
    assert r.returncode != 0 and "LOWBIT_AMX=yes" in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]


@NEEDS_AVX2
def test_amx_gemm_turned_off_leaves_the_level_below():
    """LOWBIT_NO_<amx GEMM>=1 turns one amx GEMM off: that format's chunks take the level below's
    GEMM (the amx level has no windows of its own to pair with none)."""
    # the level below amx: avx2 on an AVX2-only CPU, avx512 (or avx2vnni) where the CPU has it
    code = ("from lowbit._native import lib; from lowbit.formats import BY_NAME as F; I = lib.isa_names();"
            "L = lib.levels(); below = L[L.index('amx') - 1];"
            "print(below, lib.gemm_kernel(F['Q4_K'].id, I.index('amx')),"
            " lib.gemm_kernel(F['Q5_K'].id, I.index('amx')), lib.gemm_kernel(F['Q4_K'].id, I.index(below)))")
    r = run_emulated(code, env={"LOWBIT_NO_GEMM_Q4_K_Q8_K_AMX": "1"})
    assert r.returncode == 0, r.stderr[-2000:]
    line = r.stdout.strip().splitlines()[-1]
    below = line.split()[0]
    assert below in ("avx2", "avx2vnni", "avx512"), line
    assert line.count(f"gemm_q4_k_q8_k_{below}") == 2 and "gemm_q5_k_q8_k_amx" in line, line


def cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


HW = {"amx_tile", "amx_int8", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni"}


@pytest.mark.skipif(not HW <= cpu_flags(), reason="needs CPU flags amx_tile, amx_int8 (and the avx512 level's)")
def test_amx_cpu_gets_the_level_or_a_reason():
    """On an AMX CPU the probe must offer the level (the hardware's tiles), or say why not (the
    kernel refused the tile state); the GEMM tests then run at it (tests/test_gemm.py)."""
    c = lib.cpu_info()
    if os.environ.get("LOWBIT_MAX_ISA") or os.environ.get("LOWBIT_AMX"):
        pytest.skip("LOWBIT_MAX_ISA / LOWBIT_AMX set: the level is capped or emulated")
    assert "amx_int8" in c["features"], c
    assert "amx" in lib.levels() or any("refused" in n for n in c["notes"]), c
    if "amx" in lib.levels():
        assert c["selected"] == "amx" and not c["amx_emulated"]


@pytest.mark.skipif(not HW <= cpu_flags(), reason="needs CPU flags amx_tile, amx_int8 (and the avx512 level's)")
@pytest.mark.parametrize("fmt,n", [("Q4_K", 512), ("TQ2_0", 512), ("Q4_1", 96), ("Q5_1", 64)])
def test_amx_crossover_keeps_avx512_gemm_below_it(rng, fmt, n):
    """KernelEntry::gemm_cross: where the tiles beat avx512's GEMM only from some width (measured per
    format, csrc/x86/gemm.inl amx_cross), a chunk with fewer GEMM tokens runs avx512's GEMM (the
    counters name it), from the crossover the tiles; every token bitwise its one-token windows' (I8).
    LOWBIT_AMX_CROSS=0: no crossover."""
    from lowbit import kernels
    from lowbit.formats import BY_NAME
    c = lib.cpu_info()
    if "amx" not in lib.levels() or c["amx_emulated"] or c["selected"] != "amx":
        pytest.skip("the amx level is not selected (capped, emulated or refused)")
    fid = BY_NAME[fmt].id
    gemm, low = lib.gemm_kernel(fid), lib.gemm_low(fid)
    assert gemm[0] == f"gemm_{fmt.lower()}_{BY_NAME[fmt].act.lower()}_amx" and low is not None, (gemm, low)
    assert low[0] == gemm[0].replace("_amx", "_avx512") and low[1] == "avx512" and low[2] > gemm[2], low
    cross = low[2]
    raw = np.ascontiguousarray(kernels.quantize(fmt, rng.standard_normal((40, n)).astype(np.float32)))
    raw = raw.view(np.uint8).reshape(40, -1)
    # (lanes of 16, a tail of <= 4 to the windows: cross - 1 and cross run whole through a GEMM,
    # cross + 2 runs cross tokens through the tiles and 2 through the windows)
    for nt, want in ((max(gemm[2], cross - 9), low[0]), (cross - 1, low[0]), (cross, gemm[0]), (cross + 2, gemm[0])):
        x = rng.standard_normal((nt, n)).astype(np.float32)
        kernels.reset_stats()
        y = kernels.matmul(fmt, raw, x, threads=2)
        ran = sorted({s["kernel"] for s in kernels.stats() if s.get("nt") == 0})
        assert ran == [want], (nt, ran)
        one = np.concatenate([kernels.matmul(fmt, raw, x[t:t + 1], threads=2) for t in range(nt)])
        bad = np.argwhere(y.view(np.uint32) != one.view(np.uint32))
        assert not len(bad), f"{fmt} nt={nt}: first differing (token, row) {bad[0]}: {y[tuple(bad[0])]} vs {one[tuple(bad[0])]}"
    r = subprocess.run([sys.executable, "-c", f"from lowbit._native import lib; print(lib.gemm_low({fid}))"],
                       capture_output=True, text=True, env={**os.environ, "LOWBIT_AMX_CROSS": "0"})
    assert r.returncode == 0 and r.stdout.strip() == "None", (r.stdout, r.stderr[-2000:])
