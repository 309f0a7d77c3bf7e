"""Ternary SIMD kernels (csrc/x86/ternary.inl): I2_S x I8_S, TQ2_0 / TQ1_0 x Q8_K.

Every level's kernels claim BITWISE the scalar reference's result (exact integer sums, then
the reference's float steps lane-wise), so most checks here are exact:
  - I1 at the avx2 fold boundaries: rows of 1, 5, 6, 9, 10, 11, 20, 21 I2_S blocks (FOLD_N = 10
    blocks of int16 partials between widenings; GEMV_FOLD_N = 5 for the one-token form, whose
    planes 0 and 2 are decoded as 4 x code), worst-case codes (all 2, all 3 via 0xFF bytes, random
    bytes) and activations +-127 / -128, every level, nt 1..8, against an int64 numpy reference;
  - LOWBIT_I2S_FOLD=1 (fold every block, registered at import as a second avx2 kernel) gives
    bitwise the same output as the deferred fold (run in a subprocess: the variable is read once);
  - TQ2_0 / TQ1_0 against the reference arithmetic replayed in numpy (int64 block sums, float32
    steps in block order), worst-case and random bytes, every level, nt 1..8;
  - I2_S weights from lowbit's quantizer: dequantize equals the ternary float64 reference and
    matmul is within I5 of float64.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import FMA_LEVELS, LEVELS

from lowbit import kernels as K
from lowbit._native import lib
from lowbit.formats import BY_NAME as F

ISA = list(lib.isa_names())
SIMD_LEVELS = [lv for lv in LEVELS if lv != "scalar"]
FOLD_N = 10  # csrc/x86/ternary.inl: floor(32767 / (4 * 2 * 3 * 127))
GEMV_FOLD_N = 5  # the avx2 one-token form (4 x code planes): floor(32767 / (2 * 2 * 4 * 3 * 127))
I2S_BLOCKS = [1, 5, 6, 9, 10, 11, 20, 21]


def run(name, raw, act, n, level, w_scale=1.0, threads=1):
    out = np.full((act.shape[0], raw.shape[0]), np.float32(-7.25))
    lib.matmul_act(F[name].id, raw, act, n, w_scale, out, 0, raw.shape[0], threads, ISA.index(level))
    return out


def same_bits(a, b):
    return np.array_equal(np.asarray(a, np.float32).view(np.uint32), np.asarray(b, np.float32).view(np.uint32))


# ---- I2_S ------------------------------------------------------------------------------------

def i2s_codes(raw, n):
    """codes[rows, n] in weight order (csrc/formats.h: byte j = weights j, 32+j, 64+j, 96+j)."""
    b = raw.reshape(raw.shape[0], -1, 32)
    return np.stack([(b >> s) & 3 for s in (6, 4, 2, 0)], axis=2).reshape(raw.shape[0], n).astype(np.int64)


def i8s_rows(q, scale=1.0):
    """I8_S rows by hand: float scale, int32 sum, int8 q (so q may hold -128, which the
    quantizer never writes but a row of raw bytes can)."""
    q = np.asarray(q, np.int64)
    out = np.zeros((q.shape[0], 8 + q.shape[1]), np.uint8)
    out[:, 0:4] = np.frombuffer(np.float32(scale).tobytes(), np.uint8)
    out[:, 4:8] = q.sum(axis=1).astype("<i4").view(np.uint8).reshape(-1, 4)
    out[:, 8:] = q.astype(np.int8).view(np.uint8)
    return out


def i2s_expected(raw, act, n, w_scale):
    """The reference expression, exact: S in int64, then (float)(S - act_sum) / scale * w_scale
    in float32 steps (numpy float32 ops round like C's)."""
    S = act[:, 8:].view(np.int8).astype(np.int64) @ i2s_codes(raw, n).T  # [nt, rows]
    scale = act[:, 0:4].copy().view(np.float32)                           # [nt, 1]
    total = act[:, 4:8].copy().view("<i4").astype(np.int64)               # [nt, 1]
    return ((S - total).astype(np.float32) / scale) * np.float32(w_scale), S


def act_patterns(nt, n, rng):
    """nt token rows of int8 values, each token a different worst case."""
    k = np.arange(n)
    pats = [np.full(n, 127), np.full(n, -127), np.full(n, -128), np.where(k % 2, 127, -127),
            np.where(k % 2, 127, -128), np.where((k // 32) % 2, -128, 127),
            rng.choice([-128, -127, 127], n), rng.integers(-128, 128, n)]
    return np.stack([pats[(t * 3 + 1) % len(pats)] if t >= len(pats) else pats[t] for t in range(nt)])


def weight_patterns(rows, nb, rng):
    """Rows of all-2 codes (0xAA), all-3 codes (0xFF), random bytes (codes 0..3) and mixes."""
    w = np.empty((rows, nb * 32), np.uint8)
    w[0] = 0xAA
    w[1] = 0xFF
    w[2] = rng.integers(0, 256, nb * 32)
    w[3] = np.where(rng.random(nb * 32) < 0.5, 0xFF, 0x00)
    for r in range(4, rows):
        w[r] = rng.choice(np.array([0x00, 0x55, 0xAA, 0xFF], np.uint8), nb * 32)
    return w


@pytest.mark.parametrize("nb", I2S_BLOCKS)
@pytest.mark.parametrize("level", LEVELS)
def test_i2s_fold_boundary_exact(rng, level, nb):
    """I1 at the fold boundary: every (row, token) equals the int64 reference bitwise, so no
    int16 partial wrapped or saturated; also the sum itself, which is exact in float here."""
    n = nb * 128
    raw = weight_patterns(6, nb, rng)
    for nt in range(1, 9):
        act = i8s_rows(act_patterns(nt, n, rng))
        ours = run("I2_S", raw, act, n, level)
        want, S = i2s_expected(raw, act, n, 1.0)
        bad = np.argwhere(ours.view(np.uint32) != want.view(np.uint32))
        assert bad.size == 0, (f"{level}/{nb} blocks/nt={nt}: {len(bad)} outputs differ, first (token, row) "
                               f"{tuple(bad[0])}: ours {ours[tuple(bad[0])]} want {want[tuple(bad[0])]}")
        # |S - sum| < 2^24 here, so the float output is the exact integer
        total = act[:, 4:8].copy().view("<i4").astype(np.int64)
        np.testing.assert_array_equal(ours.astype(np.int64), S - total)


def test_i2s_worst_case_magnitude_reaches_the_bound(rng):
    """The FOLD_N-block worst case really approaches int16's limit per lane (so the test above
    would catch a too-large FOLD_N): all-3 codes x -128 for 10 blocks = -30720 per lane."""
    per_lane_block = 4 * 2 * 3 * 128
    assert FOLD_N * per_lane_block <= 32768 < (FOLD_N + 1) * per_lane_block
    assert FOLD_N * 4 * 2 * 3 * 127 <= 32767 < (FOLD_N + 1) * 4 * 2 * 3 * 127
    # one token: a lane of the 4 x code accumulator adds 2 planes x 2 products 4 * 3 * q per block
    assert GEMV_FOLD_N * 2 * 2 * 4 * 3 * 128 <= 32768 < (GEMV_FOLD_N + 1) * 2 * 2 * 4 * 3 * 128


@pytest.mark.parametrize("level", LEVELS)
def test_i2s_random_rows_equal_reference_bitwise(rng, level):
    """Random codes (0..3), random int8 activations with real scales, w_scale != 1, odd row
    count, 37 blocks (3 fold groups + a tail of 7), nt 1..8 and 11 (chunked): bitwise the
    reference expression; and equal for every thread split."""
    nb, rows = 37, 13
    n = nb * 128
    raw = rng.integers(0, 256, (rows, nb * 32), dtype=np.uint8)
    x = rng.standard_normal((11, n)).astype(np.float32)
    w_scale = 0.0371
    for nt in list(range(1, 9)) + [11]:
        act = lib.quantize_act(F["I8_S"].id, x[:nt], ISA.index(level))
        ours = run("I2_S", raw, act, n, level, w_scale)
        want, _ = i2s_expected(raw, act, n, w_scale)
        assert same_bits(ours, want), f"{level}/nt={nt}"
        assert same_bits(run("I2_S", raw, act, n, level, w_scale, threads=2), ours)


@pytest.mark.parametrize("level", LEVELS)
def test_i2s_quantizer_against_float64(rng, level):
    """lowbit's I2_S quantizer: dequantize is the ternary float64 reference (absmean scale,
    round-half-even of W / scale clamped to -1..1), and matmul is within I5 of float64."""
    rows, n = 24, 128 * 20
    w = rng.standard_normal((rows, n)).astype(np.float32)
    w[:, ::13] *= 5.0
    flat = K.quantize("I2_S", w)
    rb = F["I2_S"].row_bytes(n)
    raw = flat[: rows * rb].reshape(rows, rb)
    w_scale = float(flat[rows * rb: rows * rb + 4].view("<f4")[0])
    assert np.float32(w_scale) == np.float32(np.abs(w.astype(np.float64)).mean())
    q = np.clip(np.rint(w / np.float32(w_scale)), -1, 1)
    np.testing.assert_array_equal(i2s_codes(raw, n) - 1, q.astype(np.int64))
    deq = lib.dequantize(F["I2_S"].id, raw, n, w_scale, ISA.index(level))
    np.testing.assert_array_equal(deq, (q * np.float32(w_scale)).astype(np.float32))
    x = rng.standard_normal((8, n)).astype(np.float32)
    for nt in range(1, 9):
        act = lib.quantize_act(F["I8_S"].id, x[:nt], ISA.index(level))
        ours = run("I2_S", raw, act, n, level, w_scale)
        xq = act[:, 8:].view(np.int8) / act[:, 0:4].copy().view(np.float32).astype(np.float64)
        ref = xq @ (q.astype(np.float64) * w_scale).T
        assert np.abs(ours - ref).max() <= 1e-5 * np.abs(ref).max(), f"{level}/nt={nt}"


_FOLD_CHILD = r"""
import json, sys
import numpy as np
from lowbit._native import lib
raw, act = np.load(sys.argv[1]), np.load(sys.argv[2])
n, levels = int(sys.argv[3]), json.loads(sys.argv[4])
res = {"names": {}}
outs = {}
for lv in levels:
    isa = list(lib.isa_names()).index(lv)
    res["names"][lv] = lib.kernel(36, 1, isa)[0]
    for nt in range(1, 9):
        out = np.zeros((nt, raw.shape[0]), np.float32)
        lib.matmul_act(36, raw, act[:nt], n, 0.5, out, 0, raw.shape[0], 1, isa)
        outs[f"{lv}_{nt}"] = out
np.savez(sys.argv[5], **outs)
print(json.dumps(res))
"""


def _run_child(tmp_path, env_extra, raw, act, n, levels, tag):
    np.save(tmp_path / "raw.npy", raw)
    np.save(tmp_path / "act.npy", act)
    env = dict(os.environ)
    env.pop("LOWBIT_I2S_FOLD", None)
    env.update(env_extra)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    out = tmp_path / f"{tag}.npz"
    p = subprocess.run([sys.executable, "-c", _FOLD_CHILD, str(tmp_path / "raw.npy"), str(tmp_path / "act.npy"),
                        str(n), json.dumps(levels), str(out)], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1]), np.load(out)


@pytest.mark.skipif("avx2" not in LEVELS, reason="needs the avx2 level: CPU flags avx2, fma, f16c, under LOWBIT_MAX_ISA >= avx2")
def test_forced_fold_is_bitwise_identical(rng, tmp_path):
    """LOWBIT_I2S_FOLD=1 selects the fold-every-block avx2 kernel (its own name); its output
    is bitwise the deferred kernel's, for random and worst-case rows, nt 1..8."""
    nb = 2 * FOLD_N + 3
    n = nb * 128
    raw = np.concatenate([rng.integers(0, 256, (9, nb * 32), dtype=np.uint8), weight_patterns(5, nb, rng)])
    act = np.concatenate([lib.quantize_act(F["I8_S"].id, rng.standard_normal((4, n)).astype(np.float32)),
                          i8s_rows(act_patterns(4, n, rng))])
    default, a = _run_child(tmp_path, {}, raw, act, n, ["avx2"], "deferred")
    forced, b = _run_child(tmp_path, {"LOWBIT_I2S_FOLD": "1"}, raw, act, n, ["avx2"], "forced")
    assert default["names"]["avx2"] == "rows_i2_s_i8_s_avx2"
    assert forced["names"]["avx2"] == "rows_i2_s_i8_s_avx2_fold1"
    for k in a.files:
        assert same_bits(a[k], b[k]), k
        nt = int(k.split("_")[1])
        want, _ = i2s_expected(raw, act[:nt], n, 0.5)
        assert same_bits(a[k], want), k


# ---- TQ2_0 / TQ1_0 ---------------------------------------------------------------------------

def tq2_codes(raw, n):
    """codes[rows, n]: qs[32h + m] bits 2l..2l+1 = weight 128h + 32l + m (0..3)."""
    qs = raw.reshape(raw.shape[0], -1, 66)[:, :, :64].reshape(raw.shape[0], -1, 2, 32)
    c = np.stack([(qs >> (2 * l)) & 3 for l in range(4)], axis=3)  # [rows, nb, h, l, m]
    return c.reshape(raw.shape[0], n).astype(np.int64)


def tq1_codes(raw, n):
    """codes[rows, n] (trits 0..2) by the reference's definition (csrc/ref/ternary.cpp)."""
    b = raw.reshape(raw.shape[0], -1, 54).astype(np.int64)
    rows, nb = b.shape[:2]

    def trit(byte, k):
        return (((byte * 3 ** k) & 0xFF) * 3) >> 8

    c = np.empty((rows, nb, 256), np.int64)
    for k in range(5):
        c[:, :, 32 * k:32 * k + 32] = trit(b[:, :, 0:32], k)
        c[:, :, 160 + 16 * k:176 + 16 * k] = trit(b[:, :, 32:48], k)
    for k in range(4):
        c[:, :, 240 + 4 * k:244 + 4 * k] = trit(b[:, :, 48:52], k)
    return c.reshape(rows, n)


def tq_expected(name, raw, act, n):
    """The reference's arithmetic replayed: per block S_b = sum (code - 1) q (int64), then
    sumf = sumf + (float)S_b * (d_act * d_w) in float32, block order."""
    rows, nb = raw.shape[0], n // 256
    f = F[name]
    codes = (tq2_codes if name == "TQ2_0" else tq1_codes)(raw, n).reshape(rows, nb, 256) - 1
    d_off = 64 if name == "TQ2_0" else 52
    dw = raw.reshape(rows, nb, f.bytes)[:, :, d_off:d_off + 2].copy().view(np.float16).astype(np.float32)[:, :, 0]
    a = act.reshape(act.shape[0], nb, 292)
    da = a[:, :, 0:4].copy().view(np.float32)[:, :, 0]        # [nt, nb]
    q = a[:, :, 4:260].view(np.int8).astype(np.int64)         # [nt, nb, 256]
    S = np.einsum("tbk,rbk->trb", q, codes)                   # [nt, rows, nb]
    out = np.zeros((act.shape[0], rows), np.float32)
    for b in range(nb):
        d = da[:, b][:, None] * dw[:, b][None, :]             # float32 product
        out = out + S[:, :, b].astype(np.float32) * d
    return out


def q8k_rows(q, d):
    """Q8_K rows by hand: per block float d, int8 qs[256], int16 bsums[16]."""
    nt, n = q.shape
    nb = n // 256
    out = np.zeros((nt, nb, 292), np.uint8)
    qb = q.reshape(nt, nb, 256)
    out[:, :, 0:4] = np.asarray(d, np.float32).reshape(nt, nb, 1).view(np.uint8)
    out[:, :, 4:260] = qb.astype(np.int8).view(np.uint8)
    out[:, :, 260:292] = qb.reshape(nt, nb, 16, 16).sum(axis=3).astype("<i2").view(np.uint8).reshape(nt, nb, 32)
    return out.reshape(nt, nb * 292)


def tq_weights(name, rows, nb, rng, pattern):
    f = F[name]
    if pattern == "max":
        raw = np.full((rows, nb, f.bytes), 0xFF, np.uint8)
    elif pattern == "two":
        raw = np.full((rows, nb, f.bytes), 0xAA, np.uint8)
    else:
        raw = rng.integers(0, 256, (rows, nb, f.bytes), dtype=np.uint8)
    d_off = 64 if name == "TQ2_0" else 52
    d = rng.uniform(0.25, 2.0, (rows, nb)).astype(np.float16) * rng.choice([-1, 1], (rows, nb)).astype(np.float16)
    raw[:, :, d_off:d_off + 2] = d[:, :, None].view(np.uint8)
    return raw.reshape(rows, nb * f.bytes)


@pytest.mark.parametrize("nb", [1, 3, 5, 6, 7])
@pytest.mark.parametrize("pattern", ["max", "two", "random"])
@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("name", ["TQ2_0", "TQ1_0"])
def test_tq_exact(rng, name, level, pattern, nb):
    """Worst-case codes (0xFF: TQ2_0 code 3), activations +-127 / -128 / random, 1..7 blocks
    (the one-token form's steps of 4, 2 and 1 blocks and their remainders), nt 1..8: bitwise
    the reference arithmetic (exact int16/int32 block sums)."""
    rows = 7
    n = nb * 256
    raw = tq_weights(name, rows, nb, rng, pattern)
    for nt in range(1, 9):
        q = act_patterns(nt, n, rng)
        act = q8k_rows(q, rng.uniform(0.001, 0.1, (nt, nb)))
        ours = run(name, raw, act, n, level)
        want = tq_expected(name, raw, act, n)
        bad = np.argwhere(ours.view(np.uint32) != want.view(np.uint32))
        assert bad.size == 0, (f"{name}/{level}/{pattern}/nt={nt}: {len(bad)} differ, first {tuple(bad[0])}: "
                               f"ours {ours[tuple(bad[0])]} want {want[tuple(bad[0])]}")


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("name", ["TQ2_0", "TQ1_0"])
def test_tq_quantized_rows_equal_reference_bitwise(ggml, rng, name, level):
    """ggml-quantized weights, Q8_K activations from lowbit's quantizer, 10 blocks, 13 rows,
    nt 1..8 and 11: bitwise the reference replay and the scalar level; any thread split."""
    rows, n = 13, 2560
    raw = ggml.quantize(name, rng.standard_normal((rows, n)).astype(np.float32))
    x = rng.standard_normal((11, n)).astype(np.float32)
    for nt in list(range(1, 9)) + [11]:
        act = lib.quantize_act(F["Q8_K"].id, x[:nt], ISA.index(level))
        ours = run(name, raw, act, n, level)
        assert same_bits(ours, tq_expected(name, raw, act, n)), f"{name}/{level}/nt={nt}"
        assert same_bits(ours, run(name, raw, act, n, "scalar"))
        assert same_bits(run(name, raw, act, n, level, threads=2), ours)


# ---- the table ---------------------------------------------------------------------------------

@pytest.mark.parametrize("level", FMA_LEVELS)  # avx leaves the ternary formats to the reference
@pytest.mark.parametrize("name", ["I2_S", "TQ2_0", "TQ1_0"])
def test_every_level_has_its_own_kernel(name, level):
    act = F[name].act.lower()
    for nt in range(1, 9):
        kname, klevel = lib.kernel(F[name].id, nt, ISA.index(level))
        assert klevel == level and kname.startswith(f"rows_{name.lower()}_{act}_{level}"), (kname, klevel)
