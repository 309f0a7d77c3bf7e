"""Phi-3 / Phi-3.5 / Phi-4 (llama.cpp's phi3) on a small synthetic file, against llama.cpp.

The file (lowbit.synth.synth_dense(arch="phi3")): 4 layers, width 256, 4 query heads of 64 over 2
KV heads, rope over 48 of the 64 dims (Phi-4-mini's partial rotary), the fused attn_qkv ([q | k | v]
rows) and ffn_up ([gate | up]) as convert_hf_to_gguf writes them, LongRoPE for a context of 4096
over an original 300 (rope_factors_long / _short, rope.scaling.attn_factor), and a sliding_window
key of 15 that llama.cpp ignores for phi3 (so must lowbit). Both engines choose the factors by the
context rounded up to a multiple of 256 (llama.cpp pads it): a context of 280 (512 > 300) runs the
long factors, though 280 itself is below 300; one of 64 (256) the short ones.

Parity as tests/test_gemma_glm.py: teacher-forced over llama.cpp's greedy continuation, top-1
agreement >= 99% where llama.cpp's top-2 margin is >= 0.1, perplexity within 0.5% of llama.cpp's;
each feature done wrong in lowbit moves the logits by whole units (the comparison can fail).
"""
import os

import numpy as np
import pytest

import lowbit
from llama_ref import compare_top1, llama_greedy, llama_perplexity, load_with
from lowbit.gguf import GGUFError
from lowbit.synth import synth_dense

PROMPT = b"Once upon a time, in a small village by the sea, the quick brown fox"
PHI3 = dict(arch="phi3", layers=4, dim=256, ffn=512, heads=4, kv_heads=2, head_dim=64, rope_dims=48, ctx=4096,
            orig_ctx=300, window=15, embd_type="F16", wtype="Q8_0", seed=3)
LONG, SHORT = 280, 64  # n_ctx: above and below the original context (after llama.cpp's padding)


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return synth_dense(tmp_path_factory.mktemp("phi3") / "phi3.gguf", **PHI3)


def _peer(path, n_ctx):
    from lowbit import peer
    return peer.Llama(str(path), n_ctx=n_ctx, logits_all=True, verbose=False, n_threads=1)


@pytest.fixture(scope="module")
def runs(path):
    """n_ctx -> llama.cpp's greedy continuation of PROMPT and its logits at that context."""
    out = {}
    for n_ctx, gen in ((LONG, 90), (SHORT, 40)):
        llm = _peer(path, n_ctx)
        out[n_ctx] = llama_greedy(llm, llm.tokenize(PROMPT, add_bos=False), gen)
    return out




def test_config(path):
    c = lowbit.load(path, n_ctx=SHORT).config
    assert c.arch == "phi3" and c.rope_neox and not c.qk_norm and not c.qkv_bias and not c.tied_output
    assert (c.n_head, c.n_kv, c.head_dim, c.rope_dims, c.ffn) == (4, 2, 64, 48, 512)
    assert c.window == (0,) * 4  # the file's sliding_window (15) ignored, as llama.cpp does
    want = np.float32(np.sqrt(1 + np.log(4096 / 300) / np.log(300)))
    assert c.yarn_attn_factor == float(want) and c.yarn_ext_factor == 0.0 and c.rope_scale == 1.0


@pytest.mark.parametrize("n_ctx", [LONG, SHORT])
def test_teacher_forced_top1_matches_llama_cpp(path, runs, n_ctx):
    m = lowbit.load(path, n_ctx=n_ctx, threads=2)
    ours, ref, counted, agree = compare_top1(m, runs[n_ctx])
    print(f"\nphi3 n_ctx {n_ctx}: top-1 {agree}/{counted}, max |logit diff| {np.abs(ours - ref).max():.4f}")
    assert counted >= 0.5 * len(ref) and agree >= 0.99 * counted


def test_perplexity_matches_llama_cpp(path):
    from lowbit.perplexity import perplexity
    text = open(os.path.join(os.path.dirname(lowbit.__file__), "data", "passage.txt"), encoding="utf-8").read()
    m = lowbit.load(path, n_ctx=LONG, threads=2)
    ours, n = perplexity(m, text, ctx=128, progress=False)
    theirs, count = llama_perplexity(_peer(path, LONG), text, 128)
    print(f"\nphi3 perplexity lowbit {ours:.4f} llama.cpp {theirs:.4f} ({n} tokens)")
    assert count == n and n >= 100 and abs(ours - theirs) <= 0.005 * theirs


def test_each_feature_matters(path, runs, monkeypatch):
    """The same file with one phi3 feature done wrong no longer matches llama.cpp: the attention
    factor left out, the file's sliding window honoured, the short factors at a long context, the
    fused [gate | up] halves swapped."""
    run = runs[LONG]
    wrong = {"attn_factor": load_with(monkeypatch, path, LONG, yarn_attn_factor=1.0),
             "window": load_with(monkeypatch, path, LONG, window=(15,) * 4)}
    m = lowbit.load(path, n_ctx=LONG, threads=2)
    m._vec("rope_freqs", -1, "rope_factors_short.weight")
    wrong["short factors"] = m
    m = lowbit.load(path, n_ctx=LONG, threads=2)
    for i in range(m.config.n_layer):
        up = f"blk.{i}.ffn_up.weight"
        m._mat("ffn_gate", i, up, rows=(m.config.ffn, 2 * m.config.ffn))
        m._mat("ffn_up", i, up, rows=(0, m.config.ffn))
    wrong["gate/up swapped"] = m
    for what, m in wrong.items():
        ours, ref, _, _ = compare_top1(m, run)
        assert float(np.abs(ours - ref).max()) > 0.5, what


def test_fused_rows_must_fit(path, monkeypatch):
    """A fused matrix too small for the heads the metadata gives is a clear error, not a crash."""
    with pytest.raises(GGUFError, match="attn_qkv.weight' has 512 rows"):
        load_with(monkeypatch, path, SHORT, n_kv=4)


def test_synth_cli_writes_phi3(tmp_path):
    from lowbit.cli import main
    out = tmp_path / "m.gguf"
    assert main(["synth", "dense", str(out), "--arch", "phi3", "--layers", "2", "--dim", "128", "--heads", "2",
                 "--kv-heads", "1", "--ffn", "256", "--ctx", "2048", "--orig-ctx", "512"]) == 0
    f = lowbit.gguf.open(str(out))
    assert f.tensors["blk.0.attn_qkv.weight"].shape == (256, 128) and "blk.0.attn_q.weight" not in f.tensors
    assert f.tensors["blk.1.ffn_up.weight"].shape == (512, 128) and "blk.1.ffn_gate.weight" not in f.tensors
    assert f.tensors["rope_factors_long.weight"].shape == (32,)
    assert f.metadata["phi3.rope.scaling.original_context_length"] == 512
    assert lowbit.load(str(out), n_ctx=16).forward([1, 2, 3]).shape == (1, 49152)
