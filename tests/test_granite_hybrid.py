"""Granite 4.0-H (llama.cpp's granitehybrid) on small synthetic files, against llama.cpp.

Its layers are Mamba-2 mixers or attention, told apart by attention.head_count_kv (one count per
layer, 0 for a Mamba-2 layer). A Mamba-2 mixer (csrc/mamba2.cpp): ssm_in gives z, x|B|C and dt; a
causal depthwise conv (+ bias, silu) over x|B|C with the slot's last K - 1 inputs as its state; per
head the selective scan s = s exp(dt A) + (x dt) B^T, y = s C with the slot's state; y + x D, gated
by silu(z), an RMSNorm per group; ssm_out. Attention is NoPE unless rope.scaling.finetuned (Granite
4.0-H's files: false). Granite's multipliers (embedding, attention, residual, logit); a dense SwiGLU
FFN or experts (softmax, top-K renormalised) with an ungated shared expert.

Files: "gh" (dense; layers: Mamba-2, attention, Mamba-2, Mamba-2), "gh-rope" (5 layers, rope on,
2 B/C groups, a state size N = 24 that the avx2 scan hands to the reference), "gh-moe" (8 experts
top-2 and a shared expert). Every file has the conv bias: llama.cpp's loader makes it optional but
its graph adds it unconditionally (a file without one crashes llama.cpp; lowbit adds nothing).

Parity as tests/test_lfm2.py: teacher-forced over llama.cpp's greedy continuation (top-1 >= 99%
where llama.cpp's top-2 margin is >= 0.1), perplexity within 0.5%; each feature done wrong moves
the logits (the comparison can fail). Rewinds, speculative decoding and the prefix cache restore
the conv and SSM states bitwise. The scan kernel at every level, a float64 oracle and chunking:
tests/test_mamba2_levels.py.
"""

import numpy as np
import pytest

import lowbit
from llama_ref import (family_fixtures, features_matter, load_edited, lookup_spec_is_plain_greedy,
                       peer_llama, perplexity_matches, prefix_cache_hit_is_bitwise, rewinds_restore_the_state_exactly,
                       states_matter, top1_matches)
from lowbit.gguf import GGUFError
from lowbit.synth import synth_granite_hybrid

BASE = dict(layers=4, dim=256, ffn=512, heads=4, kv_heads=2, ctx=1024, embd_type="F16", wtype="Q8_0", seed=3)
FILES = {"gh": dict(BASE),
         "gh-rope": dict(BASE, layers=5, rope=True, ssm_groups=2, ssm_state=24, seed=4),
         "gh-moe": dict(BASE, experts=8, top_k=2, ffn=256, shared_ffn=256, expert_type="Q8_0", seed=5)}
N_CTX = 640


paths, case = family_fixtures("granitehybrid", synth_granite_hybrid, FILES, N_CTX)  # (name, path, llama.cpp's greedy run) per file


def test_config(case):
    name, path, _ = case
    c = lowbit.load(path, n_ctx=N_CTX).config
    assert c.arch == "granitehybrid" and c.mamba2 and not c.shortconv and c.ssm_conv == 4 and c.ssm_inner == 512
    assert (c.ssm_heads, c.ssm_groups, c.ssm_state) == ((8, 2, 24) if name == "gh-rope" else (8, 1, 32))
    assert c.n_kv == 2 and c.head_dim == 64 and not c.attn_gate and not c.qk_norm
    assert c.recurrent == (True, False, True, True, True)[:c.n_layer]
    assert c.rope_layers == (() if name == "gh-rope" else (False,) * c.n_layer)
    assert (c.embd_scale, c.attn_scale, c.logit_scale) == (12.0, 1 / 64, 8.0) and abs(c.residual_scale - 0.22) < 1e-6
    if name == "gh-moe":
        assert (c.n_expert, c.n_expert_used, c.expert_ffn, c.shexp_ffn) == (8, 2, 256, 256)
        assert c.expert_norm and not c.shexp_gated and c.expert_gating == "softmax"
    else:
        assert c.n_expert == 0


def test_teacher_forced_top1_matches_llama_cpp(case):
    top1_matches(case, N_CTX)


def test_perplexity_matches_llama_cpp(case):
    name, path, _ = case
    perplexity_matches(path, N_CTX, peer_llama(path, N_CTX), name)


def _bound_as(monkeypatch, slot, fn):
    """Model._vec with the vectors bound to `slot` replaced by fn(their values) (a feature done wrong
    in the weights), until the test ends."""
    from lowbit.model import Model
    real = Model._vec

    def vec(self, s, layer, name, engine=None, keep=None, rows=None):
        real(self, s, layer, name, engine, keep, rows)
        if s == slot:
            v = fn(np.array(self._keep[-1] if keep is None else keep[-1], np.float32))
            self._keep.append(v)
            (self.engine if engine is None else engine).set_vec(s, layer, v)
    monkeypatch.setattr(Model, "_vec", vec)


def test_each_feature_matters(case, monkeypatch):
    """The same file with a feature done wrong no longer matches llama.cpp: rope where the file says
    NoPE (or none where it rotates), no residual multiplier, the MoE's weights not renormalised; and
    in the Mamba-2 weights (bound wrong): no D skip, no dt bias, the conv bias dropped, A halved,
    the grouped norm's weights all ones. And the states: the same positions with every layer's conv
    and SSM state zeroed once, halfway, move the logits after it."""
    name, path, run = case
    n = lowbit.load(path, n_ctx=32).config.n_layer
    wrong = {"rope switched": dict(rope_layers=(name != "gh-rope",) * n), "no residual scale": dict(residual_scale=0.0)}
    if name == "gh-moe":
        wrong["not renormalised"] = dict(expert_norm=False)
    m, ours = features_matter(monkeypatch, path, N_CTX, run, wrong)
    ids, ref = run
    weights = {"ssm_d": np.zeros_like, "ssm_dt.bias": np.zeros_like, "ssm_a": lambda v: v / 2,
               "ssm_norm": np.ones_like, "ssm_conv1d.bias": np.zeros_like}
    for slot, fn in weights.items():
        with monkeypatch.context() as mp:
            _bound_as(mp, slot, fn)
            bad = lowbit.load(path, n_ctx=N_CTX, threads=2).forward(ids, all_logits=True)
        diff = float(np.abs(bad - ref).max())
        assert diff > 0.5, f"{slot} bound wrong: max |diff| {diff:.3f}: the change is not seen"
    states_matter(m, ids, ours)


# ---- rewinds, speculative decoding, the prefix cache --------------------------------------------


def test_rewind_restores_the_states_exactly(paths):
    """Rewinds (the checkpoint, the replay log of a 2..8-token call, a replay from the start) give
    bitwise the conv and SSM states of never having gone ahead, and the same logits after."""
    # position, then per Mamba-2 layer (3) the conv state [d_inner + 2 G N][K - 1] and the SSM state [d_inner][N]
    rewinds_restore_the_state_exactly(paths["gh"], 8 + 3 * ((512 + 64) * 3 + 512 * 32) * 4)


def test_speculative_greedy_is_plain_greedy(paths):
    """Prompt-lookup speculative decoding rewinds rejected drafts: the states restored exactly, its
    greedy text is token for token the plain greedy text."""
    lookup_spec_is_plain_greedy(lowbit.load(paths["gh-moe"], n_ctx=192, threads=2))


def test_prefix_cache_hit_is_bitwise(paths):
    """The server's prefix cache on Granite 4.0-H: a hit loads the KV blocks and the state snapshot
    at the chain's end, and the logits after it equal, bit for bit, those of the whole prompt."""
    prefix_cache_hit_is_bitwise(paths["gh"])


# ---- the CLI and bad files ---------------------------------------------------------------------

def test_synth_cli_writes_granite_hybrid_models(tmp_path, capsys):
    from lowbit.cli import main
    out = tmp_path / "m.gguf"
    assert main(["synth", "granitehybrid", str(out), "--dim", "128", "--heads", "2", "--kv-heads", "1",
                 "--layers", "4", "--attn-layers", "1,3", "--experts", "4", "--top-k", "2", "--ffn", "64",
                 "--shared-ffn", "64", "--ssm-heads", "4", "--ssm-state", "16", "--expert-type", "Q8_0"]) == 0
    m = lowbit.load(str(out), n_ctx=32)
    c = m.config
    assert (c.arch, c.recurrent, c.n_expert, c.shexp_ffn, c.ssm_heads, c.ssm_inner) == (
        "granitehybrid", (True, False, True, False), 4, 64, 4, 256)
    assert m.forward([1, 2, 3]).shape == (1, c.vocab)
    assert main(["info", "-m", str(out)]) == 0
    assert "2 of 4 layers Mamba-2 (4 heads, state 16)" in capsys.readouterr().out
    # a published shape fills what is not given (a slice keeps its attention layers inside it)
    assert main(["synth", "granitehybrid", str(out), "--shape", "granite-4.0-h-tiny", "--layers", "6", "--dim", "128",
                 "--heads", "2", "--kv-heads", "1", "--ssm-heads", "4", "--experts", "4", "--top-k", "2", "--ffn", "64",
                 "--shared-ffn", "64", "--expert-type", "Q8_0"]) == 0
    c = lowbit.load(str(out), n_ctx=32).config
    assert c.recurrent == (True,) * 5 + (False,) and (c.ssm_state, c.ssm_groups, c.ssm_conv) == (128, 1, 4)
    capsys.readouterr()
    assert main(["synth", "granitehybrid", str(out), "--ssm-heads", "7"]) == 2
    assert "d_inner (2 x dim = 512) must split into --ssm-heads (7)" in capsys.readouterr().err
    assert main(["synth", "granitehybrid", str(out), "--attn-layers", "1,9"]) == 2
    assert "attention layers [1, 9] must be distinct layers of 0..3" in capsys.readouterr().err


def test_bad_files_are_refused_in_one_line(paths, monkeypatch):
    g = "granitehybrid."
    cases = [({g + "attention.head_count_kv": 2}, "head_count_kv must be an array of one count per layer"),
             ({g + "attention.head_count_kv": [0, 2, 1, 0]},
              "one positive KV head count for every attention layer; 0 marks a Mamba-2 layer"),
             ({g + "ssm.state_size": None}, "granitehybrid.ssm.state_size is missing"),
             ({g + "ssm.inner_size": 384}, "ssm.inner_size = 384 must be 2 x embedding_length"),
             ({g + "ssm.time_step_rank": 6}, "a multiple of ssm.time_step_rank \\(6\\)"),
             ({g + "ssm.group_count": 3}, "itself a multiple of ssm.group_count \\(3\\)")]
    for meta, msg in cases:
        with pytest.raises(GGUFError, match=msg) as e:
            load_edited(monkeypatch, paths["gh"], **meta)
        assert "\n" not in str(e.value)
