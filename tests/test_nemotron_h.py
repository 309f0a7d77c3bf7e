"""Nemotron-H (llama.cpp's nemotron_h, nemotron_h_moe) and Mamba-2 (mamba2) on small synthetic files, against
llama.cpp.

Each layer is one block after its attn_norm, then the residual add: a Mamba-2 mixer (csrc/mamba2.cpp,
as Granite 4.0-H's), attention without rope, or an ungated MLP, down(relu(up x)^2). The kinds come from
attention.head_count_kv and feed_forward_length, one count per layer each (both 0: Mamba-2). The
engine's layers then have one part each (EngineConfig::layer_parts): an MLP layer holds no KV and no
state.

nemotron_h_moe (Nemotron 3 Nano): its FFN layers are routed experts, ungated relu^2 (up, down), chosen
by sigmoid with the exp_probs_b selection bias, renormalised if expert_weights_norm, times
expert_weights_scale, plus an ungated relu^2 shared expert.

Files: "nh" (pattern M-*M-: 5 layers), "nh-wide" (M-M*-M-, one B/C group, 4 SSM heads of 48
channels, attention heads of 96), "nh-moe" (ME*ME: 8 experts top-2, renormalised, scale 2.5).
Parity as tests/test_granite_hybrid.py; the MoE file leaves out routing near-ties as
tests/test_lfm2.py does (sigmoid scores: TIE). And llama.cpp's mamba2 (Mamba-2 layers alone) on a
4-layer file.
"""

import numpy as np
import pytest

import lowbit
from llama_ref import (compare_top1, family_fixtures, features_matter, hybrid_chunks_threads_batches_bitwise,
                       load_edited, peer_greedy, peer_llama, perplexity_matches, rewinds_restore_the_state_exactly,
                       states_matter)
from lowbit.gguf import GGUFError
from lowbit.synth import synth_nemotron_h

FILES = {"nh": dict(pattern="M-*M-", embd_type="F16", seed=3),
         "nh-wide": dict(pattern="M-M*-M-", ssm_groups=1, ssm_heads=4, ssm_head_dim=48, head_dim=96, embd_type="F16",
                         seed=4),
         "nh-moe": dict(pattern="ME*ME", embd_type="F16", expert_type="Q8_0", seed=5)}
TIE = 1e-2  # (tests/test_lfm2.py's: sigmoid routing scores within 1e-2 are not judged)
N_CTX = 640


paths, case = family_fixtures("nemotron_h", synth_nemotron_h, FILES, N_CTX)  # (name, path, llama.cpp's greedy run) per file


def test_config(case):
    name, path, _ = case
    c = lowbit.load(path, n_ctx=N_CTX).config
    pattern = FILES[name]["pattern"]
    assert c.arch == ("nemotron_h_moe" if name == "nh-moe" else "nemotron_h")
    assert c.mamba2 and c.ffn_ungated and c.ffn_act == "relu2" and c.ffn == 512
    assert c.recurrent == tuple(k == "M" for k in pattern)
    assert c.layer_parts == tuple(2 if k in "-E" else 1 for k in pattern)
    assert c.rope_layers == (False,) * len(pattern) and c.n_kv == 2
    if name == "nh-moe":
        assert (c.n_expert, c.n_expert_used, c.expert_ffn, c.shexp_ffn, c.expert_scale) == (8, 2, 512, 256, 2.5)
        assert c.expert_norm and c.exp_probs_b and not c.shexp_gated and c.expert_gating == "sigmoid"
    else:
        assert c.n_expert == 0
    assert (c.ssm_heads, c.ssm_groups, c.ssm_inner) == ((4, 1, 192) if name == "nh-wide" else (8, 2, 512))


def test_teacher_forced_top1_matches_llama_cpp(case):
    name, path, run = case
    ours, ref, counted, agree = compare_top1(lowbit.load(path, n_ctx=N_CTX, threads=2), run, TIE)
    print(f"\n{name}: top-1 {agree}/{counted}, max |logit diff| {np.abs(ours - ref).max():.4f}")
    assert counted >= (0.35 if name == "nh-moe" else 0.5) * len(ref) and agree >= 0.99 * counted


def test_perplexity_matches_llama_cpp(case):
    name, path, _ = case
    perplexity_matches(path, N_CTX, peer_llama(path, N_CTX), name)


def test_each_feature_matters(case, monkeypatch):
    """Done wrong, each feature moves the logits: rope in the attention layers, silu for relu^2 in
    the MLP (and the experts); the experts not renormalised, without the selection bias, unscaled or
    routed by softmax; and zeroing the states halfway."""
    name, path, run = case
    n = len(FILES[name]["pattern"])
    wrong = {"rope on": dict(rope_layers=(True,) * n), "silu MLP": dict(ffn_act="silu")}
    if name == "nh-moe":
        del wrong["silu MLP"]  # (the experts' relu^2 is glu_rows' own, ffn_act moves only the shared expert)
        wrong.update({"not renormalised": dict(expert_norm=False), "no selection bias": dict(exp_probs_b=False),
                      "unscaled": dict(expert_scale=1.0), "softmax gating": dict(expert_gating="softmax")})
    m, ours = features_matter(monkeypatch, path, N_CTX, run, wrong, TIE)
    states_matter(m, run[0], ours)


def test_chunks_threads_batches_and_rewinds_bitwise(paths):
    """Chunking, threads, batches (I8) and rewinds as for every hybrid model; the state holds only
    the Mamba-2 layers (2 of nh's 5): per layer the conv state [d_inner + 2 G N][K - 1] and the SSM
    state [d_inner][N]."""
    hybrid_chunks_threads_batches_bitwise(paths["nh"])
    rewinds_restore_the_state_exactly(paths["nh"], 8 + 2 * ((512 + 128) * 3 + 512 * 32) * 4)


def test_synth_cli(tmp_path, capsys):
    from lowbit.cli import main
    out = tmp_path / "m.gguf"
    assert main(["synth", "nemotron_h", str(out), "--pattern", "M*-M", "--dim", "128", "--heads", "2",
                 "--kv-heads", "1", "--ssm-heads", "4", "--ssm-state", "16"]) == 0
    m = lowbit.load(str(out), n_ctx=32)
    assert (m.config.recurrent, m.config.layer_parts) == ((True, False, False, True), (1, 1, 2, 1))
    assert m.forward([1, 2, 3]).shape == (1, m.config.vocab)
    assert main(["info", "-m", str(out)]) == 0
    assert "2 of 4 layers Mamba-2 (4 heads, state 16), 1 MLP, the rest attention" in capsys.readouterr().out
    assert main(["synth", "nemotron_h", str(out), "--shape", "nemotron-nano-9b-v2", "--layers", "4", "--dim", "128",
                 "--heads", "2", "--kv-heads", "1", "--head-dim", "64", "--ffn", "64", "--ssm-heads", "4",
                 "--ssm-head-dim", "16", "--ssm-groups", "2", "--ssm-state", "16"]) == 0
    assert lowbit.load(str(out), n_ctx=32).config.layer_parts == (1, 2, 1, 2)   # "M-M-"
    capsys.readouterr()
    assert main(["synth", "nemotron_h", str(out), "--pattern", "MEM*E", "--dim", "128", "--heads", "2", "--kv-heads", "1",
                 "--ssm-heads", "4", "--ssm-state", "16", "--experts", "4", "--top-k", "2", "--ffn", "64",
                 "--shared-ffn", "64", "--expert-type", "Q8_0"]) == 0
    c = lowbit.load(str(out), n_ctx=32).config
    assert (c.arch, c.layer_parts, c.n_expert, c.shexp_ffn) == ("nemotron_h_moe", (1, 2, 1, 1, 2), 4, 64)
    assert main(["info", "-m", str(out)]) == 0
    assert "2 of 5 layers Mamba-2 (4 heads, state 16), 2 experts, the rest attention" in capsys.readouterr().out
    assert main(["synth", "nemotron_h", str(out), "--pattern", "ME", "--arch", "nemotron_h"]) == 2
    assert "--arch nemotron_h does not match --pattern 'ME'" in capsys.readouterr().err
    assert main(["synth", "nemotron_h", str(out), "--pattern", "M+M"]) == 2
    assert "--pattern 'M+M' must be a string of M (Mamba-2), * (attention), - (MLP) or E" in capsys.readouterr().err


def test_bad_files_are_refused_in_one_line(paths, monkeypatch):
    n = "nemotron_h."
    cases = [({n + "feed_forward_length": 512}, "feed_forward_length must be an array of one count per layer"),
             ({n + "attention.head_count_kv": [0, 0, 2, 0, 2]}, "a layer has both head_count_kv and feed_forward_length"),
             ({n + "feed_forward_length": [0, 512, 0, 0, 256]}, "the MLP layers differ in width"),
             ({n + "ssm.time_step_rank": 6}, "a multiple of ssm.time_step_rank \\(6\\)")]
    m = "nemotron_h_moe."
    cases += [({m + "expert_group_count": 4}, "expert_group_count = 4: group-limited routing is not supported"),
              ({m + "expert_shared_feed_forward_length": None}, "expert_shared_feed_forward_length is missing"),
              ({m + "expert_used_count": 9}, "expert_used_count = 9 must be an integer in 1..8")]
    for meta, msg in cases:
        with pytest.raises(GGUFError, match=msg) as e:
            load_edited(monkeypatch, paths["nh-moe" if "nemotron_h_moe." in str(meta) else "nh"], **meta)
        assert "\n" not in str(e.value)


def test_pure_mamba2_matches_llama_cpp(tmp_path, capsys):
    """llama.cpp's mamba2 (Mamba2, Mamba-Codestral): every layer a Mamba-2 mixer alone after its
    attn_norm; no attention, no FFN (head_count and feed_forward_length 0, as its converter writes
    them). Teacher-forced top-1, perplexity, the states matter, and lowbit info names it."""
    from lowbit.cli import main
    path = synth_nemotron_h(tmp_path / "m2.gguf", pattern="MMMM", arch="mamba2", embd_type="F16", seed=6)
    m = lowbit.load(path, n_ctx=N_CTX, threads=2)
    c = m.config
    assert (c.arch, c.recurrent, c.layer_parts, c.ssm_inner) == ("mamba2", (True,) * 4, (1,) * 4, 512)
    assert m.engine.kv_bytes(1) == 0
    run = peer_greedy(path, N_CTX)
    ours, ref, counted, agree = compare_top1(m, run)
    print(f"\nmamba2: top-1 {agree}/{counted}, max |logit diff| {np.abs(ours - ref).max():.4f}")
    assert counted >= 0.5 * len(ref) and agree >= 0.99 * counted
    perplexity_matches(path, N_CTX, peer_llama(path, N_CTX), "mamba2")
    states_matter(m, run[0], ours)
    assert main(["info", "-m", str(path)]) == 0
    out = capsys.readouterr().out
    assert "4 of 4 layers Mamba-2 (8 heads, state 32)\n" in out
    assert main(["synth", "nemotron_h", str(tmp_path / "x.gguf"), "--arch", "mamba2", "--pattern", "M*M"]) == 2
    assert "--arch mamba2 has Mamba-2 layers only (--pattern of M), not 'M*M'" in capsys.readouterr().err
