"""Float rows (F32, F16, BF16 weights x float32 activations) on every SIMD level.

tests/test_kernels.py covers these formats at n = 96, a multiple of every vector width.
Here: each level really has its own kernel; rows whose length leaves a tail (n % 8, n % 16)
or is shorter than one vector; long rows (float32 lane accumulation against float64);
I2 (width invariance) and I3 (split invariance) with tails and with every row-tile
remainder; unaligned rows and activations; non-finite and subnormal weights.
"""
import numpy as np
import pytest
from conftest import LEVELS

from lowbit._native import lib
from lowbit.formats import BY_NAME as F

FLOAT = ["F32", "F16", "BF16"]
SIMD = [lv for lv in LEVELS if lv != "scalar"]
ISA = {n: i for i, n in enumerate(lib.isa_names())}


def encode(name, w):
    """float32 w[rows, n] -> the format's raw row bytes, and the float64 values they hold."""
    w = np.ascontiguousarray(w, np.float32)
    if name == "F32":
        raw = w
    elif name == "F16":
        raw = w.astype(np.float16)
    else:  # bfloat16: truncate (the values are whatever the bits say; decoding is exact)
        raw = (w.view(np.uint32) >> 16).astype(np.uint16)
    return raw.view(np.uint8).reshape(w.shape[0], -1), decode(name, raw.view(np.uint8).reshape(w.shape[0], -1))


def decode(name, raw):
    if name == "F32":
        return raw.view(np.float32).astype(np.float64)
    if name == "F16":
        return raw.view(np.float16).astype(np.float64)
    return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def act(x):
    return np.ascontiguousarray(x, np.float32).view(np.uint8).reshape(x.shape[0], -1)


def run(name, raw, a, n, level, threads=1, out=None, r0=0, r1=None):
    rows = raw.shape[0]
    if out is None:
        out = np.zeros((a.shape[0], rows), np.float32)
    lib.matmul_act(F[name].id, raw, a, n, 1.0, out, r0, rows if r1 is None else r1, threads, ISA[level])
    return out


def misaligned(a, offset):
    """A C-contiguous copy of a whose data starts `offset` bytes past a 64-byte boundary."""
    buf = np.zeros(a.nbytes + 128, np.uint8)
    start = (-buf.ctypes.data) % 64 + offset
    b = buf[start:start + a.nbytes].view(a.dtype).reshape(a.shape)
    b[...] = a
    return b


@pytest.mark.parametrize("level", SIMD)
@pytest.mark.parametrize("name", FLOAT)
def test_each_level_has_its_own_kernel(name, level):
    for nt in range(1, 9):
        kname, klevel = lib.kernel(F[name].id, nt, ISA[level])
        assert (kname, klevel) == (f"rows_{name.lower()}_f32_{level}", level)


@pytest.mark.parametrize("level", SIMD)
@pytest.mark.parametrize("name", FLOAT)
def test_tails_and_short_rows_against_float64(rng, name, level):
    for n in [1, 2, 3, 5, 7, 8, 9, 15, 16, 17, 23, 31, 33, 47, 100, 257, 1000]:
        rows = 19
        raw, w64 = encode(name, rng.standard_normal((rows, n)))
        for nt in (1, 3, 8):
            x = rng.standard_normal((nt, n)).astype(np.float32)
            ours = run(name, raw, act(x), n, level)
            ref = x.astype(np.float64) @ w64.T
            err = np.abs(ours - ref).max()
            assert err <= 1e-5 * np.abs(ref).max(), f"{name}/{level} n={n} nt={nt}: err {err:.3g}"
            scalar = run(name, raw, act(x), n, "scalar")
            np.testing.assert_allclose(ours, scalar, rtol=0, atol=1e-5 * np.abs(ref).max())


@pytest.mark.parametrize("level", SIMD)
@pytest.mark.parametrize("name", FLOAT)
def test_long_rows_against_float64(rng, name, level):
    """Float32 lanes over long rows: still within 1e-5 of the largest output (float64)."""
    for n in (4096, 16384 + 5):
        raw, w64 = encode(name, rng.standard_normal((24, n)))
        x = rng.standard_normal((8, n)).astype(np.float32)
        ours = run(name, raw, act(x), n, level)
        ref = x.astype(np.float64) @ w64.T
        err = np.abs(ours - ref).max()
        assert err <= 1e-5 * np.abs(ref).max(), f"{name}/{level} n={n}: err {err:.3g} (max |ref| {np.abs(ref).max():.3g})"


@pytest.mark.parametrize("level", SIMD)
@pytest.mark.parametrize("name", FLOAT)
def test_width_invariance_with_tails(rng, name, level):
    """I2 for row lengths with tails, and for rows long enough that wide windows run in
    column chunks (csrc/x86/floatrows.inl): a token's result is bitwise the same in any window."""
    for n in (13, 16 * 5 + 9, 3 * 1024 + 5):
        rows = 21  # leaves a remainder for every tile height (8, 4, 3, 2, 1)
        raw, _ = encode(name, rng.standard_normal((rows, n)))
        a = act(rng.standard_normal((11, n)))
        alone = np.concatenate([run(name, raw, a[t:t + 1], n, level) for t in range(11)])
        for nt in range(1, 12):
            for t0 in range(0, 11 - nt + 1, 2):
                win = run(name, raw, a[t0:t0 + nt], n, level)
                assert np.array_equal(win.view(np.uint32), alone[t0:t0 + nt].view(np.uint32)), \
                    f"{name}/{level} n={n}: window of {nt} at token {t0} differs from tokens run alone"


@pytest.mark.parametrize("level", SIMD)
@pytest.mark.parametrize("name", FLOAT)
def test_split_invariance_every_remainder(rng, name, level):
    """I3: every row range [r0, r1) gives the rows' bits of the full run and writes nothing else."""
    n, rows = 16 * 3 + 5, 23
    raw, _ = encode(name, rng.standard_normal((rows, n)))
    for nt in (1, 2, 3, 5, 8):
        a = act(rng.standard_normal((nt, n)))
        full = run(name, raw, a, n, level)
        for r0 in range(0, rows, 3):
            for r1 in range(r0, rows + 1, 4):
                out = np.full((nt, rows), np.float32(-7.25))
                run(name, raw, a, n, level, out=out, r0=r0, r1=r1)
                assert np.array_equal(out[:, r0:r1].view(np.uint32), full[:, r0:r1].view(np.uint32))
                assert np.all(out[:, :r0] == np.float32(-7.25)) and np.all(out[:, r1:] == np.float32(-7.25))
        two = run(name, raw, a, n, level, threads=2)
        assert np.array_equal(two.view(np.uint32), full.view(np.uint32))


@pytest.mark.parametrize("level", SIMD)
@pytest.mark.parametrize("name", FLOAT)
def test_unaligned_rows_and_activations(rng, name, level):
    """Any alignment of rows and activations gives the same bits. (avx512 loads F32 rows that
    are 32- but not 64-byte aligned in 32-byte halves: n = 80 at offset 32 and n = 88, whose
    rows are 352 bytes apart, at offset 0 take that path.)"""
    for n in (67, 80, 88):
        rows = 9
        raw, _ = encode(name, rng.standard_normal((rows, n)))
        a = act(rng.standard_normal((5, n)))
        ref = run(name, misaligned(raw, 4), misaligned(a, 4), n, level)
        for off in (0, 1, 2, 32, 36):
            out = run(name, misaligned(raw, off), misaligned(a, (off + 2) % 64), n, level)
            assert np.array_equal(out.view(np.uint32), ref.view(np.uint32)), f"n={n}, offset {off}"


@pytest.mark.parametrize("level", SIMD)
@pytest.mark.parametrize("name", FLOAT)
def test_subnormal_and_nonfinite_weights(rng, name, level):
    """Subnormal weights decode exactly; inf / NaN weights give inf / NaN where float64 does."""
    n, rows = 16 * 2 + 7, 6
    w = rng.standard_normal((rows, n)).astype(np.float32)
    tiny = {"F32": 5e-39, "F16": 3e-6, "BF16": 5e-39}[name]  # subnormal in each format
    w[0] = tiny * np.sign(w[0])
    w[1, 5] = np.inf
    w[2, n - 1] = -np.inf     # in the tail
    w[3, 3] = np.nan
    w[4, 2], w[4, 20] = np.inf, -np.inf
    raw, w64 = encode(name, w)
    x = rng.standard_normal((3, n)).astype(np.float32)
    ours = run(name, raw, act(x), n, level)
    with np.errstate(invalid="ignore"):
        ref = x.astype(np.float64) @ w64.T
    np.testing.assert_array_equal(np.isnan(ours), np.isnan(ref))
    np.testing.assert_array_equal(np.isinf(ours) & (ours > 0), np.isinf(ref) & (ref > 0))
    finite = np.isfinite(ref)
    assert np.abs(ours[finite] - ref[finite]).max() <= 1e-5 * np.abs(ref[finite]).max()
    # row 0 (all subnormal weights): exact products, tiny but not flushed to zero
    r0 = x.astype(np.float64) @ w64[0]
    assert np.all(ours[:, 0] != 0) and np.abs(ours[:, 0] - r0).max() <= 1e-5 * np.abs(r0).max()


@pytest.mark.parametrize("level", SIMD)
@pytest.mark.parametrize("name", FLOAT)
@pytest.mark.parametrize("nt", [1, 2, 3])
def test_prefetching_calls_are_bitwise_the_small_calls(name, level, nt):
    """Calls over >= 2 MB of 2-byte rows at 1 or 2 tokens prefetch the next tile's rows
    (floatrows.inl, kPrefetchBytes): the same arithmetic, so bitwise the rows run as small
    calls (which do not prefetch), and within float32 accumulation of the float64 sums."""
    rng = np.random.default_rng(7)
    n, rows = 2560 + 8, 460  # a tail; 460 x 5136 bytes = 2.4 MB of F16 / BF16 rows
    raw, w64 = encode(name, rng.standard_normal((rows, n)))
    x = rng.standard_normal((nt, n)).astype(np.float32)
    big = run(name, raw, act(x), n, level)
    small = np.zeros_like(big)
    for r0 in range(0, rows, 50):
        run(name, raw, act(x), n, level, out=small, r0=r0, r1=min(rows, r0 + 50))
    diff = np.flatnonzero(big.view(np.uint32) != small.view(np.uint32))
    assert diff.size == 0, f"first differing (token, row): {np.unravel_index(diff[0], big.shape)}"
    ref = x.astype(np.float64) @ w64.T
    np.testing.assert_allclose(big, ref, rtol=0, atol=1e-3 * np.sqrt(n))
