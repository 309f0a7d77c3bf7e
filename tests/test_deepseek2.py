"""DeepSeek V2/V3 (llama.cpp's deepseek2: multi-head latent attention, csrc/mla.cpp) on small
synthetic files (tests/deepseek2_models.py), against llama.cpp: configuration, perplexity, each
feature's effect, the compressed cache's bytes and the server's prefix cache over it, synth and bad
input. The level-dependent part (the MLA kernel at every level, top-1 agreement, chunk / thread /
rewind invariance) is tests/test_deepseek2_levels.py, which CI repeats under each LOWBIT_MAX_ISA cap.

Parity as tests/test_gemma_glm*.py: teacher-forced over llama.cpp's own greedy continuation,
top-1 >= 99% where llama.cpp's top-2 margin is >= 0.1 (leaving out lowbit's routing near-ties),
perplexity within 0.5%; each feature switched off or wrong in lowbit moves the logits by whole units
(the comparison can fail).
"""
import os

import numpy as np
import pytest

import lowbit
from deepseek2_models import BASE, MODELS, ds, load  # noqa: F401 (fixture)
from gemma_glm_models import compare
from llama_ref import llama_perplexity, load_with
from lowbit.synth import synth_deepseek2


# ---- configuration ---------------------------------------------------------------------------

def test_config(ds):
    c = load(ds("v2")[0]).config
    assert c.arch == "deepseek2" and not c.rope_neox and c.n_kv == 1
    assert (c.head_dim, c.rope_dims, c.mla_rank, c.mla_v_dim, c.q_lora_rank) == (48, 16, 64, 32, 0)
    assert (c.n_expert, c.n_expert_used, c.expert_ffn, c.shexp_ffn, c.ffn, c.n_dense_lead) == (8, 2, 256, 512, 512, 1)
    assert c.expert_gating == "softmax" and not c.shexp_gated and not c.expert_norm and not c.exp_probs_b
    # YaRN: llama.cpp's attn_factor 1 / (1 + 0.1 ln 40) (the log multiplier's mscale ratio is 1),
    # kq_scale = mscale^2 / sqrt(48) with mscale = (1 + 0.1 * 0.707 ln 40)
    f32 = np.float32
    assert c.yarn_ext_factor == 1.0 and c.yarn_orig_ctx == 4096 and c.rope_scale == 1 / 40
    assert abs(c.yarn_attn_factor - 1 / (1 + 0.1 * np.log(40))) < 1e-6
    assert abs(c.mla_kq_scale - (1 + 0.0707 * np.log(40)) ** 2 / np.sqrt(48)) < 1e-5
    f = lowbit.gguf.open(ds("v2")[0])  # MTP (nextn) blocks after the trunk: counted in block_count, not run
    f.metadata["deepseek2.nextn_predict_layers"] = 1
    from lowbit.model import ModelConfig
    assert (ModelConfig.from_gguf(f).n_layer, ModelConfig.from_gguf(f).n_nextn) == (2, 1)
    c3 = load(ds("v3")[0]).config
    assert c3.q_lora_rank == 64 and c3.expert_gating == "sigmoid" and c3.exp_probs_b and c3.expert_norm
    assert (c3.expert_scale, c3.expert_groups, c3.expert_groups_used) == (2.5, 4, 2)


# ---- parity with llama.cpp -------------------------------------------------------------------

@pytest.mark.parametrize("which", list(MODELS))
def test_perplexity_matches_llama_cpp(which, ds):
    from lowbit.perplexity import perplexity
    path, llm, run = ds(which)
    m = load(path)
    text = open(os.path.join(os.path.dirname(lowbit.__file__), "data", "passage.txt"), encoding="utf-8").read()
    ours, n = perplexity(m, text, ctx=128, progress=False)
    theirs, count = llama_perplexity(llm, text, 128)
    assert count == n and n >= 100
    print(f"\ndeepseek2 {which} perplexity lowbit {ours:.4f} llama.cpp {theirs:.4f} ({n} tokens)")
    assert abs(ours - theirs) <= 0.005 * theirs



OFF = {"v2": {"kq_scale_plain": dict(mla_kq_scale=float(1 / np.sqrt(np.float32(48)))),
              "no_yarn": dict(yarn_ext_factor=0.0, yarn_attn_factor=1.0, rope_scale=1.0),
              "neox_rope": dict(rope_neox=True), "norm": dict(expert_norm=True)},
       "v3": {"no_groups": dict(expert_groups=0, expert_groups_used=0), "softmax": dict(expert_gating="softmax"),
              "no_bias": dict(exp_probs_b=False), "no_norm": dict(expert_norm=False),
              "scale_1": dict(expert_scale=1.0)}}


@pytest.mark.parametrize("which", list(MODELS))
def test_each_feature_matters(which, ds, monkeypatch):
    path, llm, run = ds(which)
    for what, change in OFF[which].items():
        m = load_with(monkeypatch, path, 128, **change)
        ids, ours, ref, tie, counted, agree = compare(m, run)
        diff = float(np.abs(ours - ref).max())
        assert diff > 0.5, f"{which}: {what}: max |logit diff| only {diff:.3f}"


# ---- the compressed cache --------------------------------------------------------------------

def test_cache_is_compressed(ds):
    """Per position and layer the cache holds kv_lora_rank + rope halves (64 + 16 = 80), not the
    expanded n_head * (key + value) = 4 * (48 + 32) = 320: kv_bytes says so, 1/4 here (V2's sizes:
    576 vs 16 * (192 + 128) = 5120, 1/8.9)."""
    m = load(ds("v2")[0], n_ctx=64)
    c = m.config
    per_pos = m.engine.kv_bytes(1)
    assert per_pos == c.n_layer * (c.mla_rank + c.rope_dims) * 2
    expanded = c.n_layer * c.n_head * (c.head_dim + c.mla_v_dim) * 2
    assert per_pos * 4 <= expanded


def test_prefix_cache_restores_latent_rows(ds):
    """The server's prefix cache (Engine.kv_copy of the latent rows): a prompt's blocks stored from
    one slot and loaded into another give the continuation bitwise the logits of computing the whole
    prompt; a block costs the compressed bytes."""
    from lowbit.server.prefix import PrefixCache
    m = load(ds("v2")[0], n_ctx=96, n_slots=2)
    c = m.config
    ids = m.tokenize("The quick brown fox jumps over the lazy dog and runs far away into the deep dark "
                     "forest where the old trees stand tall and the river sings of the mountains far "
                     "beyond the sea, and the children of the village listen to it every night")[:40]
    assert len(ids) == 40
    want = m.forward_batch([(0, ids)], all_logits=True)[0]
    cache = PrefixCache(m, 1 << 20, block=8)
    assert cache.block_bytes == c.n_layer * 8 * (c.mla_rank + c.rope_dims) * 2
    assert cache.store(0) == 5
    assert cache.load(ids, 1) == 32
    got = m.forward_batch([(1, ids[32:])], all_logits=True)[0]
    assert np.array_equal(got, want[32:])


# ---- synth and bad input ---------------------------------------------------------------------

def test_synth_cli_writes_deepseek2(tmp_path):
    from lowbit.cli import main
    out = tmp_path / "d.gguf"
    assert main(["synth", "moe", str(out), "--arch", "deepseek2", "--layers", "2", "--dim", "128", "--heads", "2",
                 "--experts", "4", "--top-k", "2", "--ffn", "64", "--dense-ffn", "256", "--kv-lora-rank", "32",
                 "--q-lora-rank", "32", "--qk-nope", "32", "--rope-dims", "8", "--v-head-dim", "16",
                 "--expert-type", "Q8_0", "--gating", "sigmoid"]) == 0
    f = lowbit.gguf.open(str(out))
    md = f.metadata
    assert md["general.architecture"] == "deepseek2" and md["deepseek2.attention.key_length"] == 40
    assert md["deepseek2.attention.key_length_mla"] == 40 and md["deepseek2.attention.value_length_mla"] == 16
    assert f.tensors["blk.0.attn_k_b.weight"].shape == (2, 32, 32)
    assert f.tensors["blk.0.attn_v_b.weight"].shape == (2, 16, 32) and "blk.1.exp_probs_b.bias" in f.tensors
    m = lowbit.load(str(out), n_ctx=32)
    c = m.config
    assert (c.n_layer, c.n_dense_lead, c.q_lora_rank, c.mla_rank, c.expert_gating) == (2, 1, 32, 32, "sigmoid")
    assert m.forward([1, 2, 3]).shape == (1, c.vocab)


def test_bad_input_is_refused(tmp_path, capsys):
    """A legacy deepseek2 file (attn_kv_b, no MLA keys) and bad sizes: GGUFError naming the problem;
    the CLI: one line, exit 2."""
    from lowbit.cli import main
    from lowbit.gguf import GGUFError
    from lowbit.model import ModelConfig
    path = synth_deepseek2(tmp_path / "d.gguf", **dict(BASE, layers=2, experts=4, expert_type="Q8_0"))
    f = lowbit.gguf.open(path)
    del f.metadata["deepseek2.attention.key_length_mla"]
    with pytest.raises(GGUFError, match="MLA split"):
        ModelConfig.from_gguf(f)
    f = lowbit.gguf.open(path)
    f.metadata["deepseek2.rope.dimension_count"] = 48
    with pytest.raises(GGUFError, match="rope.dimension_count"):
        ModelConfig.from_gguf(f)
    with pytest.raises(ValueError, match="kv_lora_rank"):
        synth_deepseek2(tmp_path / "x.gguf", kv_lora_rank=60)
    assert main(["synth", "moe", str(tmp_path / "y.gguf"), "--arch", "deepseek2", "--rope-dims", "12"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "rope_dims" in err and "Traceback" not in err


def test_mla_needs_a_half_cache():
    """MLA's latent cache is half only: a float32 cache (kv_f16 False) is refused with a clear
    error rather than run by an untested path."""
    from lowbit._native import lib
    args = (2, 64, 4, 1, 48, 128, 100, 32, 1e-6, 10000.0, 1.0, 16, False)
    with pytest.raises(ValueError, match="half only"):
        lib.Engine(*args, False, 1, mla_rank=32, mla_v_dim=16, mla_kq_scale=0.1)
    with pytest.raises(ValueError, match="f16 only"):
        lib.Engine(*args, True, 1, mla_rank=32, mla_v_dim=16, mla_kq_scale=0.1, kv_k=8, kv_v=8)
