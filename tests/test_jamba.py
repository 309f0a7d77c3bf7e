"""Jamba (llama.cpp's jamba: Jamba v0.1 / 1.5 / 1.7, Jamba Reasoning) on small synthetic files, against
llama.cpp.

A layer is attn_norm and a mixer, then ffn_norm and an FFN, each added to the residual. The mixer is
attention without rope where attention.head_count_kv (one count per layer) is non-zero, else a
Mamba-1 mixer (csrc/mamba1.cpp) whose dt, B and C are RMS-normed with weights (ssm_dt_norm,
ssm_b_norm, ssm_c_norm); the FFN is the experts (softmax routing, top-K not renormalised) where the
layer has ffn_gate_inp, else a dense SwiGLU (EngineConfig::moe_layers). The slot state: the Mamba
layers' conv and SSM states, the attention layers' KV.

Files: "jamba" (4 layers: Mamba, Mamba, attention, Mamba; experts on layers 1 and 3, 8 of them, top
2) and "jamba-dense" (8 layers, attention at 4 as Jamba's 1 in 8; no experts). Parity as
tests/test_mamba1.py; MoE positions judged away from routing near-ties below 1e-2 (as g4-moe,
LFM2 MoE, Nemotron-H MoE).
"""
import pytest

import lowbit
from llama_ref import (family_fixtures, features_matter, hybrid_chunks_threads_batches_bitwise, load_edited,
                       peer_llama, perplexity_matches, rewinds_restore_the_state_exactly, states_matter, top1_matches)
from lowbit.gguf import GGUFError
from lowbit.synth import synth_jamba

FILES = {"jamba": dict(embd_type="F16", expert_type="Q4_0", seed=3),
         "jamba-dense": dict(layers=8, attn_period=8, attn_offset=4, experts=0, ssm_state=8, embd_type="F16", seed=4)}
N_CTX = 640
TIE = 1e-2
paths, case = family_fixtures("jamba", synth_jamba, FILES, N_CTX)  # (name, path, llama.cpp's greedy run) per file


def test_config(case):
    name, path, _ = case
    m = lowbit.load(path, n_ctx=N_CTX)
    c = m.config
    assert c.arch == "jamba" and c.mamba1 and not c.ssm_dt_b_c_rms and (c.ssm_inner, c.ssm_dt_rank) == (512, 16)
    if name == "jamba":
        assert c.recurrent == (True, True, False, True) and c.attention_layers == [2]
        assert (c.n_expert, c.n_expert_used, c.expert_ffn, c.expert_norm) == (8, 2, 512, False)
        assert c.moe_layers == (False, True, False, True) and [c.moe_at(i) for i in range(4)] == [False, True, False, True]
    else:
        assert c.recurrent == (True,) * 4 + (False,) + (True,) * 3 and c.n_expert == 0 and c.moe_layers == ()
    assert c.rope_layers == (False,) * c.n_layer and c.layer_parts == ()


def test_teacher_forced_top1_matches_llama_cpp(case):
    # (two routed layers: a 1e-2 near-tie in either leaves 48% of "jamba"'s 557 positions judged)
    top1_matches(case, N_CTX, TIE, least=0.4)


def test_perplexity_matches_llama_cpp(case):
    name, path, _ = case
    perplexity_matches(path, N_CTX, peer_llama(path, N_CTX), name)


def test_each_feature_matters(case, monkeypatch):
    """Done wrong, the dt / B / C norms without their weights (Falcon-Mamba's), rope on the attention
    layer, the experts' top-K renormalised or on every layer; and zeroing the states halfway."""
    name, path, run = case
    wrong = {"rope on": dict(rope_layers=())}
    if name == "jamba":
        wrong |= {"top-K renormalised": dict(expert_norm=True)}
    m, ours = features_matter(monkeypatch, path, N_CTX, run, wrong, TIE)
    states_matter(m, run[0], ours)


def test_dt_b_c_norm_weights_matter(paths):
    """The norms' weights (unit weights in their place move the logits: the weights are read)."""
    import numpy as np
    m = lowbit.load(paths["jamba"], n_ctx=64, threads=2)
    ids = m.tokenize("The quick brown fox jumps over the lazy dog, and the dog sleeps on.")
    base = m.logits(ids)
    for i in (0, 1, 3):
        for slot, n in (("ssm_dt_norm", 16), ("ssm_b_norm", 16), ("ssm_c_norm", 16)):
            m.engine.set_vec(slot, i, np.ones(n, np.float32))
    assert float(np.abs(m.logits(ids) - base).max()) > 0.5


def test_chunks_threads_batches_and_rewinds_bitwise(paths):
    """Chunking, threads, batches (I8) and rewinds as for every hybrid model, the attention layer's
    KV beside the Mamba layers' states (3 Mamba layers: conv [512][3] and SSM [512][16] each)."""
    hybrid_chunks_threads_batches_bitwise(paths["jamba"])
    rewinds_restore_the_state_exactly(paths["jamba"], 8 + 3 * (512 * 3 + 512 * 16) * 4)


def test_synth_cli(tmp_path):
    from lowbit.cli import main
    out = tmp_path / "j.gguf"
    assert main(["synth", "jamba", str(out), "--layers", "2", "--dim", "128", "--attn-period", "2",
                 "--attn-offset", "1", "--experts", "4", "--top-k", "1", "--ffn", "128"]) == 0
    c = lowbit.load(str(out), n_ctx=32).config
    assert c.recurrent == (True, False) and c.moe_layers == (False, True) and c.n_expert == 4
    assert main(["synth", "jamba", str(out), "--top-k", "9"]) == 2


def test_bad_files_are_refused_in_one_line(paths, monkeypatch):
    cases = [({"jamba.attention.head_count_kv": 2}, "head_count_kv must be one count per layer"),
             ({"jamba.ssm.inner_size": 300}, "ssm.inner_size = 300 must be 2 x embedding_length")]
    for meta, msg in cases:
        with pytest.raises(GGUFError, match=msg) as e:
            load_edited(monkeypatch, paths["jamba"], **meta)
        assert "\n" not in str(e.value)
