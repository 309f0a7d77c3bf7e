"""Every format's kernels against ggml (the library llama.cpp runs), gguf-py and float64.

Weights are quantized by ggml's own ggml_quantize_chunk (formats ggml cannot quantize, like
I2_S, by lowbit's quantizer), so the bytes under test are the bytes real files hold.
Parametrised over formats x ISA levels (lowbit._native.lib.levels()) x window sizes 1..8.
"""
import gguf
import numpy as np
import pytest
from conftest import LEVELS

import lowbit
from lowbit import kernels as K
from lowbit._native import lib

from lowbit.formats import BY_NAME as F  # noqa: E402
WEIGHT = [f.name for f in lowbit.formats() if f.weight]
GGML_WEIGHT = [n for n in WEIGHT if n != "I2_S"]            # ggml quantizes these itself
FLOAT_ROWS = {"F32", "F16", "BF16"}                          # rows against float32 activations
QUANT_ACT = ["Q8_0", "Q8_1", "Q8_K"]                         # ggml from_float formats


def shape_for(name, blocks=3, rows=7):
    """Odd shapes: a few blocks per row, an odd number of rows."""
    return rows, F[name].block * blocks if F[name].block > 1 else 96


def weights(rng, rows, n):
    w = rng.standard_normal((rows, n)).astype(np.float32)
    w[:, ::17] *= 4.0  # some outliers, as real weight rows have
    return w


def quantize_w(ggml, name, w):
    if name == "I2_S":
        flat = K.quantize("I2_S", w)
        rb = F["I2_S"].row_bytes(w.shape[1])
        raw = flat[: w.shape[0] * rb].reshape(w.shape[0], rb)
        return raw, float(flat[w.shape[0] * rb:][:4].view("<f4")[0])
    return ggml.quantize(name, w), None


def ref_dequant(name, raw, n, w_scale):
    """float64 weights from gguf-py (or, for I2_S which gguf-py lacks, from the layout spec)."""
    if name == "I2_S":
        rows = raw.shape[0]
        b = raw.reshape(rows, -1, 32)
        c = np.stack([(b >> s) & 3 for s in (6, 4, 2, 0)], axis=2)  # [rows, blk, 4, 32]
        return (c.reshape(rows, n).astype(np.float64) - 1.0) * w_scale
    return gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[name]).astype(np.float64).reshape(raw.shape[0], n)


def act_of(name, x, level=None):
    act = F[F[name].act]
    if act.name == "F32":
        return np.ascontiguousarray(x, dtype=np.float32).view(np.uint8).reshape(x.shape[0], -1)
    return lib.quantize_act(act.id, np.ascontiguousarray(x, dtype=np.float32), -1 if level is None else
                            list(lib.isa_names()).index(level))


def act_dequant(name, act, n):
    """float64 activations from their bytes, by the formats' definitions (csrc/formats.h)."""
    a = F[F[name].act]
    return act_dequant_fmt(a.name, act, n)


def act_dequant_fmt(aname, act, n):
    nt = act.shape[0]
    if aname == "F32":
        return act.view(np.float32).astype(np.float64)
    if aname == "Q8_0":
        return gguf.quants.dequantize(act, gguf.GGMLQuantizationType.Q8_0).astype(np.float64).reshape(nt, n)
    if aname == "Q8_1":  # fp16 d, fp16 s, int8 qs[32]
        b = act.reshape(nt, -1, 36)
        d = b[:, :, 0:2].copy().view(np.float16).astype(np.float64)
        return (d * b[:, :, 4:].view(np.int8)).reshape(nt, n)
    if aname == "Q8_K":  # f32 d, int8 qs[256], int16 bsums[16]
        b = act.reshape(nt, -1, 292)
        d = b[:, :, 0:4].copy().view(np.float32).astype(np.float64)
        return (d * b[:, :, 4:260].view(np.int8)).reshape(nt, n)
    if aname == "I8_S":  # f32 scale, i32 sum, int8 q[n]: x = q / scale
        scale = act[:, 0:4].copy().view(np.float32).astype(np.float64)
        return act[:, 8:].view(np.int8) / scale
    raise ValueError(aname)


def ref_q_1(raw, act, n, name):
    """float64 oracle for Q4_1/Q5_1 x Q8_1: per block d_w*d_a*sum(q_w*q_a) + m*s, with the
    stored fp16 s = d_a*sum(q_a), as the format defines it (s is rounded to fp16 by design)."""
    f = F[name]
    rows, nb = raw.shape[0], n // 32
    wd = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[name]).astype(np.float64).reshape(rows, nb, 32)
    m = raw.reshape(rows, nb, f.bytes)[:, :, 2:4].copy().view(np.float16).astype(np.float64)  # [rows, nb, 1]
    ab = act.reshape(act.shape[0], nb, 36)
    ad = ab[:, :, 0:2].copy().view(np.float16).astype(np.float64) * ab[:, :, 4:].view(np.int8)  # [nt, nb, 32]
    s = ab[:, :, 2:4].copy().view(np.float16).astype(np.float64)[:, :, 0]                        # [nt, nb]
    return np.einsum("rbk,tbk->tr", wd - m, ad) + np.einsum("rb,tb->tr", m[:, :, 0], s)


def isa(level):
    return list(lib.isa_names()).index(level)


def run(name, raw, act, n, level, w_scale=None, threads=None, out=None, r0=0, r1=None):
    rows = raw.shape[0]
    if out is None:
        out = np.zeros((act.shape[0], rows), np.float32)
    lib.matmul_act(F[name].id, raw, act, n, 1.0 if w_scale is None else w_scale, out, r0,
                   rows if r1 is None else r1, threads or 0, isa(level))
    return out


def worst(ours, ref):
    err = np.abs(ours.astype(np.float64) - ref)
    t, r = np.unravel_index(np.argmax(err), err.shape)
    return err.max(), t, r


def describe_worst_block(ggml, name, raw, act, n, level, t, r, w_scale):
    """Find the block of row r, token t where lowbit and ggml differ most (for failure messages)."""
    f, a = F[name], F[F[name].act]
    if name in FLOAT_ROWS or name == "I2_S":
        return ""
    nb = n // f.block
    worst_b, worst_d = -1, -1.0
    for b in range(nb):
        wb = np.ascontiguousarray(raw[r:r + 1, b * f.bytes:(b + 1) * f.bytes])
        ab = np.ascontiguousarray(act[t:t + 1, b * a.bytes * f.block // a.block:(b + 1) * a.bytes * f.block // a.block])
        ours = run(name, wb, ab, f.block, level, w_scale)[0, 0]
        theirs = ggml.vec_dot(name, wb, ab, f.block)[0, 0]
        if abs(ours - theirs) > worst_d:
            worst_b, worst_d = b, abs(ours - theirs)
    wb = raw[r, worst_b * f.bytes:(worst_b + 1) * f.bytes]
    return f"worst block {worst_b} of row {r}, token {t}: |diff| {worst_d:.3g}; weight bytes {wb.tobytes().hex()}"


# ---- the format table -----------------------------------------------------------------------

def test_table_matches_ggml_and_gguf(ggml):
    from lowbit.ggml_oracle import GGML_TYPES
    for f in lowbit.formats():
        if f.name in GGML_TYPES:
            assert f.id == GGML_TYPES[f.name] == gguf.GGMLQuantizationType[f.name].value, f.name
            assert ggml.base.ggml_blck_size(f.id) == f.block, f.name
            assert ggml.base.ggml_type_size(f.id) == f.bytes, f.name
            if f.weight and f.name not in FLOAT_ROWS:
                assert f.act == ggml.vec_dot_type(f.name), f.name
    assert F["I2_S"].id == 36 and F["I2_S"].block == 128 and F["I2_S"].bytes == 32
    assert F["I2_S"].tensor_pad == 32 and F["I2_S"].act == "I8_S"
    assert F["I8_S"].row_bytes(256) == 8 + 256


def test_every_format_has_reference_kernels():
    for f in lowbit.formats():
        caps = lib.capabilities(f.id)
        assert caps["dequantize"], f.name
        if f.weight:
            assert caps["rows"], f.name
            for nt in range(1, 9):
                name, level = K.kernel(f.name, nt)
                assert name.startswith("rows_"), name
        if f.activation:
            assert caps["quantize_act"], f.name


# ---- dequantize -----------------------------------------------------------------------------

@pytest.mark.parametrize("name", GGML_WEIGHT + QUANT_ACT[:0])
@pytest.mark.parametrize("level", LEVELS)
def test_dequantize_equals_gguf_py(ggml, rng, name, level):
    rows, n = shape_for(name)
    raw = ggml.quantize(name, weights(rng, rows, n))
    ours = lib.dequantize(F[name].id, raw, n, 1.0, isa(level))
    ref = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[name]).reshape(rows, n)
    bad = np.argwhere(ours.view(np.uint32) != ref.astype(np.float32).view(np.uint32))
    assert bad.size == 0, (f"{name}: {len(bad)} values differ, first at (row, col) {tuple(bad[0])}: "
                           f"ours {ours[tuple(bad[0])]} gguf-py {ref[tuple(bad[0])]}; "
                           f"block bytes {raw[bad[0][0], bad[0][1] // F[name].block * F[name].bytes:][:F[name].bytes].tobytes().hex()}")


@pytest.mark.parametrize("name", QUANT_ACT)
def test_dequantize_activation_formats(ggml, rng, name):
    x = rng.standard_normal((3, 512)).astype(np.float32)
    act = ggml.from_float(name, x)
    ours = K.dequantize(name, act)
    np.testing.assert_array_equal(ours, act_dequant_fmt(name, act, 512).astype(np.float32))


# ---- activation quantizers (I4) ------------------------------------------------------------

def special_rows(n):
    """Rows that stress a quantizer: zeros, ties, +-inf, NaN, denormals, huge and tiny values."""
    rows = []
    rows.append(np.zeros(n))
    t = np.tile(np.array([127.0, 0.5, 1.5, -2.5, 63.5, -0.5, 3.5, 100.5]), n // 8)
    rows.append(t)                                   # max 127 -> scale 1: exact .5 ties
    rows.append(np.where(np.arange(n) % 5 == 0, np.inf, 1.0))
    rows.append(np.where(np.arange(n) % 7 == 3, -np.inf, -1.0))
    rows.append(np.where(np.arange(n) % 9 == 1, np.nan, 0.25))
    x = np.full(n, np.nan); x[1::3] = 2.0
    rows.append(x)
    rows.append(np.full(n, 1e-41))                   # float32 denormals
    rows.append(np.where(np.arange(n) % 2 == 0, 1e-45, -3e-42))
    rows.append(np.where(np.arange(n) % 11 == 0, 3e38, 1.0))
    rows.append(np.where(np.arange(n) % 13 == 0, -3.4e38, 7.0))
    rows.append(np.full(n, -0.0))
    rows.append(np.linspace(-1, 1, n) * 65504.0 * 2)  # beyond fp16 range: d overflows to inf
    return np.array(rows, dtype=np.float32)


@pytest.mark.parametrize("name", QUANT_ACT)
@pytest.mark.parametrize("kind", ["normal", "special"])
@pytest.mark.parametrize("level", LEVELS)
def test_quantize_act_identical_to_ggml(ggml, rng, name, kind, level):
    n = 512
    with np.errstate(all="ignore"):
        x = rng.standard_normal((9, n)).astype(np.float32) * np.float32(3.0) if kind == "normal" else special_rows(n)
    ours = lib.quantize_act(F[name].id, x, isa(level))
    ref = ggml.from_float(name, x)
    bad = np.argwhere(ours != ref)
    assert bad.size == 0, (f"{name}: {len(bad)} bytes differ; first in row {bad[0][0]} at byte {bad[0][1]}: "
                           f"ours {ours[bad[0][0]][:40].tobytes().hex()} ggml {ref[bad[0][0]][:40].tobytes().hex()}")


def test_quantize_act_i8s_definition(rng):
    x = rng.standard_normal((4, 256)).astype(np.float32)
    x[1] = 0.0
    a = K.quantize_act("I8_S", x)
    scale = a[:, :4].copy().view("<f4")[:, 0]
    total = a[:, 4:8].copy().view("<i4")[:, 0]
    q = a[:, 8:].view(np.int8).astype(np.int64)
    assert np.all(np.abs(q) <= 127)
    np.testing.assert_array_equal(total, q.sum(axis=1))
    for i in (0, 2, 3):
        assert scale[i] == np.float32(127.0) / np.abs(x[i]).max()
        np.testing.assert_array_equal(q[i], np.clip(np.round(x[i] * scale[i]), -127, 127))
    assert np.all(q[1] == 0) and total[1] == 0


# ---- row kernels against ggml and float64 (I5) ---------------------------------------------

@pytest.mark.parametrize("nt", range(1, 9))
@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("name", WEIGHT)
def test_rows_match_ggml_and_float64(ggml, rng, name, level, nt):
    rows, n = shape_for(name)
    w = weights(rng, rows, n)
    raw, w_scale = quantize_w(ggml, name, w)
    x = rng.standard_normal((nt, n)).astype(np.float32)
    act = act_of(name, x, level)
    ours = run(name, raw, act, n, level, w_scale)
    # float64: dequantized weights . dequantized activations
    ref64 = act_dequant(name, act, n) @ ref_dequant(name, raw, n, w_scale).T
    if name in ("Q4_1", "Q5_1"):
        ref64 = ref_q_1(raw, act, n, name)
    scale = np.abs(ref64).max()
    err, t, r = worst(ours, ref64)
    assert err <= 1e-5 * scale, f"{name}/{level}/nt={nt}: vs float64 max err {err:.3g} (rel {err / scale:.3g}) at token {t}, row {r}"
    if name in FLOAT_ROWS or name == "I2_S":
        return  # ggml pairs these with F16/BF16 activations (or lacks them): float64 is the oracle
    ref = ggml.vec_dot(name, raw, act, n).astype(np.float64)
    err, t, r = worst(ours, ref)
    assert err <= 1e-5 * np.abs(ref).max(), (
        f"{name}/{level}/nt={nt}: vs ggml vec_dot max err {err:.3g} at token {t}, row {r}; "
        + describe_worst_block(ggml, name, raw, act, n, level, t, r, w_scale))


@pytest.mark.parametrize("name", WEIGHT)
def test_rows_against_unquantized_activations(ggml, rng, name):
    """Against float activations the activation rounding itself is the error: ~1e-2, not 1e-5."""
    rows, n = shape_for(name, blocks=4)
    raw, w_scale = quantize_w(ggml, name, weights(rng, rows, n))
    x = rng.standard_normal((3, n)).astype(np.float32)
    ours = K.matmul(name, raw, x, w_scale=w_scale)
    ref = x.astype(np.float64) @ ref_dequant(name, raw, n, w_scale).T
    assert np.abs(ours - ref).max() <= 3e-2 * np.abs(ref).max()


# ---- invariants I1-I3 --------------------------------------------------------------------

@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("name", WEIGHT)
def test_width_invariance(ggml, rng, name, level):
    """I2: a token's output is bitwise the same alone or in any window 1..8 (and in 9+, chunked)."""
    rows, n = shape_for(name, blocks=2, rows=5)
    raw, w_scale = quantize_w(ggml, name, weights(rng, rows, n))
    x = rng.standard_normal((11, n)).astype(np.float32)
    act = act_of(name, x, level)
    alone = np.concatenate([run(name, raw, act[t:t + 1], n, level, w_scale) for t in range(11)])
    for nt in range(1, 12):
        for t0 in range(0, 11 - nt + 1, max(1, nt - 1)):
            win = run(name, raw, act[t0:t0 + nt], n, level, w_scale)
            assert np.array_equal(win.view(np.uint32), alone[t0:t0 + nt].view(np.uint32)), \
                f"{name}/{level}: window of {nt} at token {t0} differs from tokens run alone"


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("name", WEIGHT)
def test_split_invariance(ggml, rng, name, level):
    """I3: bitwise the same under any thread count and row split; rows outside [r0, r1) untouched."""
    rows, n = shape_for(name, blocks=2, rows=37)
    raw, w_scale = quantize_w(ggml, name, weights(rng, rows, n))
    act = act_of(name, rng.standard_normal((5, n)).astype(np.float32), level)
    one = run(name, raw, act, n, level, w_scale, threads=1)
    two = run(name, raw, act, n, level, w_scale, threads=2)
    assert np.array_equal(one.view(np.uint32), two.view(np.uint32))
    sentinel = np.full((5, rows), np.float32(-7.25))
    for r0, r1 in [(0, 1), (3, 17), (17, 37), (36, 37), (5, 5)]:
        out = sentinel.copy()
        run(name, raw, act, n, level, w_scale, threads=2, out=out, r0=r0, r1=r1)
        assert np.array_equal(out[:, r0:r1].view(np.uint32), one[:, r0:r1].view(np.uint32))
        assert np.all(out[:, :r0] == np.float32(-7.25)) and np.all(out[:, r1:] == np.float32(-7.25)), \
            f"rows outside [{r0}, {r1}) were written"


FP16_FIELDS = {  # byte offsets of the fp16 scales in each block (csrc/formats.h)
    "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0], "Q2_K": [80, 82],
    "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208], "IQ2_XXS": [0], "IQ2_XS": [0],
    "IQ2_S": [0], "IQ3_XXS": [0], "IQ3_S": [0], "IQ4_NL": [0], "IQ4_XS": [0], "IQ1_S": [0],
    "TQ1_0": [52], "TQ2_0": [64],
}


def worst_case_weights(name, rows, n, pattern, rng):
    f = F[name]
    nb = n // f.block
    if pattern == "max":
        raw = np.full((rows, nb, f.bytes), 0xFF, np.uint8)
    elif pattern == "alt":
        raw = np.full((rows, nb, f.bytes), 0xAA, np.uint8)
    else:
        raw = rng.integers(0, 256, (rows, nb, f.bytes), dtype=np.uint8)
    for off in FP16_FIELDS[name]:
        raw[:, :, off:off + 2] = np.frombuffer(np.float16(1.0).tobytes(), np.uint8)
    if name == "TQ1_0" or name == "TQ2_0":
        pass  # every byte pattern is a valid (if unusual) ternary block
    return raw.reshape(rows, nb * f.bytes)


def worst_case_act(name, nt, n, kind):
    a = F[F[name].act]
    q = {"plus": np.full((nt, n), 127), "minus": np.full((nt, n), -127),
         "alt": np.where(np.arange(n) % 2, 127, -127)[None].repeat(nt, 0)}[kind].astype(np.float32)
    return ggml_like_act(a.name, q)


def ggml_like_act(aname, q):
    """Quantize int8-valued rows so every activation code is exactly +-127 (scale 1)."""
    return lowbit.kernels.quantize_act(aname, q)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("name", sorted(FP16_FIELDS))
@pytest.mark.parametrize("pattern", ["max", "alt", "random"])
def test_integer_sums_worst_case(ggml, rng, name, level, pattern):
    """I1: worst-case codes (all bits set, alternating, random bytes) with scales 1.0 and
    activations of +-127. Every level is within 2^-20 of the exact float64 value (an int16
    or int32 overflow would be off by far more) and within 1e-5 of ggml's vec_dot."""
    rows, n = 3, F[name].block * 2
    raw = worst_case_weights(name, rows, n, pattern, rng)
    for kind in ("plus", "minus", "alt"):
        act = worst_case_act(name, 2, n, kind)
        ours = run(name, raw, act, n, level)
        ref64 = act_dequant(name, act, n) @ ref_dequant(name, raw, n, None).T
        if name in ("Q4_1", "Q5_1"):
            ref64 = ref_q_1(raw, act, n, name)
        err, t, r = worst(ours, ref64)
        assert err <= 2.0**-20 * max(np.abs(ref64).max(), 1.0), f"{name}/{level}/{pattern}/{kind}: err {err} at token {t}, row {r}"
        ref = ggml.vec_dot(name, raw, act, n).astype(np.float64)
        err, t, r = worst(ours, ref)
        assert err <= 1e-5 * max(np.abs(ref).max(), 1.0), f"{name}/{level}/{pattern}/{kind}: vs ggml err {err} at token {t}, row {r}"
