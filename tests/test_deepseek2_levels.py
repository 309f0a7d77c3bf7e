"""The level-dependent part of the deepseek2 tests (CI repeats it under each LOWBIT_MAX_ISA cap,
.ci/run): the MLA attention kernel (kernels.h mla_f16_fn) at every level against the scalar
reference, float64 and the engine's attention kernel; the engine's top-1 agreement with llama.cpp
on both synthetic models (tests/deepseek2_models.py) and its chunk / thread / rewind invariance.
"""
import numpy as np
import pytest

from conftest import LEVELS
from deepseek2_models import MODELS, ds, load  # noqa: F401 (fixture)
from gemma_glm_models import compare
from lowbit._native import lib

ISA = {n: i for i, n in enumerate(lib.isa_names())}


# ---- llama.cpp and the engine -----------------------------------------------------------------

@pytest.mark.parametrize("which", list(MODELS))
def test_matches_llama_cpp(which, ds):
    path, llm, run = ds(which)
    m = load(path)
    ids, ours, ref, tie, counted, agree = compare(m, run)
    assert tie.sum() <= 0.15 * len(ids), f"{int(tie.sum())} routing near-ties in {len(ids)} positions"
    assert counted >= 20, f"only {counted} positions with a margin >= 0.1"
    assert agree >= 0.99 * counted, f"top-1 agrees at {agree}/{counted} positions with margin >= 0.1"
    diff = np.abs(ours - ref)[~tie]
    print(f"\ndeepseek2 {which}: top-1 {agree}/{counted}; max |logit diff| {diff.max():.4f}, "
          f"mean {diff.mean():.5f}, spread {float((ref.max(1) - ref.min(1)).mean()):.2f}")
    for layer in range(m.config.n_dense_lead, m.config.n_layer):  # routing is not degenerate
        assert len(set(m.engine.last_routes(layer))) >= m.config.n_expert // 2, layer


@pytest.mark.parametrize("which", list(MODELS))
def test_chunks_threads_rewind_bitwise(which, ds):
    """A token's logits do not depend on the chunking (1, 7, all at once), the threads (the MLA
    kernel's head groups follow them) or a rewind."""
    path = ds(which)[0]
    m2 = load(path, n_ctx=64)
    ids = m2.tokenize("In a hole in the ground there lived a hobbit, not a nasty dirty wet hole")[:24]
    whole = m2.logits(ids, chunk=24)
    assert np.array_equal(m2.logits(ids, chunk=1), whole)
    assert np.array_equal(m2.logits(ids, chunk=7), whole)
    m1 = load(path, n_ctx=64, threads=1)
    assert np.array_equal(m1.logits(ids, chunk=24), whole)
    m2.rewind(15)
    assert np.array_equal(m2.forward(ids[15:], all_logits=True), whole[15:])


# ---- the MLA kernel --------------------------------------------------------------------------

def _mla_inputs(rng, nh=16, dk=80, kd=88, n=300):
    q = (rng.standard_normal((nh, dk)) * 0.5).astype(np.float32)
    C = (rng.standard_normal((n, kd)) * 0.5).astype(np.float16).view(np.uint16)
    return q, C


@pytest.mark.parametrize("level", LEVELS)
def test_mla_kernel_matches_reference(rng, level):
    """Every level against the scalar reference (the spec) and float64 within the half rounding
    of the probabilities (tests/test_attn.py's bound), for every key count 1..40 and a long one
    (the tails of the key groups and blocks); head h's output does not depend on the other heads
    of the call (I3: the engine groups heads by threads)."""
    q, C = _mla_inputs(rng)
    scale = 0.17
    vmax = float(np.abs(C[:, :64].view(np.float16)).max())
    for n in list(range(1, 41)) + [300]:
        ref, name0 = lib.attend_mla(q, np.ascontiguousarray(C[:n]), 64, scale, ISA["scalar"])
        ours, name = lib.attend_mla(q, np.ascontiguousarray(C[:n]), 64, scale, ISA[level])
        assert np.abs(ours - ref).max() <= 2.0 ** -11 * vmax + 1e-6, (level, n, name)
        Cf = C[:n].view(np.float16).astype(np.float64)
        qh = q.astype(np.float16).astype(np.float64)
        s = scale * qh @ Cf[:, :80].T
        p = np.exp(s - s.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        exact = p @ Cf[:, :64]
        assert np.abs(ours - exact).max() <= 2.0 ** -11 * vmax + 1e-6, (level, n)
        for h0, h1 in ((0, 1), (3, 7), (5, 16)):
            part, _ = lib.attend_mla(np.ascontiguousarray(q[h0:h1]), np.ascontiguousarray(C[:n]), 64, scale, ISA[level])
            assert np.array_equal(part, ours[h0:h1]), (level, n, h0, h1)


@pytest.mark.parametrize("level", LEVELS)
def test_mla_kernel_rows_of_several_tokens(rng, level):
    """Rows of several tokens in one call (prefill: each row its own key count, 1..300, at and off
    the multiples of 8) give each row bitwise what it gets alone."""
    q, C = _mla_inputs(rng, nh=13)
    lens = [300, 1, 7, 8, 9, 16, 17, 31, 32, 33, 150, 299, 64]
    out, _ = lib.attend_mla(q, C, 64, 0.21, ISA[level], lens)
    for r, n in enumerate(lens):
        one, _ = lib.attend_mla(np.ascontiguousarray(q[r:r + 1]), np.ascontiguousarray(C[:n]), 64, 0.21, ISA[level])
        assert np.array_equal(one[0], out[r]), (level, r, n)


@pytest.mark.parametrize("level", LEVELS)
def test_mla_kernel_is_the_attention_kernel_per_head(rng, level):
    """With the value as wide as the key (dv = dk), each head's result is bitwise the engine's
    attention kernel (attend_f16) on that head with K = V = the latent rows, at the same level:
    the same rounding points and, per level, the same arithmetic."""
    q, C = _mla_inputs(rng, nh=5, dk=80, kd=80, n=77)
    out, _ = lib.attend_mla(q, C, 80, 0.3, ISA[level])
    for h in range(5):
        one, _ = lib.attend_f16(np.ascontiguousarray(q[h]), C, C, 0.3, ISA[level])
        assert np.array_equal(one[0], out[h]), (level, h)


def test_mla_kernel_refuses_bad_shapes():
    q = np.zeros((2, 80), np.float32)
    with pytest.raises(ValueError, match="attend_mla"):
        lib.attend_mla(q, np.zeros((4, 72), np.uint16), 64, 1.0)   # row narrower than dk
    with pytest.raises(ValueError, match="attend_mla"):
        lib.attend_mla(q, np.zeros((4, 80), np.uint16), 96, 1.0)   # dv > dk
    with pytest.raises(ValueError, match="attend_mla"):
        lib.attend_mla(q, np.zeros((4, 80), np.uint16), 64, 1.0, -1, [4, 5])   # a length beyond the rows


