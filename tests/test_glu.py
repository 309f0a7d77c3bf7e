"""The FFN's fused gate/up with the GLU epilogue (csrc/matmul.cpp run_rows_glu, csrc/ref/glu.cpp,
csrc/x86/glu.inl; kernel API lowbit.kernels.matmul_glu / glu).

  - the epilogue: every level returns the scalar reference's bits (lane-independent, same float
    operations, FMA where the reference uses fmaf), over a sweep that covers the exp's range
    reduction edges (|g| up to 140: 2^n scaled into subnormals and overflow), specials
    (+-0, subnormals, +-88, +-100, +-1e30, +-inf, NaN) and every tail length;
  - SiLU vs float64: relative error <= 4 ulp of float32 (4 * 2^-23 = 4.8e-7) wherever the exact
    result and exp(-g) are normal floats (ggml's exp: ~1.5 ulp, then 1 + e, /, * u: 0.5 ulp each);
  - SiLU equals ggml's own ggml_vec_swiglu_f32 bit for bit (what llama.cpp's SwiGLU runs);
  - matmul_glu equals matmul(gate), matmul(up), then the epilogue, bitwise, for several formats x
    every level x windows 1..8 and 19 x odd row counts, and under 1 vs 2 threads;
  - argument checking before native code, the call counters, LOWBIT_NO_GLU_<LEVEL>.
"""
import ctypes
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import LEVELS

import lowbit.kernels as K
from lowbit._native import lib
from lowbit.formats import BY_NAME as F

ISA = {n: i for i, n in enumerate(lib.isa_names())}
KINDS = {"silu": 0, "relu2": 1}
ULP = 2.0 ** -23


def same_bits(a, b):
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def first_diff(a, b, g):
    d = np.flatnonzero(np.asarray(a, np.float32).view(np.uint32).ravel() != np.asarray(b, np.float32).view(np.uint32).ravel())
    return f"{d.size} differ; first at {d[:3]}: g={np.ravel(g)[d[:3]]} {np.ravel(a)[d[:3]]} vs {np.ravel(b)[d[:3]]}"


SPECIALS = np.array([0.0, -0.0, 1e-45, -1e-45, 3e-39, -3e-39, 1.1754944e-38, 1e-20, -1e-20, 0.5, -0.5,
                     87.0, -87.0, 88.0, -88.0, 88.72, -88.72, 89.0, -89.0, 100.0, -100.0, 103.9, -103.9,
                     104.0, -104.0, 126.0 * 0.6931472, -126.0 * 0.6931472, 133.0, -133.0, 134.0, -134.0,
                     1e4, -1e4, 1e30, -1e30, 3.4e38, -3.4e38, np.inf, -np.inf, np.nan], np.float32)


def sweep(rng):
    """g values: specials, a dense ramp over [-140, 140] (every 2^n scaling case, subnormal
    results, overflow), random normals at several scales, random bit patterns."""
    bits = rng.integers(0, 2 ** 32, 20000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    return np.concatenate([SPECIALS, np.linspace(-140, 140, 100003, dtype=np.float32),
                           (rng.standard_normal(30000) * 4).astype(np.float32),
                           (rng.standard_normal(10000) * 30).astype(np.float32), bits]).astype(np.float32)


def run_glu(g, u, kind, level):
    out = np.empty_like(g)
    lib.glu(np.ascontiguousarray(g), np.ascontiguousarray(u), out, KINDS[kind], ISA[level])
    return out


# ---- the epilogue ---------------------------------------------------------------------------

def test_each_level_names_its_epilogue():
    names = {lv: lib.glu_kernel(ISA[lv]) for lv in LEVELS}
    assert names["scalar"] == ("glu_scalar", "scalar")
    for lv in LEVELS:
        if lv in ("avx2", "avx2vnni"):
            assert names[lv] == ("glu_avx2", "avx2")  # avx2vnni adds nothing to float code
        if lv == "avx512":
            assert names[lv] == ("glu_avx512", "avx512")
    assert K.glu_kernel() == lib.glu_kernel(-1)


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("level", LEVELS)
def test_every_level_equals_scalar_bitwise(rng, kind, level):
    g = sweep(rng)
    u = rng.standard_normal(g.size).astype(np.float32)
    u[:SPECIALS.size] = 1.0
    ref = run_glu(g, u, kind, "scalar")
    ours = run_glu(g, u, kind, level)
    assert same_bits(ours, ref), first_diff(ours, ref, g)
    # every tail length (masked loads/stores) and an offset start; out never written past n
    for n in list(range(0, 40)) + [1535, 1536, 1537]:
        gg = g[7:7 + n].copy()
        uu = u[7:7 + n].copy()
        out = np.full(n + 16, 12345.0, np.float32)
        lib.glu(gg, uu, out[:n], KINDS[kind], ISA[level])
        assert same_bits(out[:n], ref[7:7 + n]), (n, first_diff(out[:n], ref[7:7 + n], gg))
        assert np.all(out[n:] == 12345.0)


@pytest.mark.parametrize("level", LEVELS)
def test_in_place(rng, level):
    """out may alias g (the MoE path writes the epilogue over the gate values)."""
    g = (rng.standard_normal(1001) * 5).astype(np.float32)
    u = rng.standard_normal(1001).astype(np.float32)
    want = run_glu(g, u, "silu", level)
    lib.glu(g, u, g, 0, ISA[level])
    assert same_bits(g, want)


def test_silu_against_float64(rng):
    """Relative error <= 4 float32 ulp (4.8e-7) where the exact silu(g) * u and exp(-g) are
    normal floats (below ~-87.3 exp(-g) overflows float and the float result is -0)."""
    g = sweep(rng)
    u = rng.standard_normal(g.size).astype(np.float32)
    ours = run_glu(g, u, "silu", "scalar").astype(np.float64)
    with np.errstate(all="ignore"):
        g64, u64 = g.astype(np.float64), u.astype(np.float64)
        exact = g64 / (1.0 + np.exp(-g64)) * u64
    ok = np.isfinite(exact) & (np.abs(exact) >= 1.2e-38) & (np.abs(exact) < 3.4e38) & (g64 > -87.0)
    assert ok.sum() > 120000
    rel = np.abs(ours[ok] - exact[ok]) / np.abs(exact[ok])
    worst = int(np.argmax(rel))
    assert rel.max() <= 4 * ULP, (rel.max() / ULP, g[ok][worst], u[ok][worst])
    # the exp alone: ggml's routine, max ~1.5 ulp (+0.5 for the rounding)
    e = run_glu(-np.linspace(-87, 88, 50001, dtype=np.float32), np.ones(50001, np.float32), "silu", "scalar")
    assert np.all(np.isfinite(e))


def test_specials_defined():
    """The behaviour at the edges (every level: the scalar reference's bits, tested above):
    silu(+inf) = +inf; silu(-inf) = NaN (-inf / inf, as ggml and the formula g / (1 + exp(-g)));
    silu(NaN) = NaN; silu(g) = -0 for g <= -88.8 (exp(-g) overflows); silu(+-0) = +-0;
    silu(subnormal g) = g / 2 rounded; silu(1e30) = 1e30. relu2: NaN and -inf give 0."""
    g = np.array([np.inf, -np.inf, np.nan, -89.0, -100.0, -1e30, 0.0, -0.0, 2.0 ** -147, 1e30, 100.0, 88.0], np.float32)
    u = np.ones_like(g)
    for level in LEVELS:
        s = run_glu(g, u, "silu", level)
        assert s[0] == np.inf and np.isnan(s[1]) and np.isnan(s[2])
        assert np.all(s[3:6] == 0) and np.all(np.signbit(s[3:6]))
        assert s[6] == 0 and not np.signbit(s[6]) and s[7] == 0 and np.signbit(s[7])
        assert s[8] == np.float32(2.0 ** -148)  # exp(-g) = 1: g / 2, exact
        assert s[9] == np.float32(1e30) and s[10] == np.float32(100.0)
        assert abs(s[11] - 88.0) <= 88.0 * ULP
        r = run_glu(g, np.full_like(g, 2.0), "relu2", level)
        assert r[0] == np.inf and r[1] == 0 and r[2] == 0 and r[4] == 0 and r[10] == np.float32(20000.0)


def test_relu2_exact(rng):
    g = (rng.standard_normal(4099) * 10).astype(np.float32)
    u = rng.standard_normal(4099).astype(np.float32)
    r = np.maximum(g, np.float32(0))
    want = (r * r) * u  # float32 numpy ops round like C's
    for level in LEVELS:
        assert same_bits(run_glu(g, u, "relu2", level), want)


def _ggml_swiglu():
    from lowbit.ggml_oracle import ggml
    f = getattr(ggml().cpu, "ggml_vec_swiglu_f32", None)
    if f is None:
        pytest.skip("this ggml build exports no ggml_vec_swiglu_f32")
    f.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    f.restype = None
    return f


def test_silu_equals_ggml_swiglu(rng):
    """llama.cpp's SwiGLU (ggml_vec_swiglu_f32: x / (1 + ggml_v_expf(-x)) * g, 16 lanes at a time
    on an avx512 build; its tail of n % 16 values runs libm's expf, so n is a multiple of 16)."""
    swiglu = _ggml_swiglu()
    g = sweep(rng)
    g = g[: g.size // 16 * 16].copy()
    u = rng.standard_normal(g.size).astype(np.float32)
    theirs = np.empty_like(g)
    swiglu(g.size, theirs.ctypes.data, g.ctypes.data, u.ctypes.data)
    ours = run_glu(g, u, "silu", "scalar")
    if "avx512f" in lib.cpu_info()["features"]:
        assert same_bits(ours, theirs), first_diff(ours, theirs, g)
    else:  # an avx2 ggml build computes 2^n * (1 + p) differently: a few roundings apart. Each
        # side is within 2.4 ulp of float64 here (ours: test_silu_against_float64 bounds it at
        # 4); measured on Zen 3's ggml build: 10 of 128728 values 2.0-2.7 ulp apart, none more
        fin = np.isfinite(theirs) & (np.abs(theirs) > 1e-30)
        assert np.all(np.abs(ours[fin] - theirs[fin]) <= 4 * ULP * np.abs(theirs[fin]))


# ---- the fused matmul -----------------------------------------------------------------------

FORMATS = ["Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q6_K", "IQ4_XS", "I2_S", "BF16"]
NTS = list(range(1, 9)) + [19, 35]  # 19, 35: the GEMM (where its gate admits them) and a tail of 3 windows
N = 256


def weights(ggml, rng, name, rows, n=N):
    """(raw rows, w_scale) of a random matrix in format name (ggml's quantizer; I2_S: ours)."""
    w = rng.standard_normal((rows, n)).astype(np.float32)
    if name == "I2_S":
        raw, scale = K.split_tensor("I2_S", K.quantize("I2_S", w), n)
        return np.ascontiguousarray(raw), scale
    return ggml.quantize(name, w), None


def parts(fg, rg, fu, ru, x, kind, level, threads=1, sg=None, su=None):
    """The unfused reference: matmul(gate), matmul(up) at this level, then the level's epilogue."""
    act = lib.quantize_act(F[F[fg].act].id, x, ISA[level])
    g = K.matmul_act(fg, rg, act, threads=threads, w_scale=sg) if level == "native" else None
    outs = []
    for f, r, s in ((fg, rg, sg), (fu, ru, su)):
        o = np.zeros((x.shape[0], r.shape[0]), np.float32)
        n = x.shape[1]
        lib.matmul_act(F[f].id, r, act, n, 1.0 if s is None else s, o, 0, r.shape[0], threads, ISA[level])
        outs.append(o)
    del g
    return run_glu(outs[0].ravel(), outs[1].ravel(), kind, level).reshape(outs[0].shape)


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("name", FORMATS)
def test_matmul_glu_equals_parts(ggml, rng, name, level, kind):
    rows = 67
    rg, sg = weights(ggml, rng, name, rows)
    ru, su = weights(ggml, rng, name, rows)
    x = rng.standard_normal((max(NTS), N)).astype(np.float32)
    for nt in NTS:
        want = parts(name, rg, name, ru, x[:nt], kind, level, sg=sg, su=su)
        got = K.matmul_glu(name, rg, ru, x[:nt], kind=kind, threads=1, isa=level, w_scale_gate=sg, w_scale_up=su)
        assert same_bits(got, want), (name, level, kind, nt, first_diff(got, want, want))
        # a token's row alone equals its row in the window (I2 through the epilogue)
        if nt in (5, 19, 35):
            for t in (0, nt - 1):
                one = K.matmul_glu(name, rg, ru, x[t:t + 1], kind=kind, threads=1, isa=level, w_scale_gate=sg,
                                   w_scale_up=su)
                assert same_bits(one[0], got[t]), (name, level, kind, nt, t)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("pair", [("Q4_K", "Q6_K"), ("Q4_0", "Q8_0"), ("IQ4_XS", "Q4_K")])
def test_matmul_glu_mixed_formats(ggml, rng, pair, level):
    """gate and up in different formats that pair with one activation format."""
    fg, fu = pair
    rg, _ = weights(ggml, rng, fg, 33)
    ru, _ = weights(ggml, rng, fu, 33)
    x = rng.standard_normal((19, N)).astype(np.float32)
    for nt in (1, 3, 8, 19):
        want = parts(fg, rg, fu, ru, x[:nt], "silu", level)
        got = K.matmul_glu(fg, rg, ru, x[:nt], fmt_up=fu, threads=1, isa=level)
        assert same_bits(got, want), (pair, level, nt)


@pytest.mark.parametrize("name", ["Q4_1", "Q4_K", "BF16", "I2_S"])
def test_matmul_glu_threads(ggml, rng, name):
    """I3: 1 and 2 threads, and a bigger matrix (several tiles per thread), bitwise equal."""
    for rows, n in ((67, N), (1537, 512)):
        rg, sg = weights(ggml, rng, name, rows, n)
        ru, su = weights(ggml, rng, name, rows, n)
        x = rng.standard_normal((19, n)).astype(np.float32)
        for nt in (1, 8, 19):
            a = K.matmul_glu(name, rg, ru, x[:nt], threads=1, w_scale_gate=sg, w_scale_up=su)
            b = K.matmul_glu(name, rg, ru, x[:nt], threads=2, w_scale_gate=sg, w_scale_up=su)
            assert same_bits(a, b), (name, rows, nt)
            want = parts(name, rg, name, ru, x[:nt], "silu", lib.cpu_info()["selected"], threads=2, sg=sg, su=su)
            assert same_bits(a, want)


def first_bad_block(got, want, block_bytes):
    """(token, block) of the first block where two quantized outputs differ (a failure's message)."""
    t, b = np.argwhere(got != want)[0]
    return int(t), int(b) // block_bytes


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("gate_fmt,out_fmt", [("Q4_1", "Q8_1"), ("Q4_K", "Q8_K"), ("Q4_0", "Q8_0")])
def test_glu_output_quantized_by_its_dispatch(ggml, rng, gate_fmt, out_fmt, level):
    """ActOut (csrc/matmul.h): the thread that makes a tile of the GLU's output quantizes it into the
    down projection's activation format. The bytes equal one quantization of the whole output
    afterwards (the level's quantizer, block by block), and the floats are unchanged: for windows,
    the 16-token window, the GEMM with a tail (35), 1 and 2 threads, and row counts of 1, 3 and 7
    blocks of 256 (so the threads' parts, which start at block edges, are uneven)."""
    bb = {"Q8_0": 34, "Q8_1": 36, "Q8_K": 292}[out_fmt]
    blk = {"Q8_0": 32, "Q8_1": 32, "Q8_K": 256}[out_fmt]
    for rows in (256, 768, 1792):
        rg, _ = weights(ggml, rng, gate_fmt, rows)
        ru, _ = weights(ggml, rng, gate_fmt, rows)
        x = (rng.standard_normal((35, N)) * 3).astype(np.float32)
        for nt in (1, 8, 16, 35):
            act = lib.quantize_act(F[F[gate_fmt].act].id, x[:nt], ISA[level])
            for threads in (1, 2):
                out = np.empty((nt, rows), np.float32)
                q = lib.matmul_glu(F[gate_fmt].id, rg, 1.0, F[gate_fmt].id, ru, 1.0, act, N, KINDS["silu"], out,
                                   threads, ISA[level], F[out_fmt].id)
                want_f = K.matmul_glu(gate_fmt, rg, ru, x[:nt], threads=1, isa=level)
                assert same_bits(out, want_f), (gate_fmt, level, rows, nt, threads)
                want = lib.quantize_act(F[out_fmt].id, want_f, ISA[level])
                assert q.shape == want.shape and np.array_equal(q, want), \
                    (gate_fmt, out_fmt, level, rows, nt, threads, "first bad (token, block):",
                     first_bad_block(q, want, bb), f"blocks of {blk}")


def test_glu_output_quantized_checks_its_format(ggml, rng):
    rg, _ = weights(ggml, rng, "Q4_K", 64)
    x = rng.standard_normal((2, N)).astype(np.float32)
    act = lib.quantize_act(F["Q8_K"].id, x, -1)
    out = np.empty((2, 64), np.float32)
    with pytest.raises(ValueError, match="block by block"):
        lib.matmul_glu(F["Q4_K"].id, rg, 1.0, F["Q4_K"].id, rg, 1.0, act, N, 0, out, 1, -1, F["I8_S"].id)
    with pytest.raises(ValueError, match="do not divide the 64 rows"):
        lib.matmul_glu(F["Q4_K"].id, rg, 1.0, F["Q4_K"].id, rg, 1.0, act, N, 0, out, 1, -1, F["Q8_K"].id)


def test_matmul_glu_close_to_float64(ggml, rng):
    """Sanity against the math: silu(G x) * (U x) with dequantized weights, within the
    activation rounding (~1e-2 relative to the largest output)."""
    rg, _ = weights(ggml, rng, "Q8_0", 40)
    ru, _ = weights(ggml, rng, "Q8_0", 40)
    x = rng.standard_normal((3, N)).astype(np.float32)
    G = K.dequantize("Q8_0", rg).astype(np.float64) @ x.T.astype(np.float64)
    U = K.dequantize("Q8_0", ru).astype(np.float64) @ x.T.astype(np.float64)
    want = (G / (1 + np.exp(-G)) * U).T
    got = K.matmul_glu("Q8_0", rg, ru, x)
    assert np.abs(got - want).max() <= 2e-2 * np.abs(want).max()


def test_matmul_glu_checks_arguments(ggml, rng):
    rg, _ = weights(ggml, rng, "Q4_0", 4)
    ru, _ = weights(ggml, rng, "Q4_0", 5)
    rk, _ = weights(ggml, rng, "Q4_K", 4)
    x = np.zeros((2, N), np.float32)
    with pytest.raises(ValueError, match="kind"):
        K.matmul_glu("Q4_0", rg, rg, x, kind="gelu")
    with pytest.raises(ValueError, match="rows"):
        K.matmul_glu("Q4_0", rg, ru, x)
    with pytest.raises(ValueError, match="activation formats"):
        K.matmul_glu("Q4_0", rg, rk, x, fmt_up="Q4_K")
    with pytest.raises(ValueError, match="values per token"):
        K.matmul_glu("Q4_0", rg, rg, np.zeros((2, N + 32), np.float32))
    with pytest.raises(TypeError, match="uint8"):
        K.matmul_glu("Q4_0", rg.astype(np.int16), rg, x)
    with pytest.raises(TypeError, match="float"):
        K.matmul_glu("Q4_0", rg, rg, np.zeros((2, N), np.int32))
    with pytest.raises(ValueError, match="threads"):
        K.matmul_glu("Q4_0", rg, rg, x, threads=0)
    with pytest.raises(ValueError, match="isa"):
        K.matmul_glu("Q4_0", rg, rg, x, isa="sse2")
    with pytest.raises(ValueError, match="w_scale"):
        K.matmul_glu("I2_S", np.zeros((4, 64), np.uint8), np.zeros((4, 64), np.uint8), x)
    with pytest.raises(ValueError, match="shape"):
        K.glu(np.zeros(3), np.zeros(4))


def test_stats_show_the_path(ggml, rng):
    # (Q6_K: 11 tokens are below its GEMM's gate at every level, 12 at avx512: two windows)
    rg, _ = weights(ggml, rng, "Q6_K", 10)
    x = rng.standard_normal((11, N)).astype(np.float32)
    K.reset_stats()
    K.matmul_glu("Q6_K", rg, rg, x, threads=1)
    s = K.stats()
    rows = {(d["format"], d["nt"]): d for d in s if d["format"]}
    assert rows[("Q6_K", 8)]["calls"] == 2 and rows[("Q6_K", 3)]["calls"] == 2  # gate and up, 2 windows
    glu = [d for d in s if d["format"] is None]
    assert len(glu) == 1 and glu[0]["op"] == "silu" and glu[0]["kernel"] == K.glu_kernel()[0]
    quant = [d for d in s if d.get("op") == "quantize"]  # the 11 tokens, once for gate and up
    assert [(d["format"], d["calls"], d["rows"]) for d in quant] == [("Q8_K", 1, 11)]
    assert glu[0]["calls"] == 1 and glu[0]["rows"] == 10 and glu[0]["values"] == 110
    K.reset_stats()
    assert K.stats() == []


@pytest.mark.skipif("avx512" not in LEVELS, reason="needs the avx512 level: CPU flags avx512f/bw/vl/dq + avx512_vnni, under LOWBIT_MAX_ISA=avx512")
def test_env_turns_the_simd_epilogue_off():
    env = dict(os.environ, LOWBIT_NO_GLU_AVX512="1", LOWBIT_NO_GLU_AVX2="1")
    code = "from lowbit._native import lib; c = lib.cpu_info(); print(c['glu'], ' '.join(c['disabled']))"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    name, *disabled = out.split()
    assert name == "glu_scalar" and "glu_avx512" in disabled and "glu_avx2" in disabled
    env = dict(os.environ, LOWBIT_NO_GLU_AVX512="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split()[0] == "glu_avx2"
