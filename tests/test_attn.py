"""The engine's attention kernel (one query row against a half KV cache) on every level,
against a float64 reference with the same rounding points (q and each probability rounded
to half, as llama.cpp's default half cache does).

Tolerance: a probability whose float32 value sits at a half rounding boundary may round one
half-ulp (2^-11 relative) differently from the float64 reference's, so an output lane may
move by up to 2^-11 * max|V| (observed: <= 2e-7 * max|V|); any real error (a wrong key, a lost tail key, a wrong scale or
max) is orders of magnitude larger.
"""
import numpy as np
import pytest
from conftest import LEVELS

from lowbit._native import lib

ISA = list(lib.isa_names())


def reference(q, K, V, scale):
    hd = q.shape[0]
    qh = q.astype(np.float16).astype(np.float64)
    Kf = K.view(np.float16)[:, :hd].astype(np.float64)
    Vf = V.view(np.float16)[:, :hd].astype(np.float64)
    s = scale * (Kf @ qh)
    e = np.exp(s - s.max())
    p = (e / e.sum()).astype(np.float16).astype(np.float64)
    return p @ Vf


def case(rng, length, hd, kd, spread):
    q = (rng.standard_normal(hd) * spread).astype(np.float32)
    K = rng.standard_normal((length, kd)).astype(np.float16).view(np.uint16)
    V = rng.standard_normal((length, kd)).astype(np.float16).view(np.uint16)
    return q, K, V


SHAPES = [(1, 64, 64), (7, 64, 64), (8, 64, 64), (9, 64, 192), (17, 64, 64), (31, 128, 256),
          (64, 72, 72), (200, 64, 192), (1000, 64, 64), (333, 8, 24)]


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("length,hd,kd", SHAPES)
@pytest.mark.parametrize("spread", [0.1, 1.0, 6.0])
def test_attention_matches_float64(level, length, hd, kd, spread):
    rng = np.random.default_rng(length * 1000 + hd + int(spread * 10))
    q, K, V = case(rng, length, hd, kd, spread)
    scale = 1.0 / np.sqrt(hd)
    out, name = lib.attend_f16(q, K, V, scale, ISA.index(level))
    ref = reference(q, K, V, scale)
    vmax = np.abs(V.view(np.float16)[:, :hd].astype(np.float64)).max()
    err = np.abs(out[0] - ref)
    worst = int(err.argmax())
    assert err.max() <= 2.0 ** -11 * vmax + 1e-6, (
        f"{name} len {length} hd {hd} kd {kd}: lane {worst} is {out[0][worst]!r}, float64 {ref[worst]!r}")


@pytest.mark.parametrize("level", LEVELS)
def test_one_dominant_key_and_underflow(level):
    """Scores 100 apart: every other probability underflows to 0, the output is that key's V row."""
    hd, length = 64, 21
    rng = np.random.default_rng(5)
    q = np.zeros(hd, np.float32)
    q[0] = 8.0
    K = np.zeros((length, hd), np.float16)
    K[:, 0] = -100.0
    K[13, 0] = 100.0  # the one key that counts, inside the tail of 8-key groups
    V = rng.standard_normal((length, hd)).astype(np.float16)
    out, name = lib.attend_f16(q, K.view(np.uint16), V.view(np.uint16), 1.0, ISA.index(level))
    np.testing.assert_array_equal(out[0], V[13].astype(np.float32), err_msg=name)


@pytest.mark.parametrize("level", LEVELS)
def test_equal_scores_average_v(level):
    """All scores equal: probabilities are 1/len rounded to half, the output their weighted sum."""
    hd, length = 64, 12
    rng = np.random.default_rng(6)
    q = rng.standard_normal(hd).astype(np.float32)
    K = np.tile(rng.standard_normal(hd).astype(np.float16), (length, 1))
    V = rng.standard_normal((length, hd)).astype(np.float16)
    out, name = lib.attend_f16(q, K.view(np.uint16), V.view(np.uint16), 0.125, ISA.index(level))
    p = np.float32(np.float16(np.float32(1.0) / np.float32(length)))
    np.testing.assert_allclose(out[0], p * V.astype(np.float32).sum(axis=0), rtol=1e-5, atol=1e-6, err_msg=name)


def test_bad_shapes_are_refused():
    q = np.zeros(60, np.float32)
    K = np.zeros((4, 64), np.uint16)
    with pytest.raises(ValueError, match="multiple of 8"):
        lib.attend_f16(q, K, K, 1.0)
    with pytest.raises(ValueError, match="K and V"):
        lib.attend_f16(np.zeros(64, np.float32), K, np.zeros((3, 64), np.uint16), 1.0)


def reference_sink(q, K, V, scale, sink):
    """float64, with an attention sink: a logit in the softmax's max and denominator, no value."""
    hd = q.shape[0]
    qh = q.astype(np.float16).astype(np.float64)
    Kf = K.view(np.float16)[:, :hd].astype(np.float64)
    Vf = V.view(np.float16)[:, :hd].astype(np.float64)
    s = scale * (Kf @ qh)
    m = max(s.max(), sink)
    e = np.exp(s - m)
    p = (e / (e.sum() + np.exp(sink - m))).astype(np.float16).astype(np.float64)
    return p @ Vf


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("length", [1, 9, 64, 333])
@pytest.mark.parametrize("sink", [-3.0, 0.5, 4.0, 40.0])
def test_attention_sink_matches_float64(level, length, sink):
    """gpt-oss's sinks: a sink below, inside and far above the scores (40: it takes nearly all the
    weight, the output nearly 0). Same tolerance as without a sink."""
    rng = np.random.default_rng(1000 * length + int(sink * 10) + 100)
    q, K, V = case(rng, length, 64, 64, 1.0)
    out, name = lib.attend_f16(q, K, V, 0.125, ISA.index(level), sink=sink)
    ref = reference_sink(q, K, V, 0.125, sink)
    vmax = np.abs(V.view(np.float16)[:, :64].astype(np.float64)).max()
    assert np.abs(out[0] - ref).max() <= 2.0 ** -11 * vmax + 1e-6, name
    if sink >= 4.0:  # the sink's weight is visible: without it the output differs
        plain, _ = lib.attend_f16(q, K, V, 0.125, ISA.index(level))
        assert np.abs(plain[0] - out[0]).max() > 1e-3


@pytest.mark.parametrize("level", LEVELS)
def test_no_sink_is_bitwise_no_sink(level):
    rng = np.random.default_rng(11)
    q, K, V = case(rng, 37, 64, 64, 1.0)
    a, _ = lib.attend_f16(q, K, V, 0.125, ISA.index(level))
    b, _ = lib.attend_f16(q, K, V, 0.125, ISA.index(level), sink=-np.inf)
    assert np.array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 7, 11, 48])
@pytest.mark.parametrize("hd", [64, 256])
def test_shared_rows_with_their_own_lengths_are_bitwise_the_rows_alone(level, rows, hd):
    """Rows of one call that see different numbers of keys (a prompt block's tokens x a group's
    heads): the rows are scored in threes, pairs and ones among those still live at each group of
    8 keys, and valued in fours and the last 1-3; each row must be bitwise the one-row kernel on its
    own keys, whatever rows share its call and however they drop out."""
    rng = np.random.default_rng(rows * 7 + hd)
    length = 203
    lens = [int(x) for x in rng.integers(1, length + 1, rows)]
    lens[0] = length  # (one row sees every key)
    q = (rng.standard_normal((rows, hd)) * 2).astype(np.float32)
    K = rng.standard_normal((length, hd)).astype(np.float16).view(np.uint16)
    V = rng.standard_normal((length, hd)).astype(np.float16).view(np.uint16)
    out, name = lib.attend_mla(q, K, hd, 0.125, ISA.index(level), lens=lens, V=V)
    for r in range(rows):
        n = lens[r]
        one, one_name = lib.attend_f16(q[r], np.ascontiguousarray(K[:n]), np.ascontiguousarray(V[:n]), 0.125,
                                       ISA.index(level))
        assert np.array_equal(out[r].view(np.uint32), one[0].view(np.uint32)), (
            f"{name} vs {one_name} row {r} of {rows} ({n} keys): lane {int(np.abs(out[r] - one[0]).argmax())}")


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("length,hd,kd", [(1, 64, 64), (9, 64, 128), (70, 128, 256), (333, 256, 512), (17, 8, 24),
                                          (45, 88, 96)])  # 88: 64 + 16 + 8 dims (every chunk width)
@pytest.mark.parametrize("sinks", [False, True])
def test_gqa_group_is_bitwise_the_rows_alone(level, length, hd, kd, sinks):
    """A GQA group's heads in one call of the shared-rows kernel (what the engine runs for a group:
    each cache row read once for all heads) give every head bitwise what the one-row kernel gives
    it alone (attend_f16 with that head's sink), with values apart from the keys."""
    group = 8
    rng = np.random.default_rng(length + hd + sinks)
    q = (rng.standard_normal((group, hd)) * 2).astype(np.float32)
    K = rng.standard_normal((length, kd)).astype(np.float16).view(np.uint16)
    V = rng.standard_normal((length, kd)).astype(np.float16).view(np.uint16)
    sk = list(rng.standard_normal(group) * 3) if sinks else []
    out, name = lib.attend_mla(q, K, hd, 0.125, ISA.index(level), V=V, sinks=sk)
    for r in range(group):
        one, one_name = lib.attend_f16(q[r], K, V, 0.125, ISA.index(level), sink=sk[r] if sinks else -np.inf)
        assert np.array_equal(out[r].view(np.uint32), one[0].view(np.uint32)), (
            f"{name} vs {one_name} head {r}: lane {int(np.abs(out[r] - one[0]).argmax())}")


# ---- Gemma 2's attention logit soft-capping (kernels.h softcap_scores) ----

def reference_softcap(q, K, V, scale, cap):
    hd = q.shape[0]
    qh = q.astype(np.float16).astype(np.float64)
    Kf = K.view(np.float16)[:, :hd].astype(np.float64)
    s = cap * np.tanh(scale * (Kf @ qh) / cap)
    e = np.exp(s - s.max())
    p = (e / e.sum()).astype(np.float16).astype(np.float64)
    return p @ V.view(np.float16)[:, :hd].astype(np.float64)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("length,hd,kd", [(1, 64, 64), (9, 64, 128), (200, 256, 256), (333, 8, 24)])
@pytest.mark.parametrize("cap", [0.5, 3.0, 50.0])
def test_softcap_matches_float64(level, length, hd, kd, cap):
    """Scores s capped to cap * tanh(s / cap) before the softmax, against float64 of the same (the
    half-rounded probabilities' tolerance, as above). Scores span about +-12, so a cap of 0.5 or 3
    flattens them and 50 barely touches them; with a small cap, leaving the cap out fails."""
    rng = np.random.default_rng(length + hd + int(cap * 10))
    q, K, V = case(rng, length, hd, kd, 6.0)
    scale = 1.0 / np.sqrt(hd)
    out, name = lib.attend_f16(q, K, V, scale, ISA.index(level), softcap=cap)
    ref = reference_softcap(q, K, V, scale, cap)
    vmax = np.abs(V.view(np.float16)[:, :hd].astype(np.float64)).max()
    err = np.abs(out[0] - ref)
    assert err.max() <= 2.0 ** -11 * vmax + 1e-6, f"{name} cap {cap}: lane {int(err.argmax())} off by {err.max():.3g}"
    if cap <= 3.0 and length > 1:
        plain, _ = lib.attend_f16(q, K, V, scale, ISA.index(level))
        assert np.abs(plain[0] - out[0]).max() > 1e-2, name


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("rows", [1, 3, 8, 11])
def test_softcap_shared_rows_are_bitwise_the_rows_alone(level, rows):
    """The shared-rows kernel (a GQA group, a prompt block) with a softcap: each row bitwise the
    one-row kernel with the same cap on its own keys."""
    rng = np.random.default_rng(rows + 77)
    length, hd = 91, 128
    lens = [int(x) for x in rng.integers(1, length + 1, rows)]
    lens[-1] = length
    q = (rng.standard_normal((rows, hd)) * 4).astype(np.float32)
    K = rng.standard_normal((length, hd)).astype(np.float16).view(np.uint16)
    V = rng.standard_normal((length, hd)).astype(np.float16).view(np.uint16)
    out, name = lib.attend_mla(q, K, hd, 0.125, ISA.index(level), lens=lens, V=V, softcap=2.0)
    for r in range(rows):
        n = lens[r]
        one, _ = lib.attend_f16(q[r], np.ascontiguousarray(K[:n]), np.ascontiguousarray(V[:n]), 0.125,
                                ISA.index(level), softcap=2.0)
        assert np.array_equal(out[r].view(np.uint32), one[0].view(np.uint32)), f"{name} row {r} ({n} keys)"


def test_softcap_bad_values_are_refused():
    q, K, V = case(np.random.default_rng(0), 4, 64, 64, 1.0)
    for bad in (-1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="softcap"):
            lib.attend_f16(q, K, V, 0.125, softcap=bad)


def test_softcap_is_tanh_within_its_bound():
    """The soft-cap every kernel computes (ref::softcap_scores; x86 levels lane for lane, the
    quantized-cache tests above check bitwise): cap * tanh(x / cap) to within 1.2e-7 * cap
    absolute (tanh by e^(-2|x|), half an ulp of 1 near 0) plus a float ulp of the result; odd;
    exactly +-cap far out; 0 at 0; NaN stays NaN."""
    rng = np.random.default_rng(3)
    x = np.concatenate([np.linspace(-200, 200, 40001), rng.standard_normal(20000) * 30,
                        [0.0, -0.0, 1e-30, -1e-30, 1e-7, 87.3, 1e6, -1e6, 3.4e38]]).astype(np.float32)
    for cap in (50.0, 1.5, 30.0):
        got = lib.softcap_scores(x, cap)[0].astype(np.float64)
        want = cap * np.tanh(x.astype(np.float64) / np.float32(cap))
        bound = 1.2e-7 * cap + np.spacing(np.abs(want).astype(np.float32)).astype(np.float64)
        err = np.abs(got - want)
        worst = int((err - bound).argmax())
        assert (err <= bound).all(), f"cap {cap}: x {x[worst]!r} gives {got[worst]!r}, float64 {want[worst]!r}"
        assert np.array_equal(lib.softcap_scores(-x, cap)[0], -lib.softcap_scores(x, cap)[0])
        assert lib.softcap_scores(np.float32([1e6, -1e6]), cap)[0].tolist() == [cap, -cap]
        assert lib.softcap_scores(np.float32([0.0]), cap)[0][0] == 0.0
        assert np.isnan(lib.softcap_scores(np.float32([np.nan]), cap)[0][0])
