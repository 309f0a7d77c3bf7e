"""The level-dependent part of the gemma3 / gemma2 / glm4moe tests (CI runs it again under each
LOWBIT_MAX_ISA cap, .ci/run): the GeGLU epilogue (csrc/kernels.h GLU_GEGLU) at every level against
the scalar reference and ggml's own gelu table, the engines' chunk- and thread-invariance, and their
top-1 agreement with llama.cpp (tests/gemma_glm_models.py has the models; tests/test_gemma_glm.py
the rest: perplexity, each feature's effect, configuration, synth, bad input).
"""
import ctypes

import numpy as np
import pytest

import lowbit
from gemma_glm_models import (compare, family, gemma_greedy, gemma_llm, gemma_path,  # noqa: F401 (fixtures)
                              gemma2_greedy, gemma2_llm, gemma2_path, glm_greedy, glm_llm, glm_path)
from conftest import LEVELS
from lowbit._native import lib

ISA = {n: i for i, n in enumerate(lib.isa_names())}


# ---- llama.cpp and the engine ----------------------------------------------------------------

@pytest.mark.parametrize("which", ["gemma3", "gemma2", "glm4moe"])
def test_matches_llama_cpp(which, request):
    path, llm, run = family(which, request)
    m = lowbit.load(path, n_ctx=128, threads=2)
    ids, ours, ref, tie, counted, agree = compare(m, run)
    assert tie.sum() <= 0.1 * len(ids), f"{int(tie.sum())} routing near-ties in {len(ids)} positions"
    assert counted >= 20, f"only {counted} positions with a margin >= 0.1"
    assert agree >= 0.99 * counted, f"top-1 agrees at {agree}/{counted} positions with margin >= 0.1"
    diff = np.abs(ours - ref)[~tie]
    print(f"\n{which}: top-1 {agree}/{counted}; max |logit diff| {diff.max():.4f}, mean {diff.mean():.5f}, "
          f"spread {float((ref.max(1) - ref.min(1)).mean()):.2f}")
    picked = ref[np.arange(len(ids)), ours.argmax(1)]
    assert float((ref.max(1) - picked)[~tie].max()) <= 0.1
    if which == "glm4moe":  # routing is not degenerate: most experts get tokens at every routed layer
        for layer in range(1, m.config.n_layer):
            assert len(set(m.engine.last_routes(layer))) >= 12, layer
    else:  # the soft-cap is on: no logit reaches it
        assert np.abs(ours).max() < 4.0


@pytest.mark.parametrize("which", ["gemma3", "gemma2", "glm4moe"])
def test_chunks_and_threads_bitwise(which, request):
    """A token's logits do not depend on how the sequence was chunked (1 token at a time, 7, all
    at once), on the threads, or on a rewind: sliding windows, soft-capped attention scores (gemma2:
    the one-row and the shared-rows kernels cap alike), the sigmoid router, the dense lead."""
    path = request.getfixturevalue({"gemma3": "gemma_path", "gemma2": "gemma2_path", "glm4moe": "glm_path"}[which])
    m2 = lowbit.load(path, n_ctx=64, threads=2)
    ids = m2.tokenize("In a hole in the ground there lived a hobbit, not a nasty dirty wet hole")[:24]
    whole = m2.logits(ids, chunk=24)
    assert np.array_equal(m2.logits(ids, chunk=1), whole)
    assert np.array_equal(m2.logits(ids, chunk=7), whole)
    m1 = lowbit.load(path, n_ctx=64, threads=1)
    assert np.array_equal(m1.logits(ids, chunk=24), whole)
    m2.rewind(15)
    assert np.array_equal(m2.forward(ids[15:], all_logits=True), whole[15:])


# ---- the GeGLU epilogue ----------------------------------------------------------------------

GEGLU = 3


def run_geglu(g, u, level):
    out = np.empty_like(g)
    lib.glu(np.ascontiguousarray(g), np.ascontiguousarray(u), out, GEGLU, ISA[level])
    return out


def ggml_gelu_table():
    """ggml's ggml_table_gelu_f16 (filled by ggml_cpu_init), as float32."""
    from lowbit.ggml_oracle import ggml
    arr = (ctypes.c_uint16 * 65536).in_dll(ggml().cpu, "ggml_table_gelu_f16")
    return np.frombuffer(arr, np.uint16).copy().view(np.float16).astype(np.float32)


def geglu_inputs(rng):
    every_half = np.arange(65536, dtype=np.uint16).view(np.float16).astype(np.float32)
    bits = rng.integers(0, 2 ** 32, 20000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    edges = np.array([-10.0, np.nextafter(np.float32(-10), np.float32(0)), 10.0,
                      np.nextafter(np.float32(10), np.float32(0)), -9.999, 9.999, 0.0, -0.0, np.inf, -np.inf,
                      np.nan, 65504.0, 65520.0, -65520.0, 1e-8, -1e-8], np.float32)
    return np.concatenate([edges, every_half, (rng.standard_normal(30000) * 3).astype(np.float32),
                           np.linspace(-12, 12, 20001, dtype=np.float32), bits]).astype(np.float32)


def test_geglu_equals_ggml_table_and_loop(rng):
    """The scalar reference is ggml_vec_geglu_f32 (GGML_GELU_FP16): x <= -10: 0; x >= 10: x * g;
    else table[fp16(x)] * g with ggml's own table, read from libggml-cpu (and fp16() = numpy's
    round-to-nearest-even)."""
    table = ggml_gelu_table()
    g = geglu_inputs(rng)
    u = rng.standard_normal(g.size).astype(np.float32)
    ours = run_geglu(g, u, "scalar")
    with np.errstate(all="ignore"):
        h = g.astype(np.float16).view(np.uint16)
        want = np.where(g <= -10, np.float32(0), np.where(g >= 10, g * u, table[h] * u)).astype(np.float32)
    fin = ~np.isnan(want)
    assert np.array_equal(np.isnan(ours), ~fin)
    bad = np.flatnonzero(ours[fin].view(np.uint32) != want[fin].view(np.uint32))
    assert bad.size == 0, f"{bad.size} differ; first g={g[fin][bad[:3]]}: {ours[fin][bad[:3]]} vs {want[fin][bad[:3]]}"


def test_geglu_close_to_float64(rng):
    """Sanity against the math: gelu-tanh in float64 of the half-rounded input. The result is a
    half (2^-11 relative) computed in float, whose 1 + tanh cancels for x < -2: error <= 2^-9 of
    the larger of |exact| and 2e-4."""
    g = (rng.standard_normal(50000) * 3).astype(np.float32)
    g = g[np.abs(g) < 9.9]
    u = np.ones_like(g)
    x = g.astype(np.float16).astype(np.float64)
    exact = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * x * (1 + 0.044715 * x * x)))
    ours = run_geglu(g, u, "scalar").astype(np.float64)
    assert np.all(np.abs(ours - exact) <= 2.0 ** -9 * np.maximum(np.abs(exact), 2e-4))


@pytest.mark.parametrize("level", LEVELS)
def test_geglu_every_level_equals_scalar_bitwise(rng, level):
    g = geglu_inputs(rng)
    u = rng.standard_normal(g.size).astype(np.float32)
    u[:16] = 1.0
    ref = run_geglu(g, u, "scalar")
    ours = run_geglu(g, u, level)
    assert np.array_equal(ours.view(np.uint32), ref.view(np.uint32)), level
    for n in list(range(0, 40)) + [1535, 1537]:  # every tail length; nothing written past n
        out = np.full(n + 16, 12345.0, np.float32)
        lib.glu(g[5:5 + n].copy(), u[5:5 + n].copy(), out[:n], GEGLU, ISA[level])
        assert np.array_equal(out[:n].view(np.uint32), ref[5:5 + n].view(np.uint32)), (level, n)
        assert np.all(out[n:] == 12345.0)
