"""The Mamba-2 mixer (granitehybrid's SSM layers, csrc/mamba2.cpp) at every ISA level: the scan
kernel bitwise against the scalar reference and within 1e-5 of float64, a one-layer model against
a float64 oracle written from llama.cpp's graph, and a token's logits independent of chunking,
threads and batch partners (I8). In .ci/run's LEVEL_TESTS (llama.cpp parity, rewinds and the
server's prefix cache: tests/test_granite_hybrid.py)."""
import numpy as np
import pytest

import lowbit
from conftest import LEVELS
from llama_ref import hybrid_chunks_threads_batches_bitwise
from lowbit._native import lib
from lowbit.synth import synth_granite_hybrid


def scan64(s, B, C, x, dt, dA):
    """float64: s[i] = s[i] dA + B (x[i] dt); y[i] = s[i] . C."""
    s = s * dA + np.outer(x * dt, B)
    return s, s @ C


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("P,N", [(64, 128), (3, 8), (5, 24), (1, 16), (4, 12), (7, 5)])
def test_scan_kernel_bitwise_reference_and_float64(level, P, N):
    """One token's scan on one head, chained over 6 tokens (the state feeds the next step): every
    level's state and output bitwise the scalar reference's (the contract: the same operations in
    the same order), and within 1e-5 of float64 relative to the largest |state| / |output|. N not a
    multiple of 8: the SIMD kernels hand it to the reference. Extreme steps: dA 1 (no forgetting),
    a tiny dA, dt 0 (no write), a large dt."""
    isa = list(lib.isa_names())
    rng = np.random.default_rng(P * 1000 + N)
    s = (rng.standard_normal((P, N)) * 3).astype(np.float32)
    s_ref, s64 = s.copy(), s.astype(np.float64)
    for step, (dt, dA) in enumerate([(0.05, 0.9), (0.1, 1.0), (0.5, 1e-3), (0.0, 0.5), (4.0, 0.999), (0.01, 0.2)]):
        B, C, x = ((rng.standard_normal(n) * sc).astype(np.float32) for n, sc in ((N, 1), (N, 1), (P, 4)))
        y, name = lib.ssm_scan(s, B, C, x, dt, dA, isa.index(level))
        y_ref, ref_name = lib.ssm_scan(s_ref, B, C, x, dt, dA, isa.index("scalar"))
        s64, y64 = scan64(s64, B.astype(np.float64), C.astype(np.float64), x.astype(np.float64), dt, dA)
        assert ref_name == "scan_scalar" and name in ("scan_scalar", "scan_avx2")  # (avx, ARM: the reference)
        bad = np.flatnonzero(y[0] != y_ref[0])
        assert np.array_equal(s, s_ref) and not bad.size, f"{name} step {step}: rows {bad[:8]} differ from the reference"
        es = np.abs(s - s64).max() / np.abs(s64).max()
        eo = np.abs(y[0] - y64).max() / np.abs(y64).max()
        assert es <= 1e-5 and eo <= 1e-5, f"{name} step {step}: state {es:.2e}, output {eo:.2e}"


# ---- a one-layer model against float64 ------------------------------------------------------

def _f32(f, name):
    t = f.tensors[name]
    assert t.format.name == "F32", name
    return np.asarray(t.raw).view(np.float32).reshape(t.shape).astype(np.float64)


def oracle_logits(path, ids):
    """float64 forward of a one-layer granitehybrid model (that layer a Mamba-2 mixer, a dense
    SwiGLU FFN), from llama.cpp's build_mamba2_layer and the granite graph: embeddings times
    embedding_scale; zxBCdt = ssm_in h; xBC through the causal conv (+ bias) and silu; per head h
    of group g = h / (H / G): dt = softplus(dt + dt_bias), s = s exp(dt A) + (x dt) B^T, y = s C;
    y += x D; y *= silu(z); an RMSNorm per group times ssm_norm; out = ssm_out y; each block's
    output times residual_scale before its add; logits / logit_scale."""
    f = lowbit.gguf.open(path)
    md, a = f.metadata, "granitehybrid"
    N, G, H, di, K = (md[f"{a}.ssm.state_size"], md[f"{a}.ssm.group_count"], md[f"{a}.ssm.time_step_rank"],
                      md[f"{a}.ssm.inner_size"], md[f"{a}.ssm.conv_kernel"])
    eps, res = md[f"{a}.attention.layer_norm_rms_epsilon"], md[f"{a}.residual_scale"]
    P, cd = di // H, di + 2 * G * N
    W = lambda n: _f32(f, n)  # noqa: E731

    def rms(x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w

    def silu(x):
        return x / (1 + np.exp(-x))
    x = W("token_embd.weight")[ids] * md[f"{a}.embedding_scale"]
    T = len(ids)
    h = rms(x, W("blk.0.attn_norm.weight"))
    zx = h @ W("blk.0.ssm_in.weight").T
    z, xbc, dt = zx[:, :di], zx[:, di:di + cd], zx[:, di + cd:]
    cw = W("blk.0.ssm_conv1d.weight")                        # [channels, K]
    xp = np.concatenate([np.zeros((K - 1, cd)), xbc])
    conv = silu(np.stack([(xp[t:t + K] * cw.T).sum(0) for t in range(T)]) + W("blk.0.ssm_conv1d.bias"))
    xs = conv[:, :di].reshape(T, H, P)
    B = conv[:, di:di + G * N].reshape(T, G, N)
    C = conv[:, di + G * N:].reshape(T, G, N)
    dt = np.log1p(np.exp(dt + W("blk.0.ssm_dt.bias")))
    A, D = W("blk.0.ssm_a")[:, 0], W("blk.0.ssm_d")[:, 0]
    s = np.zeros((H, P, N))
    y = np.zeros((T, H, P))
    for t in range(T):
        for hh in range(H):
            g = hh // (H // G)
            s[hh] = s[hh] * np.exp(dt[t, hh] * A[hh]) + np.outer(xs[t, hh] * dt[t, hh], B[t, g])
            y[t, hh] = s[hh] @ C[t, g]
    y = (y + xs * D[None, :, None]).reshape(T, di) * silu(z)
    y = rms(y.reshape(T, G, di // G), W("blk.0.ssm_norm.weight")).reshape(T, di)
    x = x + (y @ W("blk.0.ssm_out.weight").T) * res
    h = rms(x, W("blk.0.ffn_norm.weight"))
    ffn = (silu(h @ W("blk.0.ffn_gate.weight").T) * (h @ W("blk.0.ffn_up.weight").T)) @ W("blk.0.ffn_down.weight").T
    x = x + ffn * res
    return rms(x, W("output_norm.weight")) @ W("output.weight").T / md[f"{a}.logit_scale"]


@pytest.fixture(scope="module")
def one_layer(tmp_path_factory):
    return synth_granite_hybrid(tmp_path_factory.mktemp("mamba2") / "one.gguf", layers=1, dim=64, ffn=128, heads=2,
                                kv_heads=1, attn_layers=(), ssm_state=16, ssm_groups=2, ssm_heads=4, wtype="F32",
                                seed=11)


def test_mamba2_layer_against_float64_oracle(one_layer, monkeypatch):
    m = lowbit.load(one_layer, n_ctx=64, threads=2)
    ids = m.tokenize("In a hole in the ground there lived a hobbit, not a nasty dirty wet hole")[:24]
    ours = m.logits(ids, chunk=24)
    ref = oracle_logits(one_layer, ids)
    err = np.abs(ours - ref).max(1) / np.abs(ref).max(1)
    worst = int(err.argmax())
    assert err.max() <= 1e-4, f"position {worst}: relative error {err[worst]:.2e}"
    # the oracle can fail: without the D skip (ssm_d bound as zeros) the logits are far off
    from lowbit.model import Model
    real = Model._vec

    def vec(self, slot, layer, name, engine=None, keep=None, rows=None):
        real(self, slot, layer, name, engine, keep, rows)
        if slot == "ssm_d":
            zeros = np.zeros(self._tensor(name).shape[0], np.float32)
            self._keep.append(zeros)
            self.engine.set_vec(slot, layer, zeros)
    monkeypatch.setattr(Model, "_vec", vec)
    wrong = lowbit.load(one_layer, n_ctx=64, threads=2).logits(ids, chunk=24)
    assert (np.abs(wrong - ref).max(1) / np.abs(ref).max(1)).max() > 1e-2


def test_chunks_threads_and_batches_bitwise(tmp_path):
    """A token's logits do not depend on how its prompt was chunked, on the thread count or on
    another slot sharing its batch (I8): the scan runs each slot's tokens in order."""
    p = synth_granite_hybrid(tmp_path / "gh.gguf", layers=3, dim=128, ffn=256, heads=2, kv_heads=1, attn_layers=(1,),
                             ssm_state=32, ssm_groups=2, ssm_heads=4, experts=4, top_k=2, shared_ffn=64,
                             expert_type="Q8_0", seed=5)
    hybrid_chunks_threads_batches_bitwise(p)
