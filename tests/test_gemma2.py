"""Gemma 2 (gemma2) on a small synthetic file (tests/gemma_glm_models.py GEMMA2), against llama.cpp.

gemma2 (lowbit.synth.synth_dense(arch="gemma2")): 4 layers, width 256, 4 query heads of 128 over 2
KV heads, GeGLU, no q/k norms, the post-attention and post-FFN norms, embeddings times sqrt(256),
layers 0 and 2 sliding over 8 positions (llama.cpp's pattern 2), q times 1/sqrt(key_length), every
attention score soft-capped at 1.5 (cap * tanh(s / cap): small enough that it changes the softmax
here) and the final logits at 4, the head tied to token_embd.

The level-dependent part (top-1 agreement and chunk / thread invariance under each level's attention
kernels) is in tests/test_gemma_glm_levels.py; the soft-cap of every attention kernel at every level
in tests/test_attn.py and tests/test_kv_quant.py. This file: configuration, perplexity, each
feature's effect, a q8_0 cache against llama.cpp's flash attention, synth and bad input.
"""
import numpy as np
import pytest

import lowbit
from gemma_glm_models import compare, gemma2_greedy, gemma2_llm, gemma2_path  # noqa: F401 (fixtures)
from llama_ref import llama_greedy, load_with, perplexity_matches
from lowbit.synth import synth_dense

# one feature done wrong each (the comparison can fail)
GEMMA2_OFF = {
    "attention soft-cap": dict(attn_softcap=0.0),
    "final soft-cap": dict(logit_softcap=0.0),
    "sliding windows": dict(window=(0, 0, 0, 0)),
    "attention scale (the 27B's 1/sqrt(width / heads))": dict(attn_scale=float(1 / np.sqrt(np.float32(64)))),
    "post-norms": dict(post_norms=False),
    "embedding scale": dict(embd_scale=0.0),
}


def test_gemma2_config(gemma2_path):
    c = lowbit.load(gemma2_path, n_ctx=64).config
    assert c.arch == "gemma2" and c.rope_neox and not c.qk_norm and c.tied_output and c.post_norms
    assert c.ffn_act == "gelu" and c.head_dim == 128 and c.window == (8, 0, 8, 0)
    assert c.embd_scale == float(np.sqrt(np.float32(256)))
    assert c.attn_scale == float(np.float32(1) / np.sqrt(np.float32(128)))  # key_length, not 256 / 4
    assert c.attn_softcap == 1.5 and c.logit_softcap == 4.0
    assert c.rope_base_swa == 0.0  # the sliding layers rotate with the global base (no freq_base_swa key)


def test_gemma2_defaults_as_llama_cpp(tmp_path):
    """Without the keys, llama.cpp's defaults: window 4096, attention cap 50, final cap 30; the
    46-layer 27B scales q by 1/sqrt(n_embd / n_head)."""
    path = synth_dense(tmp_path / "g.gguf", arch="gemma2", layers=2, dim=64, heads=2, kv_heads=1, head_dim=64,
                       ffn=64, window=0)
    f = lowbit.gguf.open(path)
    for k in ("gemma2.attn_logit_softcapping", "gemma2.final_logit_softcapping"):
        del f.metadata[k]
    from lowbit.model import ModelConfig
    c = ModelConfig.from_gguf(f)
    assert c.window == (4096, 0) and c.attn_softcap == 50.0 and c.logit_softcap == 30.0
    f.metadata["gemma2.block_count"] = 46
    assert ModelConfig._gemma3_fields(f, "gemma2", 46, 4608, 32, 128)["attn_scale"] == \
        float(np.float32(1) / np.sqrt(np.float32(144)))


def test_perplexity_matches_llama_cpp(gemma2_path, gemma2_llm):
    perplexity_matches(gemma2_path, 128, gemma2_llm, "gemma2")


def test_each_feature_matters(gemma2_path, gemma2_greedy, monkeypatch):
    """lowbit matches llama.cpp (max |logit diff| < 0.5 where it judges), and each feature done wrong
    moves the logits by more than 0.5."""
    m = lowbit.load(gemma2_path, n_ctx=128, threads=2)
    ids, ours, ref, tie, counted, agree = compare(m, gemma2_greedy)
    assert float(np.abs(ours - ref).max()) < 0.5
    for what, change in GEMMA2_OFF.items():
        m = load_with(monkeypatch, gemma2_path, 128, **change)
        diff = float(np.abs(compare(m, gemma2_greedy)[1] - ref).max())
        assert diff > 0.5, f"{what} wrong: max |logit diff| only {diff:.3f}"


@pytest.mark.parametrize("kv", ["q8_0"])
def test_quantized_cache_matches_llama_cpp_flash_attention(gemma2_path, kv):
    """A q8_0 cache: llama.cpp's flash attention folds 1 / cap into its score scale and caps there
    (ggml's flash_attn_ext logit_softcap); lowbit's quantized-cache kernels cap the same scores.
    Top-1 >= 95% at margins >= 0.1 (test_kv_quant's bound for a q8_0 cache)."""
    from test_kv_quant import peer_llm
    from test_gpt_oss import PROMPT
    llm = peer_llm(gemma2_path, kv, n_ctx=128, n_threads=1)
    ids, ref = llama_greedy(llm, llm.tokenize(PROMPT, add_bos=False), 40)
    m = lowbit.load(gemma2_path, n_ctx=128, threads=2, kv=kv)
    m.reset()
    ours = m.forward(ids, all_logits=True)
    top2 = np.sort(ref, 1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] >= 0.1
    agree = int((ours.argmax(1) == ref.argmax(1))[clear].sum())
    print(f"\ngemma2 {kv}: top-1 {agree}/{int(clear.sum())}, max |logit diff| {np.abs(ours - ref).max():.3f}")
    assert clear.sum() >= 15 and agree >= 0.95 * clear.sum()
    assert float(np.abs(ours - ref).max()) < 0.5


def test_synth_cli_writes_gemma2(tmp_path):
    from lowbit.cli import main
    out = tmp_path / "g.gguf"
    assert main(["synth", "dense", str(out), "--arch", "gemma2", "--layers", "3", "--dim", "128", "--heads", "2",
                 "--kv-heads", "1", "--head-dim", "64", "--ffn", "256", "--window", "4"]) == 0
    f = lowbit.gguf.open(str(out))
    assert f.metadata["general.architecture"] == "gemma2" and "output.weight" not in f.tensors
    assert f.metadata["gemma2.attn_logit_softcapping"] == 50.0 and f.metadata["gemma2.final_logit_softcapping"] == 30.0
    assert "blk.0.attn_q_norm.weight" not in f.tensors and "blk.2.post_ffw_norm.weight" in f.tensors
    m = lowbit.load(str(out), n_ctx=32)
    c = m.config
    assert c.window == (4, 0, 4) and c.attn_softcap == 50.0 and c.logit_softcap == 30.0
    assert m.forward([1, 2, 3]).shape == (1, c.vocab)
    assert main(["synth", "dense", str(tmp_path / "bad.gguf"), "--arch", "gemma2", "--attn-softcap", "0"]) == 2
    assert main(["synth", "dense", str(out), "--shape", "gemma-2-27b", "--layers", "1", "--dim", "256", "--ffn", "64",
                 "--heads", "4", "--kv-heads", "2"]) == 0
    c = lowbit.load(str(out), n_ctx=32).config
    assert (c.arch, c.head_dim, c.window, c.attn_softcap, c.logit_softcap) == ("gemma2", 128, (4096,), 50.0, 30.0)


def test_info_names_the_soft_caps(gemma2_path, capsys):
    from lowbit.cli import main
    assert main(["info", "-m", str(gemma2_path)]) == 0
    assert "softcap   attention scores at 1.5, final logits at 4 (cap * tanh(x / cap))" in capsys.readouterr().out


def test_bad_metadata_names_the_key(tmp_path):
    """A bad value raises GGUFError naming the key (the CLI prints it as one line); gemma2 always
    caps, so a cap of 0 is refused (llama.cpp would divide by it)."""
    from lowbit.gguf import GGUFError
    from lowbit.model import ModelConfig
    path = synth_dense(tmp_path / "g.gguf", arch="gemma2", layers=2, dim=64, heads=2, kv_heads=1, ffn=64)
    for key, val, msg in (("gemma2.attn_logit_softcapping", 0.0, "attn_logit_softcapping = 0.0"),
                          ("gemma2.attn_logit_softcapping", "x", "attn_logit_softcapping"),
                          ("gemma2.final_logit_softcapping", -1.0, "final_logit_softcapping"),
                          ("gemma2.rope.freq_base_swa", 0.0, "freq_base_swa")):
        f = lowbit.gguf.open(path)
        f.metadata[key] = val
        with pytest.raises(GGUFError, match=msg):
            ModelConfig.from_gguf(f)
