"""Gemma 3 (gemma3) and GLM-4.5 (glm4moe) on small synthetic files (tests/gemma_glm_models.py),
against llama.cpp.

gemma3 (lowbit.synth.synth_dense(arch="gemma3")): 6 layers, width 256, 4 query heads of 128 over
2 KV heads (so q is wider than the model: key_length, not width / heads), GeGLU, q/k norms, the
post-attention and post-FFN norms, embeddings times sqrt(256), layers 0-4 sliding over 8 positions
with rope base 10000 and layer 5 global with base 1e6 and linear scaling 8 (llama.cpp's default
pattern 6; the scaling of the global layers only, as Gemma 3 4B-27B), the head tied
to token_embd and a final logit soft-cap of 4 (to make it count).

glm4moe (lowbit.synth.synth_moe(arch="glm4moe")): 4 layers run (layer 0 dense, 1-3 routed), then one
MTP layer that llama.cpp loads and does not run; 16 experts, top-4 by sigmoid + exp_probs_b, the
weights renormalised and times 2.5, one shared expert, q/k/v biases, rope over 32 of 64 dims.

The level-dependent part (GeGLU at every level, chunk-invariance, top-1 agreement) is in
tests/test_gemma_glm_levels.py; this file: configuration, perplexity, each feature's effect, synth
and bad input. Parity as tests/test_gpt_oss.py: teacher-forced over llama.cpp's own greedy continuation, top-1
agreement >= 99% where llama.cpp's top-2 margin is >= 0.1 (glm4moe: leaving out positions whose
routing is a near-tie in lowbit's router), perplexity within 0.5% of llama.cpp's; each feature
switched off in lowbit moves the logits by whole units (the comparison can fail).
"""
import os

import numpy as np
import pytest

import lowbit
from llama_ref import llama_perplexity, load_with
from gemma_glm_models import (GLM, compare, family, gemma_greedy, gemma_llm, gemma_path,  # noqa: F401 (fixtures)
                              glm_greedy, glm_llm, glm_path)
from lowbit.synth import synth_dense, synth_moe


# ---- configuration ---------------------------------------------------------------------------

def test_gemma3_config(gemma_path):
    c = lowbit.load(gemma_path, n_ctx=64).config
    assert c.arch == "gemma3" and c.rope_neox and c.qk_norm and c.tied_output and c.post_norms
    assert c.ffn_act == "gelu" and c.head_dim == 128 and c.window == (8, 8, 8, 8, 8, 0)
    assert c.embd_scale == float(np.sqrt(np.float32(256)))
    assert c.attn_scale == float(np.float32(1) / np.sqrt(np.float32(128)))  # key_length, not 256 / 4
    assert c.rope_base == 1e6 and c.rope_base_swa == 10000.0 and c.logit_softcap == 4.0
    assert c.rope_scale == 1 / 8  # linear scaling: the global layer only (the sliding ones: scale 1)


def test_glm4moe_config(glm_path):
    c = lowbit.load(glm_path, n_ctx=64).config
    assert c.arch == "glm4moe" and c.n_layer == 4 and c.n_nextn == 1  # block_count 5: the MTP layer not run
    assert (c.n_expert, c.n_expert_used, c.expert_ffn, c.shexp_ffn, c.ffn) == (16, 4, 256, 256, 512)
    assert c.n_dense_lead == 1 and c.expert_gating == "sigmoid" and c.exp_probs_b and c.expert_norm
    assert c.expert_scale == 2.5 and not c.shexp_gated and c.qkv_bias and not c.qk_norm
    assert c.rope_dims == 32 and c.head_dim == 64 and c.ffn_norm == "post_attention_norm"


# ---- parity with llama.cpp -------------------------------------------------------------------

@pytest.mark.parametrize("which", ["gemma3", "glm4moe"])
def test_perplexity_matches_llama_cpp(which, request):
    """llama.cpp's method (the second half of each 128-token chunk scored), lowbit.perplexity's
    code for lowbit, the same arithmetic on llama.cpp's logits."""
    from lowbit.perplexity import perplexity
    path, llm, run = family(which, request)
    m = lowbit.load(path, n_ctx=128, threads=2)
    text = open(os.path.join(os.path.dirname(lowbit.__file__), "data", "passage.txt"), encoding="utf-8").read()
    ctx = 128
    ours, n = perplexity(m, text, ctx=ctx, progress=False)
    theirs, count = llama_perplexity(llm, text, ctx)
    assert count == n and n >= 100
    print(f"\n{which} perplexity lowbit {ours:.4f} llama.cpp {theirs:.4f} ({n} tokens)")
    assert abs(ours - theirs) <= 0.005 * theirs



GEMMA_OFF = {"embd_scale": dict(embd_scale=0.0), "attn_scale": dict(attn_scale=float(1 / np.sqrt(np.float32(64)))),
             "rope_base_swa": dict(rope_base_swa=0.0), "softcap": dict(logit_softcap=0.0),
             "window": dict(window=(0,) * 6), "silu": dict(ffn_act="silu"), "rope_linear": dict(rope_scale=1.0)}
GLM_OFF = {"exp_probs_b": dict(exp_probs_b=False), "softmax": dict(expert_gating="softmax"),
           "no_norm": dict(expert_norm=False), "full_rope": dict(rope_dims=64),
           "qkv_bias": dict(qkv_bias=False)}


@pytest.mark.parametrize("which", ["gemma3", "glm4moe"])
def test_each_feature_matters(which, request, monkeypatch):
    """The comparison can fail: the same file with one feature switched off or wrong in lowbit no
    longer matches llama.cpp (attn_scale: 1/sqrt(width / heads), the 27B's rule, instead of
    1/sqrt(key_length); each post norm: all-ones weights instead of the file's)."""
    path, llm, run = family(which, request)
    for what, change in (GEMMA_OFF if which == "gemma3" else GLM_OFF).items():
        m = load_with(monkeypatch, path, 128, **change)
        ids, ours, ref, tie, counted, agree = compare(m, run)
        diff = float(np.abs(ours - ref)[~tie].max())
        assert diff > 0.5, f"{which}: {what} off: max |logit diff| only {diff:.3f}"
    if which == "gemma3":  # each post norm's weights: all ones instead of the file's
        ones = np.ones(256, np.float32)
        for norm in ("attn_post_norm", "ffn_post_norm"):
            m = lowbit.load(path, n_ctx=128, threads=2)
            for i in range(m.config.n_layer):
                m.engine.set_vec(norm, i, ones)
            ids, ours, ref, tie, counted, agree = compare(m, run)
            assert float(np.abs(ours - ref).max()) > 0.5, norm


# ---- synth and bad input ---------------------------------------------------------------------

def test_glm4moe_softmax_gating_with_bias(tmp_path, monkeypatch):
    """expert_gating_func 1 (softmax) with exp_probs_b: llama.cpp still adds the bias for choosing
    (build_moe_ffn), and so does lowbit; q/k norms on (GLM-4.5 355B's). Top-1 against llama.cpp."""
    from gemma_glm_models import peer
    from llama_ref import llama_greedy
    path = synth_moe(tmp_path / "glm-softmax.gguf", **dict(GLM, layers=2, gating="softmax", qk_norm=True, seed=11))
    m = lowbit.load(path, n_ctx=128, threads=2)
    assert m.config.expert_gating == "softmax" and m.config.exp_probs_b and m.config.qk_norm
    llm = peer(path)
    run = llama_greedy(llm, llm.tokenize(b"The quick brown fox jumps over the lazy dog", add_bos=False), 30)
    ids, ours, ref, tie, counted, agree = compare(m, run)
    assert counted >= 15 and agree >= 0.99 * counted, (agree, counted)
    m2 = load_with(monkeypatch, path, 128, exp_probs_b=False)  # the bias matters
    assert float(np.abs(compare(m2, run)[1] - ref)[~tie].max()) > 0.5
    del llm


def test_synth_cli_writes_gemma3(tmp_path):
    from lowbit.cli import main
    out = tmp_path / "g.gguf"
    assert main(["synth", "dense", str(out), "--arch", "gemma3", "--layers", "3", "--dim", "128", "--heads", "2",
                 "--kv-heads", "1", "--head-dim", "64", "--ffn", "256", "--window", "4", "--swa-pattern", "3",
                 "--rope-base-swa", "5000", "--softcap", "30"]) == 0
    f = lowbit.gguf.open(str(out))
    assert f.metadata["general.architecture"] == "gemma3" and "output.weight" not in f.tensors
    assert f.tensors["blk.2.post_ffw_norm.weight"].shape == (128,)
    m = lowbit.load(str(out), n_ctx=32)
    c = m.config
    assert c.window == (4, 4, 0) and c.rope_base_swa == 5000.0 and c.logit_softcap == 30.0
    assert m.forward([1, 2, 3]).shape == (1, c.vocab)


def test_synth_cli_writes_glm4moe(tmp_path):
    from lowbit.cli import main
    out = tmp_path / "m.gguf"
    assert main(["synth", "moe", str(out), "--arch", "glm4moe", "--layers", "3", "--dim", "128", "--heads", "2",
                 "--kv-heads", "1", "--head-dim", "64", "--experts", "4", "--top-k", "2", "--ffn", "64",
                 "--dense-ffn", "256", "--leading-dense", "2", "--nextn", "1", "--rope-dims", "16",
                 "--qk-norm", "--expert-type", "Q8_0"]) == 0
    f = lowbit.gguf.open(str(out))
    assert f.metadata["glm4moe.block_count"] == 4 and "blk.3.nextn.eh_proj.weight" in f.tensors
    assert f.tensors["blk.1.ffn_gate.weight"].shape == (256, 128) and "blk.2.exp_probs_b.bias" in f.tensors
    m = lowbit.load(str(out), n_ctx=32)
    c = m.config
    assert (c.n_layer, c.n_dense_lead, c.rope_dims, c.qk_norm) == (3, 2, 16, True)
    assert m.forward([1, 2, 3]).shape == (1, c.vocab)


def test_synth_takes_llama_quants_fallback_where_blocks_do_not_divide(tmp_path):
    """GLM-4.5's dense FFN of 10944 is no multiple of Q4_K's 256: its down matrix (rows of 10944)
    is written as Q5_0, as llama-quantize would, and Q4_K stays where 256 divides the rows."""
    from lowbit.cli import main
    out = tmp_path / "m.gguf"
    assert main(["synth", "moe", str(out), "--arch", "glm4moe", "--layers", "2", "--dim", "256", "--heads", "2",
                 "--kv-heads", "1", "--head-dim", "128", "--experts", "4", "--top-k", "2", "--ffn", "64",
                 "--dense-ffn", "320", "--leading-dense", "1", "--nextn", "0", "--type", "Q4_K",
                 "--expert-type", "Q8_0"]) == 0
    t = lowbit.gguf.open(str(out)).tensors
    assert t["blk.0.ffn_down.weight"].format.name == "Q5_0" and t["blk.0.ffn_up.weight"].format.name == "Q4_K"
    assert lowbit.load(str(out), n_ctx=16).forward([1, 2]).shape[0] == 1


def test_bad_metadata_names_the_key(tmp_path):
    """A bad value raises GGUFError naming the key (the CLI prints it as one line)."""
    from lowbit.gguf import GGUFError
    from lowbit.model import ModelConfig
    glm = synth_moe(tmp_path / "glm.gguf", arch="glm4moe", layers=2, dim=64, heads=2, kv_heads=1, experts=4,
                    top_k=2, expert_ffn=32, dense_ffn=64, nextn=0, expert_type="Q8_0")
    gem = synth_dense(tmp_path / "gem.gguf", arch="gemma3", layers=2, dim=64, heads=2, kv_heads=1, ffn=64)
    for path, key, val, msg in ((glm, "glm4moe.leading_dense_block_count", 5, "leading_dense_block_count = 5"),
                                (glm, "glm4moe.expert_gating_func", 3, "expert_gating_func = 3"),
                                (glm, "glm4moe.nextn_predict_layers", 2, "nextn_predict_layers = 2"),
                                (glm, "glm4moe.expert_shared_count", None, "expert_shared_count is missing"),
                                (gem, "gemma3.rope.freq_base_swa", -1.0, "freq_base_swa"),
                                (gem, "gemma3.final_logit_softcapping", "x", "final_logit_softcapping")):
        f = lowbit.gguf.open(path)
        if val is None:
            del f.metadata[key]
        else:
            f.metadata[key] = val
        with pytest.raises(GGUFError, match=msg):
            ModelConfig.from_gguf(f)
