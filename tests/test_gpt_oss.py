"""gpt-oss (llama.cpp's LLM_ARCH_OPENAI_MOE) on small synthetic files, against llama.cpp.

The model is written by lowbit.synth.synth_moe(arch="gpt-oss"): 4 layers, width 256, 4 query
heads of 64 over 2 KV heads, 8 experts of width 256 in MXFP4, top-4, q/k/v/o biases, a sink logit
per head, router and expert biases, YaRN rope (factor 32 over 4096, base 150000), and a sliding
window of 8 positions on the even layers (so a 60-token sequence leaves most keys outside the
window). Each feature moves the logits by whole units when it is wrong (test_each_feature_matters
checks the comparison can fail). Parity as tests/test_moe.py: teacher-forced over llama.cpp's own
greedy continuation, top-1 agreement >= 99% where llama.cpp's top-2 margin is >= 0.1 (leaving out
positions whose routing is a near-tie in lowbit's router, at most 10% of them), and perplexity
within 0.5% of llama.cpp's, computed the same way on the same text.
"""
import os

import numpy as np
import pytest

import lowbit
from llama_ref import llama_greedy, llama_perplexity
from lowbit.synth import synth_moe

PROMPT = b"Once upon a time, in a small village by the sea, the quick brown fox"
GEN = 40
ROUTE_TIE = 1e-3  # router logit margin below which a position's routing is a coin toss
SHAPE = dict(arch="gpt-oss", layers=4, dim=256, heads=4, kv_heads=2, head_dim=64, experts=8, top_k=4,
             expert_ffn=256, window=8, embd_type="F16", wtype="Q8_0", expert_type="MXFP4", seed=3)


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return synth_moe(tmp_path_factory.mktemp("oss") / "gpt-oss.gguf", **SHAPE)


@pytest.fixture(scope="module")
def llm(path):
    from lowbit import peer
    # one llama.cpp thread: its per-node thread barrier stalls for seconds on a busy machine
    return peer.Llama(path, n_ctx=128, logits_all=True, verbose=False, n_threads=1)


def test_config_reads_every_feature(path):
    c = lowbit.load(path, n_ctx=64).config
    assert c.arch == "gpt-oss" and c.rope_neox and c.qkv_bias and c.attn_out_bias and c.attn_sinks
    assert c.moe_bias and c.expert_gating == "softmax_topk" and c.ffn_act == "swiglu_oai" and not c.expert_norm
    assert c.ffn_norm == "post_attention_norm" and c.window == (8, 0, 8, 0)       # even layers slide (pattern 2)
    assert (c.n_expert, c.n_expert_used, c.expert_ffn, c.head_dim) == (8, 4, 256, 64)
    assert c.rope_scale == 1 / 32 and c.yarn_ext_factor == 1.0 and c.yarn_orig_ctx == 4096
    assert abs(c.yarn_attn_factor - 1.0) < 1e-6  # llama.cpp's: mscale(32) / (1 + 0.1 ln 32), in float


def compare(m, llm, min_counted=20):
    c = m.config
    ids, ref = llama_greedy(llm, llm.tokenize(PROMPT, add_bos=False), GEN)
    m.reset()
    ours = m.forward(ids, all_logits=True)
    tie = np.zeros(len(ids), bool)
    for layer in range(c.n_layer):
        tie |= np.array(m.engine.last_route_margins(layer)) < ROUTE_TIE
    top2 = np.sort(ref, 1)[:, -2:]
    clear = (top2[:, 1] - top2[:, 0] >= 0.1) & ~tie
    agree = int((ours.argmax(1) == ref.argmax(1))[clear].sum())
    return ids, ours, ref, tie, int(clear.sum()), agree


def test_matches_llama_cpp(path, llm):
    m = lowbit.load(path, n_ctx=128, threads=2)
    ids, ours, ref, tie, counted, agree = compare(m, llm)
    assert len(ids) > 6 * SHAPE["window"]
    assert tie.sum() <= 0.1 * len(ids), f"{int(tie.sum())} routing near-ties in {len(ids)} positions"
    assert counted >= 20, f"only {counted} positions with a margin >= 0.1"
    assert agree >= 0.99 * counted, f"top-1 agrees at {agree}/{counted} positions with margin >= 0.1"
    spread = float((ref.max(1) - ref.min(1)).mean())
    diff = np.abs(ours - ref)[~tie]
    print(f"\ngpt-oss: top-1 {agree}/{counted}; max |logit diff| {diff.max():.4f}, mean {diff.mean():.5f}, "
          f"spread {spread:.2f}")
    picked = ref[np.arange(len(ids)), ours.argmax(1)]
    assert float((ref.max(1) - picked)[~tie].max()) <= 0.1
    # routing is not degenerate: every expert gets tokens at every layer
    for layer in range(m.config.n_layer):
        assert len(set(m.engine.last_routes(layer))) == SHAPE["experts"], layer


def test_perplexity_matches_llama_cpp(path, llm):
    """llama.cpp's method (the second half of each 128-token chunk scored), lowbit.perplexity's
    code for lowbit, the same arithmetic on llama.cpp's logits."""
    from lowbit.perplexity import perplexity
    m = lowbit.load(path, n_ctx=128, threads=2)
    text = open(os.path.join(os.path.dirname(lowbit.__file__), "data", "passage.txt"), encoding="utf-8").read()
    ctx = 128
    ours, n = perplexity(m, text, ctx=ctx, progress=False)
    theirs, count = llama_perplexity(llm, text, ctx)
    assert count == n and n >= 100
    print(f"\ngpt-oss perplexity lowbit {ours:.4f} llama.cpp {theirs:.4f} ({n} tokens)")
    assert abs(ours - theirs) <= 0.005 * theirs


def test_each_feature_matters(path, llm, monkeypatch):
    """The comparison can fail: the same file with one feature switched off in lowbit (every layer's
    window opened, the sinks dropped, YaRN off, the router / expert biases or the attention output
    bias left out, the plain SwiGLU) no longer matches llama.cpp at the positions that remain."""
    import dataclasses
    from lowbit.model import ModelConfig
    real = ModelConfig.from_gguf
    off = {"yarn": dict(yarn_ext_factor=0.0, rope_scale=1.0), "moe_bias": dict(moe_bias=False),
           "attn_out_bias": dict(attn_out_bias=False), "swiglu": dict(ffn_act="silu")}
    for what in ("window", "sinks", *off):
        if what in off:
            monkeypatch.setattr(ModelConfig, "from_gguf",
                                classmethod(lambda cls, f, w=what: dataclasses.replace(real(f), **off[w])))
        m = lowbit.load(path, n_ctx=128, threads=2)
        monkeypatch.setattr(ModelConfig, "from_gguf", real)
        for i in range(m.config.n_layer):
            if what == "window":
                m.engine.set_window(i, 0)
            elif what == "sinks":
                m.engine.set_vec("attn_sinks", i, np.full(m.config.n_head, -np.inf, np.float32))
        ids, ours, ref, tie, counted, agree = compare(m, llm)
        diff = float(np.abs(ours - ref)[~tie].max())
        assert diff > 0.5, f"{what} off: max |logit diff| only {diff:.3f}"


def test_window_chunks_and_threads_bitwise(path):
    """A token's logits do not depend on its window (alone, all at once, chunks of 7) or threads,
    with sliding-window layers whose keys start past position 0."""
    m2 = lowbit.load(path, n_ctx=64, threads=2)
    ids = m2.tokenize("In a hole in the ground there lived a hobbit, not a nasty dirty wet hole")[:24]
    whole = m2.logits(ids, chunk=24)
    assert np.array_equal(m2.logits(ids, chunk=7), whole)
    m2.reset()
    alone = np.concatenate([m2.forward([t], all_logits=True) for t in ids])
    assert np.array_equal(alone, whole)
    m1 = lowbit.load(path, n_ctx=64, threads=1)
    assert np.array_equal(m1.logits(ids, chunk=24), whole)
    m2.rewind(15)
    assert np.array_equal(m2.forward(ids[15:], all_logits=True), whole[15:])


def test_synth_cli_writes_gpt_oss(tmp_path):
    from lowbit.cli import main
    out = tmp_path / "o.gguf"
    assert main(["synth", "moe", str(out), "--arch", "gpt-oss", "--layers", "2", "--dim", "128", "--heads", "2",
                 "--kv-heads", "1", "--head-dim", "64", "--experts", "4", "--top-k", "2", "--ffn", "64",
                 "--window", "4"]) == 0
    f = lowbit.gguf.open(str(out))
    assert f.metadata["general.architecture"] == "gpt-oss"
    assert f.tensors["blk.0.ffn_gate_exps.weight"].format.name == "MXFP4"
    assert f.tensors["blk.1.attn_sinks.weight"].shape == (2,)
    m = lowbit.load(str(out), n_ctx=32)
    assert m.config.window == (4, 0) and m.forward([1, 2, 3]).shape == (1, m.config.vocab)


def test_swiglu_oai_epilogue():
    """gpt-oss's clamped SwiGLU (llama.cpp's swiglu_oai): x = min(g, 7), y = clamp(u, -7, 7),
    x * sigmoid(1.702 x) * (y + 1), against numpy in float64 (libm's expf: a few float ulps)."""
    from lowbit._native import lib
    g = np.array([-100, -8, -7, -1, -1e-3, 0, 1e-3, 0.5, 1, 6.9, 7, 7.5, 100, np.inf, -np.inf], np.float32)
    u = np.array([-100, -8, -7.5, -7, -1, 0, 0.5, 1, 6.9, 7, 7.5, 100, 3, -3, 2], np.float32)
    out = np.empty_like(g)
    lib.glu(g, u, out, 2)
    x = np.minimum(g.astype(np.float64), 7.0)
    y = np.clip(u.astype(np.float64), -7.0, 7.0)
    with np.errstate(over="ignore", invalid="ignore"):
        ref = x / (1.0 + np.exp(1.702 * -x)) * (y + 1.0)
    ref[g == -np.inf] = np.nan  # -inf / inf, as ggml's loop
    np.testing.assert_allclose(out, ref, rtol=1e-6, atol=1e-30, equal_nan=True)
    with pytest.raises(ValueError, match="unknown GLU kind"):
        lib.glu(g, u, out, 99)
