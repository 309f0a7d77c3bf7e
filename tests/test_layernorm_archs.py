"""The LayerNorm families on small synthetic files, against llama.cpp: Command-R (llama.cpp's
command-r: Command R, Command R+, Aya 23 / Expanse), Cohere2 (cohere2: Command R7B, Command A),
StarCoder2 (starcoder2) and Phi-2 (phi2).

What they need beyond llama's graph, as configuration of the one forward pass (lowbit/model.py
_cohere_fields and _llama_variant_fields, csrc/engine.cpp):
  - every norm a LayerNorm (ggml_norm times the weight: Engine::layernorm), with
    attention.layer_norm_epsilon; starcoder2's and phi2's with biases;
  - one norm per layer, attention and the FFN both reading its output, the layer adding
    x + FFN + attention (EngineConfig::parallel_ffn);
  - the logits times logit_scale (EngineConfig::logit_mult; granite's divides);
  - "command-r-plus" (64 layers: llama.cpp reads attn_q_norm / attn_k_norm exactly then): per-head
    q / k LayerNorms, each head its own weight row;
  - cohere2: sliding windows of 24 positions on three of every four layers, which alone rotate
    (its global layers are NoPE);
  - starcoder2: q / k / v / output biases, an ungated GELU MLP with biases (ggml_gelu: GeGLU's
    epilogue times one);
  - phi2: starcoder2's MLP beside the attention on one norm's output (as command-r), a fused
    attn_qkv with its bias, q times 1/sqrt(head_dim) after a rope over 32 of its 80 dims, a logit bias.

Parity as tests/test_llama_variants.py: teacher-forced over llama.cpp's greedy continuation,
top-1 agreement >= 99% where llama.cpp's top-2 margin is >= 0.1, perplexity within 0.5% of
llama.cpp's; each feature done wrong in lowbit moves the logits by whole units.
"""

import numpy as np
import pytest

import lowbit
from llama_ref import family_fixtures, features_matter, peer_llama, perplexity_matches, top1_matches
from lowbit.gguf import GGUFError
from lowbit.synth import synth_dense

BASE = dict(layers=4, dim=256, ffn=512, heads=4, kv_heads=2, ctx=1024, embd_type="F16", wtype="Q8_0", seed=3)
FILES = {"command-r": dict(BASE, arch="command-r"),
         "command-r-plus": dict(BASE, arch="command-r", layers=64, dim=64, heads=2, kv_heads=1, ffn=128),
         "cohere2": dict(BASE, arch="cohere2", layers=8, window=24),
         "starcoder2": dict(BASE, arch="starcoder2"),
         "phi2": dict(BASE, arch="phi2", dim=320, heads=4, kv_heads=4, rope_dims=32)}
COHERE = ("command-r", "command-r-plus", "cohere2")
N_CTX = 640


paths, case = family_fixtures("layernorm", synth_dense, FILES, N_CTX)  # (name, path, llama.cpp's greedy run) per file


def test_config(case):
    name, path, _ = case
    c = lowbit.load(path, n_ctx=N_CTX).config
    assert c.layer_norm and c.parallel_ffn == (name != "starcoder2") and c.rope_neox == (name not in COHERE)
    if name not in COHERE:  # (starcoder2, phi2)
        assert c.ffn_ungated and c.ffn_act == "gelu" and c.qkv_bias and c.attn_out_bias
        assert c.rope_dims == (32 if name == "phi2" else 64) and not c.tied_output
        assert c.attn_scale == (float(np.float32(1 / np.sqrt(np.float32(80)))) if name == "phi2" else 0.0)
        return
    assert c.tied_output and c.logit_mult == float(np.float32(1 / np.sqrt(FILES[name]["dim"])))
    assert c.qk_norm == (name == "command-r-plus")
    if name == "cohere2":
        assert c.window == (24, 24, 24, 0) * 2 and c.rope_layers == (True, True, True, False) * 2
    else:
        assert c.window == (0,) * c.n_layer and c.rope_layers == ()


def test_teacher_forced_top1_matches_llama_cpp(case):
    top1_matches(case, N_CTX)


def test_perplexity_matches_llama_cpp(case):
    name, path, _ = case
    perplexity_matches(path, N_CTX, peer_llama(path, N_CTX), name)


def test_each_feature_matters(case, monkeypatch):
    """The same file with a feature done wrong no longer matches llama.cpp: no logit scale; RMSNorm
    in place of the LayerNorms; Command R+ without its per-head q / k norms; cohere2 rotating
    its global layers, or without windows; starcoder2 without its q/k/v biases or with a SiLU MLP;
    phi2 rotating the whole head, or without its q/k/v bias."""
    name, path, run = case
    wrong = {"no logit scale": dict(logit_mult=0.0)} if name in COHERE else {}
    if name == "starcoder2":  # (the biases of the norms and the MLP: their binding is the arch's)
        wrong.update({"no q/k/v bias": dict(qkv_bias=False), "SiLU MLP": dict(ffn_act="silu")})
    elif name == "phi2":
        wrong.update({"rope over the whole head": dict(rope_dims=80), "no q/k/v bias": dict(qkv_bias=False)})
    elif name == "command-r-plus":
        wrong["no q/k norms"] = dict(qk_norm=False)
    else:  # (Command R+'s per-head norm weights are a LayerNorm's only)
        wrong["RMSNorm"] = dict(layer_norm=False)
    if name == "cohere2":
        wrong.update({"rope on the global layers": dict(rope_layers=()), "no windows": dict(window=(0,) * 8)})
    features_matter(monkeypatch, path, N_CTX, run, wrong)


def test_keys_llama_cpp_requires(tmp_path):
    """cohere2's logit_scale and sliding_window are required (as llama.cpp's loader has them); a
    command-r file whose q / k norms do not go with its layer count (llama.cpp reads them for 64
    layers or more) or a logit scale that is not a number: one-line errors."""
    from lowbit.model import ModelConfig
    f = lowbit.gguf.open(synth_dense(tmp_path / "c2.gguf", **dict(FILES["cohere2"], layers=4)))
    for k in ("cohere2.logit_scale", "cohere2.attention.sliding_window"):
        v = f.metadata.pop(k)
        with pytest.raises(GGUFError, match=f"{k} is missing"):
            ModelConfig.from_gguf(f)
        f.metadata[k] = v
    f = lowbit.gguf.open(synth_dense(tmp_path / "cr.gguf", **dict(FILES["command-r"], layers=2)))
    f.metadata["command-r.logit_scale"] = "big"
    with pytest.raises(GGUFError, match="logit_scale = 'big' is not a number"):
        ModelConfig.from_gguf(f)
    f.metadata["command-r.logit_scale"] = 0.0625
    f.tensors["blk.0.attn_q_norm.weight"] = f.tensors["blk.0.attn_norm.weight"]
    with pytest.raises(GGUFError, match="2 layers has attn_q_norm"):
        ModelConfig.from_gguf(f)
