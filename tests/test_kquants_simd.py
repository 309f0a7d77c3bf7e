"""The SIMD k-quant row kernels (csrc/x86/kquants.inl) beyond the shared suite of test_kernels.py.

- every SIMD level this CPU runs has k-quant kernels of its own, for every window size;
- exact integer decoding: with all fp16 scales 1.0, activations of scale 1 and sums below
  2^24, every float operation of every level is exact, so every output must equal the int64
  dot of the dequantized codes, bit for bit, for ANY weight bytes (random, all ones, ...);
- avx2, avx2vnni and avx512 run the same float arithmetic (GROUPS, see the .inl's header) on
  exact integer sums, so their outputs are bitwise equal on any input (the GEMM tier rests on it);
- longer rows (16 super-blocks) against float64 within I5's 1e-5, every window size;
- width invariance (I2) over windows of 1..8 on longer rows with outlier activations.
"""
import gguf
import numpy as np
import pytest
from conftest import LEVELS

from lowbit._native import lib
from lowbit.formats import BY_NAME as F

KQ = ["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]
SIMD = [lv for lv in LEVELS if lv != "scalar"]
ISA = {n: i for i, n in enumerate(lib.isa_names())}
FP16_AT = {"Q2_K": [80, 82], "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208]}
QK = 256


def run(name, raw, act, n, level, threads=1):
    out = np.zeros((act.shape[0], raw.shape[0]), np.float32)
    lib.matmul_act(F[name].id, raw, act, n, 1.0, out, 0, raw.shape[0], threads, ISA[level])
    return out


def q8k(x, level):
    return lib.quantize_act(F["Q8_K"].id, np.ascontiguousarray(x, dtype=np.float32), ISA[level])


def act_values(act, n):
    """float64 activations of Q8_K rows (f32 d, int8 qs[256], int16 bsums[16])."""
    b = act.reshape(act.shape[0], -1, 292)
    d = b[:, :, 0:4].copy().view(np.float32).astype(np.float64)
    return (d * b[:, :, 4:260].view(np.int8)).reshape(act.shape[0], n)


def dequant(name, raw, n):
    return gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[name]).astype(np.float64).reshape(raw.shape[0], n)


@pytest.mark.parametrize("level", SIMD)
@pytest.mark.parametrize("name", KQ)
def test_every_simd_level_has_its_own_kernels(name, level):
    for nt in range(1, 9):
        kname, klevel = lib.kernel(F[name].id, nt, ISA[level])
        assert klevel == level and kname == f"rows_{name.lower()}_q8_k_{level}", (name, nt, kname, klevel)


def exact_weights(name, rows, nb, pattern, rng):
    """Any code and scale bytes, with every fp16 scale (d, dmin) set to 1.0."""
    f = F[name]
    if pattern == "random":
        raw = rng.integers(0, 256, (rows, nb, f.bytes), dtype=np.uint8)
    else:
        raw = np.full((rows, nb, f.bytes), {"ones": 0xFF, "alt": 0x55, "zero": 0x00}[pattern], np.uint8)
    for off in FP16_AT[name]:
        raw[:, :, off:off + 2] = np.frombuffer(np.float16(1.0).tobytes(), np.uint8)
    return raw.reshape(rows, nb * f.bytes)


def exact_acts(nt, n, rng):
    """Integer activations with one +-127 per super-block (so the Q8_K scale is exactly 1)
    and small values elsewhere: every dot, partial and total, stays below 2^24."""
    x = rng.integers(-7, 8, (nt, n)).astype(np.float32)
    x[:, ::QK] = np.where(rng.random((nt, n // QK)) < 0.5, -127.0, 127.0)
    return x


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("name", KQ)
@pytest.mark.parametrize("pattern", ["random", "ones", "alt", "zero"])
def test_integer_decoding_is_exact(rng, name, level, pattern):
    rows, nb = 9, 2
    n = nb * QK
    raw = exact_weights(name, rows, nb, pattern, rng)
    w = dequant(name, raw, n)
    assert np.all(w == np.round(w)), "with scales 1.0 every dequantized weight is an integer"
    for nt in (1, 3, 4, 5, 8):
        act = q8k(exact_acts(nt, n, rng), level)
        a = act_values(act, n)
        assert np.all(np.abs(a) <= 127) and np.all(a == np.round(a))
        ref = a @ w.T  # exact in float64
        assert np.abs(ref).max() < 2**24
        ours = run(name, raw, act, n, level)
        bad = np.argwhere(ours.astype(np.float64) != ref)
        assert bad.size == 0, (f"{name}/{level}/{pattern}/nt={nt}: {len(bad)} outputs differ, first (token, row) "
                               f"{tuple(bad[0])}: ours {ours[tuple(bad[0])]} exact {ref[tuple(bad[0])]}")


GROUPS_LEVELS = [lv for lv in ("avx2", "avx2vnni", "avx512") if lv in LEVELS]


@pytest.mark.skipif(len(GROUPS_LEVELS) < 2, reason="needs two of avx2 / avx2vnni / avx512 (CPU flags avx2+fma, avx_vnni, avx512f/bw/vl/dq/vnni)")
@pytest.mark.parametrize("name", KQ)
def test_groups_levels_are_bitwise_equal(ggml, rng, name):
    """avx2, avx2vnni and avx512 form I and M differently (maddubs+madd, dpwssd, 512-bit lanes
    folded to 8) but take the same float steps on the same exact sums: bitwise equal outputs."""
    rows, n = 13, 6 * QK
    w = rng.standard_normal((rows, n)).astype(np.float32)
    w[3, 100] = 40.0  # an outlier block
    raw = ggml.quantize(name, w)
    for nt in range(1, 9):
        act = q8k(rng.standard_normal((nt, n)) * 3.0, "avx2")
        base = run(name, raw, act, n, GROUPS_LEVELS[0])
        for lv in GROUPS_LEVELS[1:]:
            got = run(name, raw, act, n, lv)
            bad = np.flatnonzero(base.view(np.uint32) != got.view(np.uint32))
            assert bad.size == 0, (f"{name}/nt={nt}: {lv} != {GROUPS_LEVELS[0]} at flat index {bad[0]}: "
                                   f"{got.flat[bad[0]]!r} vs {base.flat[bad[0]]!r}")


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("name", KQ)
def test_long_rows_against_float64(ggml, rng, name, level):
    rows, n = 11, 16 * QK
    w = rng.standard_normal((rows, n)).astype(np.float32)
    w[:, ::29] *= 6.0
    raw = ggml.quantize(name, w)
    wd = dequant(name, raw, n)
    for nt in range(1, 9):
        act = q8k(rng.standard_normal((nt, n)), level)
        ref = act_values(act, n) @ wd.T
        err = np.abs(run(name, raw, act, n, level).astype(np.float64) - ref).max()
        assert err <= 1e-5 * np.abs(ref).max(), f"{name}/{level}/nt={nt}: rel err {err / np.abs(ref).max():.3g}"


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("name", KQ)
@pytest.mark.parametrize("nb", [8, 7, 1])  # odd: the one-token kernel's super-block pairs leave one
def test_width_invariance_long_rows(ggml, rng, name, level, nb):
    rows, n = 6, nb * QK
    raw = ggml.quantize(name, rng.standard_normal((rows, n)).astype(np.float32))
    x = rng.standard_normal((9, n)).astype(np.float32)
    x[3, ::97] = 80.0  # one token with outliers: a different activation scale per block
    act = q8k(x, level)
    alone = np.concatenate([run(name, raw, act[t:t + 1], n, level) for t in range(9)])
    for nt in range(2, 9):
        for t0 in range(0, 9 - nt + 1):
            win = run(name, raw, act[t0:t0 + nt], n, level)
            assert np.array_equal(win.view(np.uint32), alone[t0:t0 + nt].view(np.uint32)), \
                f"{name}/{level}: window of {nt} at token {t0}"
