"""The levels built to the scalar reference's arithmetic: x86 avx (AVX without AVX2/FMA/F16C) and,
on aarch64, neon / dotprod / i8mm (csrc/x86/avx/avx.h, csrc/arm/simd.h).

Their quantized row kernels are bitwise the reference's (the same exact integer sums, then the
reference's float steps in its order, one token per lane), so a token's output is bitwise the
same alone, in any window and under any row split (I2, I3) by construction; their activation
quantizers are byte-identical to the reference's (I4); their float rows sum exact products in
double (within 1e-6 of the reference). On this x86 CPU the level under test is avx (skipped only
where the CPU lacks AVX, SSSE3 or SSE4.1, or LOWBIT_MAX_ISA is below avx); the aarch64 levels
are proven by tools/test_arm.sh under qemu-aarch64.
"""
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import LEVELS, REFERENCE_LEVELS

from lowbit._native import lib
from lowbit.formats import BY_NAME as F

ISA = list(lib.isa_names())
REF_LEVELS = [lv for lv in LEVELS if lv in REFERENCE_LEVELS]
needs_level = pytest.mark.skipif(not REF_LEVELS, reason="the CPU has no avx (AVX+SSSE3+SSE4.1) or the cap is below it")

# what the avx level covers (csrc/x86/avx/register.cpp); the aarch64 levels cover more
QUANT = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "IQ4_NL", "MXFP4", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]
FLOAT = ["F32", "F16", "BF16"]
ACTS = ["Q8_0", "Q8_1", "Q8_K", "I8_S"]


def run(name, raw, act, n, level, out=None, r0=0, r1=None, threads=1):
    rows = raw.shape[0]
    if out is None:
        out = np.zeros((act.shape[0], rows), np.float32)
    lib.matmul_act(F[name].id, raw, act, n, 1.0, out, r0, rows if r1 is None else r1, threads, ISA.index(level))
    return out


def bits(a):
    return np.ascontiguousarray(a).view(np.uint32)


@needs_level
@pytest.mark.parametrize("level", REF_LEVELS)
@pytest.mark.parametrize("name", QUANT + FLOAT)
def test_the_level_has_its_own_kernels(name, level):
    for nt in range(1, 9):
        kname, klevel = lib.kernel(F[name].id, nt, ISA.index(level))
        assert klevel == level and kname == f"rows_{name.lower()}_{F[name].act.lower()}_{level}", (kname, klevel)
    if name in ACTS:
        assert lib.quant_act_kernel(F[name].id, ISA.index(level))[1] == level


@needs_level
@pytest.mark.parametrize("level", REF_LEVELS)
@pytest.mark.parametrize("name", QUANT)
@pytest.mark.parametrize("nblocks", [1, 3, 9])
def test_quantized_rows_bitwise_the_reference(ggml, rng, name, level, nblocks):
    """Random ggml-quantized weights, odd row counts, every window 1..8 at two offsets, a split."""
    n = F[name].block * nblocks
    rows = 13
    w = rng.standard_normal((rows, n)).astype(np.float32)
    w[:, ::7] *= 5.0
    raw = ggml.quantize(name, w)
    x = rng.standard_normal((11, n)).astype(np.float32) * np.exp(rng.uniform(-3, 3, (11, 1))).astype(np.float32)
    act = lib.quantize_act(F[F[name].act].id, x, 0)
    ref = np.concatenate([run(name, raw, act[t:t + 1], n, "scalar") for t in range(11)])
    for nt in range(1, 9):
        for t0 in (0, 11 - nt):
            ours = run(name, raw, act[t0:t0 + nt], n, level)
            assert np.array_equal(bits(ours), bits(ref[t0:t0 + nt])), f"{name}/{level}/nt={nt}/t0={t0}"
    out = np.full((8, rows), np.float32(-7.25))
    run(name, raw, act[:8], n, level, out=out, r0=1, r1=5)
    run(name, raw, act[:8], n, level, out=out, r0=5, r1=12)
    assert np.array_equal(bits(out[:, 1:12]), bits(ref[:8, 1:12])) and np.all(out[:, [0, 12]] == np.float32(-7.25))


@needs_level
@pytest.mark.parametrize("level", REF_LEVELS)
@pytest.mark.parametrize("name", QUANT)
def test_worst_case_codes_exact(ggml, name, level):
    """I1: every code byte 0xFF or 0x00 (scales 1) against activations of all +-127: the outputs are
    the exact integer sums, bitwise the reference's."""
    f = F[name]
    n = f.block * 3
    for byte in (0xFF, 0x00):
        raw = np.full((3, n // f.block * f.bytes), byte, np.uint8)
        x = np.where(np.arange(n) % 2 == 0, 1.0, -1.0).astype(np.float32)
        x = np.stack([x, -x, np.ones(n, np.float32)])
        act = lib.quantize_act(F[f.act].id, x, 0)
        ours, ref = run(name, raw, act, n, level), run(name, raw, act, n, "scalar")
        assert np.array_equal(bits(ours), bits(ref)), (name, level, byte)


@needs_level
@pytest.mark.parametrize("level", REF_LEVELS)
@pytest.mark.parametrize("name", FLOAT)
@pytest.mark.parametrize("n", [1, 7, 64, 259])
def test_float_rows_close_to_the_reference_and_invariant(rng, name, level, n):
    rows = 5
    w = rng.standard_normal((rows, n)).astype(np.float32)
    if name == "F16":
        raw = w.astype(np.float16).view(np.uint8).reshape(rows, -1)
    elif name == "BF16":
        raw = (w.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8).reshape(rows, -1)
    else:
        raw = w.view(np.uint8).reshape(rows, -1)
    x = rng.standard_normal((9, n)).astype(np.float32)
    act = np.ascontiguousarray(x).view(np.uint8).reshape(9, -1)
    ref = run(name, raw, act, n, "scalar")
    alone = np.concatenate([run(name, raw, act[t:t + 1], n, level) for t in range(9)])
    assert np.abs(alone - ref).max() <= 1e-6 * max(np.abs(ref).max(), 1e-30)
    for nt in range(1, 9):
        assert np.array_equal(bits(run(name, raw, act[:nt], n, level)), bits(alone[:nt])), (name, level, nt)


@needs_level
@pytest.mark.parametrize("level", REF_LEVELS)
@pytest.mark.parametrize("name", ACTS)
def test_quantizers_byte_identical(rng, name, level):
    n = 768
    edge = np.array([0.0, -0.0, 0.5, -0.5, 1.5, 2.5, 127.0, 1e-40, -1e-39, 1.2e-38, 3.4e38, -3.4e38,
                     np.inf, -np.inf, np.nan, 1e-45], np.float32)
    rows = [rng.standard_normal(n).astype(np.float32) * np.float32(s) for s in (1e-30, 1e-3, 1.0, 1e4, 1e30)]
    rows += [rng.choice(edge, n).astype(np.float32) for _ in range(4)]
    rows += [np.zeros(n, np.float32), ((np.arange(n) % 255) - 127).astype(np.float32) / 2]
    for x in rows:
        a = lib.quantize_act(F[name].id, x[None, :], 0)
        b = lib.quantize_act(F[name].id, x[None, :], ISA.index(level))
        assert np.array_equal(a, b), (name, level, np.flatnonzero(a != b)[:5])


def test_max_isa_avx_selects_avx():
    """`LOWBIT_MAX_ISA=avx lowbit info` selects avx on a CPU with AVX; a level of another
    architecture is a one-line error."""
    env = dict(os.environ, LOWBIT_MAX_ISA="avx")
    r = subprocess.run([sys.executable, "-c", "from lowbit._native import lib; print(lib.cpu_info()['selected'])"],
                       env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    has_avx = "avx" in lib.cpu_info()["features"]
    assert r.stdout.strip() == ("avx" if has_avx else "scalar")
    env["LOWBIT_MAX_ISA"] = "neon"
    r = subprocess.run([sys.executable, "-m", "lowbit.cli", "info"], env=env, capture_output=True, text=True)
    assert r.returncode != 0 and "neon is not one of" in r.stderr and "Traceback" not in r.stderr, r.stderr
