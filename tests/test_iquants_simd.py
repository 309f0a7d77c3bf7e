"""i-quant SIMD kernels (csrc/x86/iquants.inl): IQ4_XS, IQ2_XXS, IQ2_XS, IQ3_XXS, IQ3_S, IQ2_S,
IQ1_S, IQ1_M against Q8_K.

  - every SIMD level registers its own kernels for every format and window: rows[1] the
    nt = 1 kernel (..._nt1_<level>), rows[2..8] the window kernel (the token-count gate);
  - I1 on worst-case blocks, built field by field from the layouts of csrc/formats.h: every
    byte 0xff (maximal grid indices, every sign bit, maximal scales), the grid rows of largest
    magnitude and of largest adjacent pair (maddubs adds pairs) with all signs set and all
    clear, IQ4_XS's code -127 at both extreme scales, and random bytes; one block per row, d
    = 1.0, activations +-127 (Q8_K d = +-1). The exact value (float64 from gguf-py's
    dequantization: dyadic, exact) then reaches float32 through one rounding only, so every
    level must return exactly np.float32(exact), for every window size;
  - I2 on those blocks: each token's bits are the same alone and in windows of 2..8 (the nt = 1
    kernel uses the sign scheme, windows of 3+ the offset scheme: one exact integer);
  - multi-block rows of the same blocks within 2^-22 of float64 (float sums over blocks).
"""
import gguf
import numpy as np
import pytest
from conftest import FMA_LEVELS, LEVELS

from lowbit import kernels as K
from lowbit._native import lib
from lowbit.formats import BY_NAME as F

ISA = list(lib.isa_names())
SIMD_LEVELS = [lv for lv in LEVELS if lv != "scalar"]
FORMATS = ["IQ4_XS", "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ3_S", "IQ2_S", "IQ1_S", "IQ1_M"]
ONE = 0x3C00  # fp16 1.0


def run(name, raw, act, n, level, threads=1):
    out = np.full((act.shape[0], raw.shape[0]), np.float32(-7.25))
    lib.matmul_act(F[name].id, raw, act, n, 1.0, out, 0, raw.shape[0], threads, ISA.index(level))
    return out


def same_bits(a, b):
    return np.array_equal(np.asarray(a, np.float32).view(np.uint32), np.asarray(b, np.float32).view(np.uint32))


# ---- block builders (csrc/formats.h layouts; one 256-weight block each) --------------------

def grid(name):
    c = getattr(gguf.quants, name)
    c.init_grid()
    return np.asarray(c.grid, dtype=np.int64).reshape(c.grid_shape)


def interesting_rows(name):
    """Grid row indices: the last (all index bits set), the largest |sum|, the largest |pair|."""
    g = grid(name)
    pairs = np.abs(g[:, 0::2] + g[:, 1::2]).max(axis=1)
    return sorted({len(g) - 1, int(np.abs(g).sum(axis=1).argmax()), int(pairs.argmax())})


def u16(x):
    return np.asarray(x, "<u2").tobytes()


def u32(x):
    return np.asarray(x, "<u4").tobytes()


def s7_of(sign):  # 7 stored sign bits; the 8th is their parity, so "all set" is 0xff
    return 0x7F if sign else 0


def iq2_xxs(idx, sign, scale=15):
    out = u16(ONE)
    for g in range(8):
        aux = sum(s7_of(sign) << (7 * l) for l in range(4)) | scale << 28
        out += bytes(int(i) for i in idx[4 * g:4 * g + 4]) + u32(aux)
    return out


def iq2_xs(idx, sign, scale=15):
    return u16(ONE) + u16([int(i) | s7_of(sign) << 9 for i in idx]) + bytes([scale | scale << 4] * 8)


def iq2_s(idx, sign, scale=15):
    qh = [sum(((int(idx[4 * g + l]) >> 8) & 3) << (2 * l) for l in range(4)) for g in range(8)]
    return (u16(ONE) + bytes(int(i) & 255 for i in idx) + bytes([0xFF if sign else 0] * 32) + bytes(qh)
            + bytes([scale | scale << 4] * 8))


def iq3_xxs(idx, sign, scale=15):
    aux = [sum(s7_of(sign) << (7 * l) for l in range(4)) | scale << 28] * 8
    return u16(ONE) + bytes(int(i) for i in idx) + u32(aux)


def iq3_s(idx, sign, scale=15):
    qh = [sum(((int(idx[8 * g + k]) >> 8) & 1) << k for k in range(8)) for g in range(8)]
    return (u16(ONE) + bytes(int(i) & 255 for i in idx) + bytes(qh) + bytes([0xFF if sign else 0] * 32)
            + bytes([scale | scale << 4] * 4))


def iq1_s(idx, sign, scale=7):
    qh = [sum(((int(idx[4 * g + l]) >> 8) & 7) << (3 * l) for l in range(4)) | scale << 12 | (0x8000 if sign else 0)
          for g in range(8)]
    return u16(ONE) + bytes(int(i) & 255 for i in idx) + u16(qh)


def iq1_m(idx, sign, scale=7):
    nib = [((int(idx[k]) >> 8) & 7) | (8 if sign else 0) for k in range(32)]
    qh = bytes(nib[2 * j] | nib[2 * j + 1] << 4 for j in range(16))
    words = []
    for w in range(4):  # 3-bit scales of chunks 4w..4w+3, fp16 d in the top nibbles
        words.append(sum(scale << (3 * k) for k in range(4)) | ((ONE >> (4 * w)) & 0xF) << 12)
    return bytes(int(i) & 255 for i in idx) + qh + u16(words)


def iq4_xs(code, ls):
    """All 256 codes = code, every 6-bit scale field = ls (the weight scale is ls - 32)."""
    sh = sum((ls >> 4) << (2 * ib) for ib in range(8))
    sl = bytes([(ls & 15) | (ls & 15) << 4] * 4)
    return u16(ONE) + u16(sh) + sl + bytes([code | code << 4] * 128)


BUILD = {"IQ2_XXS": (iq2_xxs, 32), "IQ2_XS": (iq2_xs, 32), "IQ2_S": (iq2_s, 32), "IQ3_XXS": (iq3_xxs, 64),
         "IQ3_S": (iq3_s, 64), "IQ1_S": (iq1_s, 32), "IQ1_M": (iq1_m, 32)}


def worst_rows(name, rng):
    """uint8[rows, bytes] of one-block rows: 0xff bytes, extreme rows and signs, random bytes."""
    f = F[name]
    rows = []
    allff = np.full(f.bytes, 0xFF, np.uint8)
    if name == "IQ1_M":  # d lives in the scale words: keep it 1.0
        allff[48:56] = np.frombuffer(iq1_m([2047] * 32, True)[48:56], np.uint8)
    else:
        allff[0:2] = np.frombuffer(u16(ONE), np.uint8)
    rows.append(allff)
    if name == "IQ4_XS":
        for code in (0, 15):           # kvalues -127 and 113
            for ls in (0, 63):         # scales -32 and 31
                rows.append(np.frombuffer(iq4_xs(code, ls), np.uint8))
    else:
        build, count = BUILD[name]
        base = "IQ1_S" if name == "IQ1_M" else name
        for r in interesting_rows(base):
            for sign in (True, False):
                rows.append(np.frombuffer(build([r] * count, sign), np.uint8))
        mixed = rng.choice(interesting_rows(base), count)
        rows.append(np.frombuffer(build(mixed, True), np.uint8))
    for _ in range(3):
        b = rng.integers(0, 256, f.bytes, dtype=np.uint8)
        if name == "IQ1_M":  # random 3-bit scales, d = 1.0 in the top nibbles
            words = b[48:56].view("<u2") & 0x0FFF
            b[48:56] = (words | np.frombuffer(allff[48:56].tobytes(), "<u2") & 0xF000).astype("<u2").view(np.uint8)
        else:
            b[0:2] = allff[0:2]
        rows.append(b)
    raw = np.stack([np.asarray(r, np.uint8) for r in rows])
    assert raw.shape[1] == f.bytes
    return raw


def act_patterns(nt, n, rng):
    """Q8_K activations of +-127 (d = +-1: exact): all +, all -, alternating, pairs, random."""
    base = [np.full(n, 127.0), np.full(n, -127.0), np.where(np.arange(n) % 2, 127.0, -127.0),
            np.where(np.arange(n) // 2 % 2, 127.0, -127.0)]
    pats = [base[t] if t < len(base) else rng.choice([-127.0, 127.0], n) for t in range(nt)]
    return K.quantize_act("Q8_K", np.asarray(pats, np.float32))


def exact(name, raw, act, n):
    w = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[name]).astype(np.float64).reshape(raw.shape[0], n)
    b = act.reshape(act.shape[0], -1, 292)
    d = b[:, :, 0:4].copy().view(np.float32).astype(np.float64)
    a = (d * b[:, :, 4:260].view(np.int8)).reshape(act.shape[0], n)
    assert np.all(a == np.round(a)) and np.all(np.abs(a) == 127)
    return a @ w.T  # exact: dyadic values, sums far below 2^53


# ---- tests -------------------------------------------------------------------------------------

@pytest.mark.parametrize("level", FMA_LEVELS)  # avx leaves these to the reference (IQ4_NL: test_legacy_simd)
@pytest.mark.parametrize("name", FORMATS)
def test_every_level_has_its_own_kernels(name, level):
    for nt in range(1, 9):
        kname, klevel = lib.kernel(F[name].id, nt, ISA.index(level))
        want = f"rows_{name.lower()}_q8_k{'_nt1' if nt == 1 else ''}_{level}"
        assert (kname, klevel) == (want, level), (name, level, nt, kname, klevel)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("name", FORMATS)
def test_worst_case_blocks_exact(name, level):
    rng = np.random.default_rng(sum(map(ord, name + level)))
    raw = worst_rows(name, rng)
    n = 256
    for nt in (1, 2, 3, 5, 8):
        act = act_patterns(nt, n, rng)
        ref = exact(name, raw, act, n)
        ours = run(name, raw, act, n, level)
        bad = np.argwhere(ours != np.float32(ref))
        assert bad.size == 0, (f"{name}/{level}/nt={nt}: token {bad[0][0]}, row {bad[0][1]}: ours "
                               f"{ours[tuple(bad[0])]!r}, exact {ref[tuple(bad[0])]!r}; block "
                               f"{raw[bad[0][1]].tobytes().hex()}")


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("name", FORMATS)
def test_worst_case_width_invariance(name, level):
    rng = np.random.default_rng(sum(map(ord, name + level)) + 1)
    raw = worst_rows(name, rng)
    n = 256
    act = act_patterns(8, n, rng)
    alone = np.concatenate([run(name, raw, act[t:t + 1], n, level) for t in range(8)])
    for nt in range(2, 9):
        for t0 in range(0, 9 - nt):
            assert same_bits(run(name, raw, act[t0:t0 + nt], n, level), alone[t0:t0 + nt]), \
                f"{name}/{level}: window of {nt} at token {t0} differs from its tokens alone"


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("name", FORMATS)
def test_worst_case_multiblock_rows(name, level):
    rng = np.random.default_rng(sum(map(ord, name + level)) + 2)
    blocks = worst_rows(name, rng)
    rows = np.stack([np.concatenate(blocks[rng.integers(0, len(blocks), 5)]) for _ in range(9)])
    n = 5 * 256
    for nt in (1, 4, 7):
        act = act_patterns(nt, n, rng)
        ref = exact(name, rows, act, n)
        err = np.abs(run(name, rows, act, n, level) - ref).max()
        assert err <= 2.0**-22 * max(np.abs(ref).max(), 1.0), f"{name}/{level}/nt={nt}: err {err}"
