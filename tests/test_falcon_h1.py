"""Falcon-H1 (llama.cpp's falcon-h1) on small synthetic files, against llama.cpp.

Every layer runs attention (neox rope, GQA) and a Mamba-2 mixer (csrc/mamba2.cpp, as Granite 4.0-H's)
side by side on its attn_norm output and adds their outputs before the one residual add
(EngineConfig::ssm_parallel); then ffn_norm (a tensor named without ".weight", as the converter
writes it) and a SwiGLU FFN. Every layer holds KV rows and a recurrent state. Falcon-H1's
multipliers are folded into the weights by convert_hf_to_gguf, so the file has none.

Files: "fh" (4 layers, d_inner 384 in 6 heads, 1 B/C group, ssm_norm), "fh-nonorm" (3 layers, no
ssm_norm, 2 groups, attention heads of 96, a tied head). Parity as tests/test_granite_hybrid.py:
teacher-forced over llama.cpp's greedy run, top-1 >= 99% where llama.cpp's margin is >= 0.1, each
feature done wrong moves the logits, perplexity within 0.5%.
"""

import pytest

import lowbit
from llama_ref import (family_fixtures, features_matter, hybrid_chunks_threads_batches_bitwise,
                       load_edited, peer_llama, perplexity_matches, prefix_cache_hit_is_bitwise,
                       rewinds_restore_the_state_exactly, states_matter, top1_matches)
from lowbit.gguf import GGUFError
from lowbit.synth import synth_falcon_h1

FILES = {"fh": dict(embd_type="F16", seed=3),
         "fh-nonorm": dict(layers=3, ssm_norm=False, ssm_groups=2, ssm_heads=4, ssm_inner=256, head_dim=96,
                           tied=True, embd_type="F16", seed=4)}
N_CTX = 640


paths, case = family_fixtures("falcon_h1", synth_falcon_h1, FILES, N_CTX)  # (name, path, llama.cpp's greedy run) per file


def test_config(case):
    name, path, _ = case
    m = lowbit.load(path, n_ctx=N_CTX)
    c = m.config
    n = FILES[name].get("layers", 4)
    assert c.arch == "falcon-h1" and c.mamba2 and c.ssm_parallel and c.rope_neox
    assert c.recurrent == (True,) * n and c.attention_layers == list(range(n))
    assert (c.ssm_inner, c.ssm_heads, c.ssm_groups) == ((256, 4, 2) if name == "fh-nonorm" else (384, 6, 1))
    assert m.engine.kv_bytes(1) == n * 2 * 2 * c.n_kv * c.head_dim  # every layer holds K and V (half)


def test_teacher_forced_top1_matches_llama_cpp(case):
    top1_matches(case, N_CTX)


def test_perplexity_matches_llama_cpp(case):
    name, path, _ = case
    perplexity_matches(path, N_CTX, peer_llama(path, N_CTX), name)


def test_each_feature_matters(case, monkeypatch):
    """Done wrong, each part moves the logits: the Mamba-2 mixer left out (attention alone), the
    attention left out (the mixer alone, every layer a Mamba-2 layer), rope off; and zeroing the
    states halfway."""
    name, path, run = case
    n = FILES[name].get("layers", 4)
    wrong = {"no Mamba-2 beside": dict(ssm_parallel=False, recurrent=(False,) * n),
             "no attention beside": dict(ssm_parallel=False),
             "rope off": dict(rope_layers=(False,) * n)}
    if name == "fh-nonorm":  # (a Mamba-2 layer in place of attention needs its ssm_norm: fh shows it)
        del wrong["no attention beside"]
    m, ours = features_matter(monkeypatch, path, N_CTX, run, wrong)
    states_matter(m, run[0], ours)


def test_chunks_threads_batches_rewinds_and_prefix_cache_bitwise(paths):
    """Chunking, threads, batches (I8), rewinds and a prefix-cache hit as for every hybrid model; the
    state holds every layer's Mamba-2 state: the conv state [d_inner + 2 G N][K - 1] and the SSM state
    [d_inner][N] (KV rows beside it)."""
    hybrid_chunks_threads_batches_bitwise(paths["fh"])
    rewinds_restore_the_state_exactly(paths["fh"], 8 + 4 * ((384 + 64) * 3 + 384 * 32) * 4)
    prefix_cache_hit_is_bitwise(paths["fh"])


def test_synth_cli(tmp_path, capsys):
    from lowbit.cli import main
    out = tmp_path / "m.gguf"
    assert main(["synth", "falcon-h1", str(out), "--layers", "2", "--dim", "128", "--heads", "2", "--kv-heads", "1",
                 "--ssm-inner", "128", "--ssm-heads", "4", "--ssm-state", "16", "--no-ssm-norm"]) == 0
    f = lowbit.gguf.open(str(out))
    assert "blk.1.ffn_norm" in f.tensors and "blk.1.ffn_norm.weight" not in f.tensors
    assert "blk.0.ssm_norm.weight" not in f.tensors
    m = lowbit.load(str(out), n_ctx=32)
    assert m.config.ssm_parallel and m.forward([1, 2, 3]).shape == (1, m.config.vocab)
    assert main(["info", "-m", str(out)]) == 0
    assert "2 of 2 layers Mamba-2 (4 heads, state 16), each beside attention" in capsys.readouterr().out
    assert main(["synth", "falcon-h1", str(out), "--shape", "falcon-h1-0.5b", "--layers", "1", "--dim", "128",
                 "--ffn", "64", "--heads", "2", "--kv-heads", "1", "--ssm-inner", "96", "--ssm-heads", "3"]) == 0
    c = lowbit.load(str(out), n_ctx=32).config
    assert (c.n_layer, c.head_dim, c.ssm_state, c.ssm_inner) == (1, 64, 128, 96)   # head_dim, state: the shape's
    capsys.readouterr()
    assert main(["synth", "falcon-h1", str(out), "--ssm-inner", "100", "--ssm-heads", "3"]) == 2
    assert "--ssm-inner (100) must split into --ssm-heads (3)" in capsys.readouterr().err


def test_bad_files_are_refused_in_one_line(paths, monkeypatch):
    n = "falcon-h1."
    cases = [({n + "ssm.time_step_rank": 5}, "a multiple of ssm.time_step_rank \\(5\\)"),
             ({n + "ssm.inner_size": None}, "ssm.inner_size is missing"),
             ({n + "attention.scale": -1.0}, "attention.scale = -1.0 is not a number >= 0")]
    for meta, msg in cases:
        with pytest.raises(GGUFError, match=msg) as e:
            load_edited(monkeypatch, paths["fh"], **meta)
        assert "\n" not in str(e.value)
