"""The legacy-format SIMD kernels (csrc/x86/legacy.inl, iq4nl.inl) beyond tests/test_kernels.py.

test_kernels.py's shapes have at most 4 blocks per row; these kernels work in groups of 8 blocks
and pairs of 2 (a tail group and a lone last block take other paths), and choose a strategy per
window size (token-transposed for chunks of 4 tokens, block-transposed for the rest). So here:
row lengths of 1..40 blocks and a long one, every window size, every level; plus the two
properties the design gives beyond the contract: every SIMD level returns bitwise the same
floats (same integer sums, same float operations), and worst-case codes in full groups.
"""
import numpy as np
import pytest
from conftest import FMA_LEVELS, LEVELS, REFERENCE_LEVELS, legacy_extremes

from lowbit._native import lib
from lowbit.formats import BY_NAME as F

FORMATS = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "IQ4_NL", "MXFP4"]
SIMD = [lv for lv in LEVELS if lv != "scalar"]
ISA = {n: i for i, n in enumerate(lib.isa_names())}
# blocks per row: lone blocks, a pair, odd tails, exactly one and two groups, groups + tails
NBLOCKS = [1, 2, 3, 7, 8, 9, 15, 16, 17, 24, 29, 40, 131]


def run(name, raw, act, n, level, out=None, r0=0, r1=None, threads=1):
    rows = raw.shape[0]
    if out is None:
        out = np.zeros((act.shape[0], rows), np.float32)
    lib.matmul_act(F[name].id, raw, act, n, 1.0, out, r0, rows if r1 is None else r1, threads, ISA[level])
    return out


def make(ggml, rng, name, rows, nb, nt):
    n = 32 * nb
    w = rng.standard_normal((rows, n)).astype(np.float32)
    w[:, ::17] *= 4.0
    raw = ggml.quantize(name, w)
    x = rng.standard_normal((nt, n)).astype(np.float32)
    act = lib.quantize_act(F[F[name].act].id, x, 0)
    return raw, act, n


@pytest.mark.parametrize("level", SIMD)
@pytest.mark.parametrize("name", FORMATS)
def test_every_level_has_its_own_kernel(name, level):
    for nt in range(1, 9):
        k = lib.kernel(F[name].id, nt, ISA[level])
        assert k is not None and k[1] == level, (name, level, nt, k)
        assert k[0] == f"rows_{name.lower()}_{F[name].act.lower()}_{level}"


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("nb", NBLOCKS)
def test_lengths_against_ggml(ggml, rng, name, nb):
    """I5 at every row length (full groups, tails, a lone last block) and window size."""
    raw, act, n = make(ggml, rng, name, 5, nb, 8)
    ref = ggml.vec_dot(name, raw, act, n).astype(np.float64)
    scale = max(np.abs(ref).max(), 1e-30)
    for level in SIMD:
        for nt in range(1, 9):
            ours = run(name, raw, act[:nt], n, level)
            err = np.abs(ours - ref[:nt]).max()
            assert err <= 1e-5 * scale, f"{name}/{level}/nb={nb}/nt={nt}: err {err:.3g} (rel {err / scale:.3g})"


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("nb", [1, 3, 8, 9, 24, 29])
def test_width_invariance_and_levels_bitwise(ggml, rng, name, nb):
    """I2 at lengths with full groups; and every FMA level (avx2 and up) gives bitwise the same
    floats, every reference-arithmetic level (avx, aarch64) bitwise the scalar reference's."""
    raw, act, n = make(ggml, rng, name, 6, nb, 11)
    first = None
    ref = np.concatenate([run(name, raw, act[t:t + 1], n, "scalar") for t in range(11)])
    for level in SIMD:
        alone = np.concatenate([run(name, raw, act[t:t + 1], n, level) for t in range(11)])
        for nt in range(1, 12):
            for t0 in range(0, 11 - nt + 1):
                win = run(name, raw, act[t0:t0 + nt], n, level)
                assert np.array_equal(win.view(np.uint32), alone[t0:t0 + nt].view(np.uint32)), \
                    f"{name}/{level}/nb={nb}: window of {nt} at token {t0} differs from tokens alone"
        if level in REFERENCE_LEVELS:
            assert np.array_equal(alone.view(np.uint32), ref.view(np.uint32)), \
                f"{name}/nb={nb}: {level} differs from the scalar reference"
        elif first is None:
            first = (level, alone)
        else:
            assert np.array_equal(alone.view(np.uint32), first[1].view(np.uint32)), \
                f"{name}/nb={nb}: {level} differs from {first[0]}"


@pytest.mark.parametrize("name", FORMATS)
def test_split_invariance_long_rows(ggml, rng, name):
    """I3 with full groups: any row range, any thread count; rows outside untouched."""
    rows = 23
    raw, act, n = make(ggml, rng, name, rows, 19, 8)
    for level in SIMD:
        for nt in (1, 3, 5, 8):
            one = run(name, raw, act[:nt], n, level, threads=1)
            two = run(name, raw, act[:nt], n, level, threads=2)
            assert np.array_equal(one.view(np.uint32), two.view(np.uint32))
            for r0, r1 in [(0, 1), (4, 13), (22, 23), (7, 7)]:
                out = np.full((nt, rows), np.float32(-3.5))
                run(name, raw, act[:nt], n, level, out=out, r0=r0, r1=r1)
                assert np.array_equal(out[:, r0:r1].view(np.uint32), one[:, r0:r1].view(np.uint32))
                assert np.all(out[:, :r0] == np.float32(-3.5)) and np.all(out[:, r1:] == np.float32(-3.5))


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("pattern", [0xFF, 0x00, 0x80, 0x7F, 0xAA, "random"])
def test_integer_sums_worst_case_full_groups(ggml, rng, name, pattern):
    """I1 over full groups and a tail (19 blocks): extreme codes with scales 1, activations
    +-127; all sums are exact integers, so every level must equal ggml exactly."""
    f = F[name]
    rows, nb = 3, 19
    raw = legacy_extremes(rng, name, rows, nb, pattern)
    n = 32 * nb
    for q in (np.full(n, 127.0), np.full(n, -127.0), np.where(np.arange(n) % 2, 127.0, -127.0),
              np.where(np.arange(n) % 32 == 0, 127.0, rng.integers(-127, 128, n))):  # d_a = 1 in every block
        x = np.stack([q, -q, q[::-1], -q[::-1]]).astype(np.float32)
        act = lib.quantize_act(F[f.act].id, x, 0)
        act = np.concatenate([act, act[::-1]])  # 8 tokens: every window strategy (BT, TT chunks)
        ref = ggml.vec_dot(name, raw, act, n).astype(np.float64)
        for level in SIMD:
            for nt in (1, 3, 4, 5, 8):
                ours = run(name, raw, act[:nt], n, level)
                np.testing.assert_array_equal(ours, ref[:nt].astype(np.float32),
                                              err_msg=f"{name}/{level}/{pattern}/nt={nt}")
