"""MXFP4 (ggml type 39: 32 e2m1 codes + one e8m0 scale per 17-byte block, against Q8_0) beyond the
format-parametrised tests (tests/test_kernels.py and tests/test_legacy_simd.py run MXFP4 too).

Oracles: ggml's own bytes and dot (ggml_quantize_chunk, vec_dot), gguf-py's dequantize with a
float64 dot (I5), and the format's definition written out here in numpy (code book, e8m0). The
quantizer (csrc/ref/mxfp4.cpp) must give ggml's bytes exactly, including the edge cases of its
exponent rule; the row kernels must keep the integer sums exact at the extreme scales (e = 0, 1,
254, 255) and codes (+-6, i.e. +-12 doubled).
"""
import gguf
import numpy as np
import pytest
from conftest import LEVELS, REFERENCE_LEVELS, own_levels

import lowbit
from lowbit import kernels as K
from lowbit._native import lib
from lowbit.formats import BY_NAME as F

ISA = {n: i for i, n in enumerate(lib.isa_names())}
SIMD = own_levels(39)  # the levels with MXFP4 kernels of their own (every SIMD level: avx and aarch64 too)
KV = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.float64)  # e2m1, doubled


def e8m0_half(e):
    """2^(e - 128) as float64 (exact: every value is a float32, the smallest two subnormal)."""
    return np.ldexp(1.0, np.asarray(e, np.int64) - 128)


def dequant_spec(raw, n):
    """The format's definition, in float64: w = kvalues_mxfp4[code] * 2^(e - 128)."""
    b = raw.reshape(raw.shape[0], n // 32, 17)
    codes = np.concatenate([b[:, :, 1:] & 0x0F, b[:, :, 1:] >> 4], axis=2)  # [rows, blocks, 32]
    return (KV[codes] * e8m0_half(b[:, :, 0])[:, :, None]).reshape(raw.shape[0], n)


def run(raw, act, n, level, out=None, r0=0, r1=None, threads=1):
    rows = raw.shape[0]
    if out is None:
        out = np.zeros((act.shape[0], rows), np.float32)
    lib.matmul_act(F["MXFP4"].id, raw, act, n, 1.0, out, r0, rows if r1 is None else r1, threads, ISA[level])
    return out


def test_table_entry(ggml):
    f = F["MXFP4"]
    assert (f.id, f.block, f.bytes, f.act, f.weight) == (39, 32, 17, "Q8_0", True)
    assert f.id == gguf.GGMLQuantizationType.MXFP4.value
    assert ggml.base.ggml_type_size(f.id) == 17 and ggml.base.ggml_blck_size(f.id) == 32
    assert ggml.vec_dot_type("MXFP4") == "Q8_0"
    assert lib.capabilities(f.id)["quantize"] and lib.capabilities(f.id)["dequantize"]


# ---- the quantizer: ggml's bytes ---------------------------------------------------------------

def quant_cases(rng, n=256):
    """Rows that stress the quantizer's exponent rule and its nearest-code choice."""
    rows = [rng.standard_normal(n), rng.standard_normal(n) * 1e-3, rng.standard_normal(n) * 3e4]
    x = rng.standard_normal(n); x[::17] *= 40.0
    rows.append(x)                                           # outliers: small codes mostly 0
    rows.append(np.zeros(n))                                 # e = 0
    rows.append(np.full(n, -0.0))
    rows.append(np.tile([4.0, 2.0, 1.0, 0.5, 0.25, 6.0, 8.0, 7.9999995], n // 8))  # amax exact powers of 2
    # ties between neighbouring codes at scale 1 (amax 6 -> e = 129, d = 2^1 / 2 ... codes x d)
    rows.append(np.tile([6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -0.75, -1.25, -1.75, -2.5, -3.5, -5.0, 0.0],
                        n // 16))
    rows.append(rng.standard_normal(n) * np.ldexp(1.0, rng.integers(-30, 30, n)))  # scales across 60 octaves
    rows.append(np.full(n, 1e-40))                           # float32 denormals: e wraps below 0
    rows.append(np.where(np.arange(n) % 7 == 0, 3e38, 1.0))  # e near 255
    rows.append(np.where(np.arange(n) % 5 == 0, np.nan, 0.5))  # NaN never wins the max; its code is 0
    rows.append(np.linspace(-1.0, 1.0, n) * np.float32(2.0 ** -126))
    return np.array(rows, dtype=np.float32)


def test_quantizer_bytes_equal_ggml(ggml, rng):
    with np.errstate(all="ignore"):
        x = quant_cases(rng)
    ours = K.quantize("MXFP4", x).reshape(x.shape[0], -1)
    ref = ggml.quantize("MXFP4", x)
    bad = np.argwhere(ours != ref)
    assert bad.size == 0, (f"{len(bad)} bytes differ; first in row {bad[0][0]} byte {bad[0][1]} (block "
                           f"{bad[0][1] // 17}): ours {ours[bad[0][0]][bad[0][1] // 17 * 17:][:17].tobytes().hex()} "
                           f"ggml {ref[bad[0][0]][bad[0][1] // 17 * 17:][:17].tobytes().hex()}")


def test_quantizer_random_shapes_equal_ggml(ggml, rng):
    for rows, n in ((1, 32), (7, 96), (33, 2880), (3, 4096)):
        x = (rng.standard_normal((rows, n)) * rng.uniform(1e-3, 1e3)).astype(np.float32)
        np.testing.assert_array_equal(K.quantize("MXFP4", x).reshape(rows, -1), ggml.quantize("MXFP4", x))


def test_quantize_infinity_equals_ggml(ggml):
    """+-inf in a block: ggml casts floor(log2(inf)) - 2 + 127 to uint8_t (through int32 on x86:
    e = 0); the codes are then chosen against 2^-128. The same bytes, whatever they mean."""
    x = np.ones((2, 64), np.float32)
    x[0, 3] = np.inf
    x[1, 40] = -np.inf
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(K.quantize("MXFP4", x).reshape(2, -1), ggml.quantize("MXFP4", x))


def test_writer_quantizes_mxfp4_itself(ggml, rng):
    """lowbit quantize / synth write MXFP4 through lowbit's own quantizer (no ggml needed)."""
    from lowbit.writer import quantize_tensor
    w = rng.standard_normal((4, 8, 64)).astype(np.float32)  # a 3-D expert tensor
    raw = quantize_tensor("MXFP4", w)
    assert raw.shape == (32, 2 * 17)
    np.testing.assert_array_equal(raw, ggml.quantize("MXFP4", w.reshape(32, 64)))


# ---- dequantize --------------------------------------------------------------------------------

@pytest.mark.parametrize("level", LEVELS)
def test_dequantize_every_scale_and_code(level):
    """All 256 e8m0 values x all 16 codes: the definition (2^(e-128) x kvalues) and gguf-py."""
    raw = np.zeros((256, 17), np.uint8)
    raw[:, 0] = np.arange(256)
    raw[:, 1:9] = np.arange(16, dtype=np.uint8)[0::2] | (np.arange(16, dtype=np.uint8)[1::2] << 4)
    raw[:, 9:] = np.arange(16, dtype=np.uint8)[1::2] | (np.arange(16, dtype=np.uint8)[0::2] << 4)
    ours = lib.dequantize(F["MXFP4"].id, raw, 32, 1.0, ISA[level])
    with np.errstate(over="ignore"):  # e = 255 with codes >= 3 (x 2^127): +-inf, on every side
        spec = dequant_spec(raw, 32).astype(np.float32)
        ref = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.MXFP4).reshape(256, 32)
    np.testing.assert_array_equal(ours.view(np.uint32), spec.view(np.uint32))
    np.testing.assert_array_equal(ours.view(np.uint32), ref.astype(np.float32).view(np.uint32))


# ---- row kernels ---------------------------------------------------------------------------------

def ggml_weights(ggml, rng, rows, n, spread=1.0):
    w = rng.standard_normal((rows, n)).astype(np.float32) * np.float32(spread)
    w[:, ::13] *= 5.0
    return ggml.quantize("MXFP4", w)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("nb", [1, 2, 5, 8, 11, 90, 129])
def test_rows_against_ggml_float64_and_scalar(ggml, rng, level, nb):
    """I5 at every window 1..8 and row length (90 blocks: gpt-oss's 2880), against ggml's vec_dot,
    gguf-py + float64 and the scalar reference (1e-5 of the largest |output|)."""
    n, rows = 32 * nb, 9
    raw = ggml_weights(ggml, rng, rows, n, spread=rng.uniform(1e-3, 1e2))
    x = rng.standard_normal((8, n)).astype(np.float32)
    act = lib.quantize_act(F["Q8_0"].id, x, 0)
    theirs = ggml.vec_dot("MXFP4", raw, act, n).astype(np.float64)
    wd = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.MXFP4).astype(np.float64).reshape(rows, n)
    ad = gguf.quants.dequantize(act, gguf.GGMLQuantizationType.Q8_0).astype(np.float64).reshape(8, n)
    ref64 = ad @ wd.T
    scalar = run(raw, act, n, "scalar")
    for nt in range(1, 9):
        ours = run(raw, act[:nt], n, level).astype(np.float64)
        for name, ref in (("ggml", theirs), ("float64", ref64), ("scalar", scalar.astype(np.float64))):
            err = np.abs(ours - ref[:nt])
            scale = np.abs(ref[:nt]).max()
            t, r = np.unravel_index(np.argmax(err), err.shape)
            assert err.max() <= 1e-5 * scale, (
                f"{level} nb={nb} nt={nt}: vs {name} err {err.max():.3g} (rel {err.max() / scale:.3g}) at token {t}, "
                f"row {r}; e of that row's blocks {raw[r].reshape(-1, 17)[:, 0].tolist()[:12]}")


def extreme_weights(rng, rows, nb, e, pattern):
    b = np.zeros((rows, nb, 17), np.uint8)
    b[:, :, 0] = e
    if pattern == "+6":
        b[:, :, 1:] = 0x77          # every code 7: +6 (12 doubled)
    elif pattern == "-6":
        b[:, :, 1:] = 0xFF          # every code 15: -6
    elif pattern == "alt":
        b[:, :, 1:] = 0x7F          # +6 / -6
    else:
        b[:, :, 1:] = rng.integers(0, 256, (rows, nb, 16), dtype=np.uint8)
    return b.reshape(rows, nb * 17)


@pytest.mark.parametrize("e", [0, 1, 2, 127, 128, 200, 254, 255])
@pytest.mark.parametrize("pattern", ["+6", "-6", "alt", "random"])
def test_integer_sums_at_extreme_scales(ggml, rng, e, pattern):
    """I1: codes +-6 (or random) at the smallest and largest e8m0 scales, activation codes +-127
    with a power-of-two d_a in every block (1, or 2^-24, fp16's smallest, where e >= 128 would
    overflow float otherwise): every block's d_w * d_a * sum is exact, so the scalar reference,
    every SIMD level at every window and ggml's vec_dot all equal the float64 value bit for bit."""
    rows, nb = 3, 19
    n = 32 * nb
    raw = extreme_weights(rng, rows, nb, e, pattern)
    base = np.where(np.arange(n) % 32 == 0, 127.0, rng.integers(-127, 128, n))  # |max| 127 in every block
    q = np.stack([np.full(n, 127.0), -np.full(n, 127.0), base, np.where(np.arange(n) % 2, 127.0, -127.0)])
    da = 1.0 if e < 128 else 2.0 ** -24
    act = lib.quantize_act(F["Q8_0"].id, (q * da).astype(np.float32), 0)
    np.testing.assert_array_equal(act.reshape(4, nb, 34)[:, :, 2:].view(np.int8), q.reshape(4, nb, 32))
    exact = (q * da) @ dequant_spec(raw, n).T                     # float64, exact here
    assert np.all(np.abs(exact) < 2.0 ** 127)                     # finite in float32
    ref = ggml.vec_dot("MXFP4", raw, act, n)
    scalar = run(raw, act, n, "scalar")
    np.testing.assert_array_equal(scalar, exact.astype(np.float32), err_msg=f"scalar vs float64, e={e} {pattern}")
    np.testing.assert_array_equal(ref, exact.astype(np.float32), err_msg=f"ggml vs float64, e={e} {pattern}")
    for level in SIMD:
        for nt in (1, 3, 4, 8):
            a = np.concatenate([act, act])[:nt]
            ours = run(raw, a, n, level)
            np.testing.assert_array_equal(ours, np.concatenate([scalar, scalar])[:nt],
                                          err_msg=f"{level} nt={nt} e={e} {pattern}")


def test_width_split_and_levels_bitwise(ggml, rng):
    """I2, I3 with full groups and a tail: alone vs any window, 1 vs 2 threads, sub-ranges; and every
    FMA level (avx2 and up) returns the same bits (same integers, same float steps), every
    reference-arithmetic level (avx, aarch64) the scalar reference's bits."""
    rows, nb = 21, 27
    n = 32 * nb
    raw = ggml_weights(ggml, rng, rows, n)
    act = lib.quantize_act(F["Q8_0"].id, rng.standard_normal((11, n)).astype(np.float32), 0)
    first = None
    ref = np.concatenate([run(raw, act[t:t + 1], n, "scalar") for t in range(11)])
    for level in SIMD:
        alone = np.concatenate([run(raw, act[t:t + 1], n, level) for t in range(11)])
        for nt in range(1, 9):
            for t0 in (0, 3):
                win = run(raw, act[t0:t0 + nt], n, level, threads=2)
                assert np.array_equal(win.view(np.uint32), alone[t0:t0 + nt].view(np.uint32)), (level, nt, t0)
        out = np.full((5, rows), np.float32(-1.5))
        run(raw, act[:5], n, level, out=out, r0=4, r1=13)
        assert np.array_equal(out[:, 4:13].view(np.uint32), alone[:5, 4:13].view(np.uint32))
        assert np.all(out[:, :4] == np.float32(-1.5)) and np.all(out[:, 13:] == np.float32(-1.5))
        if level in REFERENCE_LEVELS:
            assert np.array_equal(alone.view(np.uint32), ref.view(np.uint32)), f"{level} differs from the scalar reference"
        elif first is None:
            first = (level, alone)
        else:
            assert np.array_equal(alone.view(np.uint32), first[1].view(np.uint32)), f"{level} differs from {first[0]}"


@pytest.mark.parametrize("level", [lv for lv in LEVELS if lv == "scalar" or lv in SIMD])
def test_kernel_names_and_stats(ggml, rng, level):
    for nt in range(1, 9):
        assert lib.kernel(39, nt, ISA[level]) == (f"rows_mxfp4_q8_0_{level}", level)
    raw = ggml_weights(ggml, rng, 5, 64)
    lowbit.kernels.reset_stats()
    run(raw, lib.quantize_act(F["Q8_0"].id, rng.standard_normal((3, 64)).astype(np.float32), 0), 64, level)
    st = [s for s in lowbit.kernels.stats() if s["format"] == "MXFP4"]
    assert st and st[0]["kernel"] == f"rows_mxfp4_q8_0_{level}" and st[0]["nt"] == 3 and st[0]["rows"] == 5


def test_matmul_api_against_float_activations(ggml, rng):
    """The public matmul (activations quantized to Q8_0 inside): within the activation rounding."""
    raw = ggml_weights(ggml, rng, 6, 128)
    x = rng.standard_normal((3, 128)).astype(np.float32)
    ref = x.astype(np.float64) @ dequant_spec(raw, 128).T
    ours = K.matmul("MXFP4", raw, x)
    assert np.abs(ours - ref).max() <= 3e-2 * np.abs(ref).max()


def test_quantized_model_matches_llama_cpp(tmp_path):
    """`lowbit quantize --type MXFP4` (lowbit's own quantizer) writes a file llama.cpp reads, and
    lowbit's forward pass on it (every matrix, the embedding and the head in MXFP4) gives
    llama.cpp's logits: measured max |diff| ~5e-7 on a spread of ~8."""
    from lowbit import peer
    from lowbit.quantize import quantize_file
    from lowbit.synth import synth_dense
    src = synth_dense(tmp_path / "d.gguf", layers=2, dim=128, ffn=256, wtype="F32", seed=5)
    dst = str(tmp_path / "d-mxfp4.gguf")
    quantize_file(src, dst, "MXFP4", pure=True)  # every matrix MXFP4 (no mix rules for the head)
    m = lowbit.load(dst, n_ctx=64, threads=1)
    assert {t.format.name for t in m.file.tensors.values() if len(t.shape) > 1} == {"MXFP4"}
    ids = m.tokenize("The quick brown fox jumps over the lazy dog, and then again")
    ours = m.logits(ids)
    llm = peer.Llama(dst, n_ctx=64, logits_all=True, verbose=False, n_threads=1)
    llm.eval(ids)
    ref = np.array(llm.scores[: len(ids)])
    spread = float((ref.max(1) - ref.min(1)).mean())
    assert np.abs(ours - ref).max() <= 1e-3 * spread
    assert np.array_equal(ours.argmax(1), ref.argmax(1))
