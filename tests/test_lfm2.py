"""LFM2 (llama.cpp's lfm2) and LFM2 MoE (lfm2moe) on small synthetic files, against llama.cpp.

LFM2's layers are short-conv blocks or attention, told apart by attention.head_count_kv (one count
per layer, 0 for a conv layer). A conv block (csrc/shortconv.cpp): in_proj gives b, c, x; the
causal depthwise conv of width shortconv.l_cache runs over b * x with the slot's last l_cache - 1
inputs as its state; c times the conv's output goes through out_proj. Attention has per-head q / k
norms and neox rope; the final norm is token_embd_norm. lfm2moe adds leading dense layers, then
experts routed by sigmoid with the exp_probs_b selection bias, top-K renormalised.

Files: "lfm2" (4 layers: conv, conv, attention, conv), "lfm2-swa" (its attention layers slide over
24 positions), "lfm2moe" (5 layers, the first dense, sigmoid routing), "lfm2moe-softmax".

Parity as tests/test_llama_variants.py: teacher-forced over llama.cpp's greedy continuation (top-1
>= 99% where llama.cpp's top-2 margin is >= 0.1), perplexity within 0.5%; each feature done wrong
moves the logits (the comparison can fail). The conv state is the slot's recurrent state: chunking,
threads, batches and rewinds are bitwise, as for the delta-net models (tests/test_qwen35.py).
"""

import numpy as np
import pytest

import lowbit
from llama_ref import (compare_top1, family_fixtures, features_matter, hybrid_chunks_threads_batches_bitwise,
                       load_edited, lookup_spec_is_plain_greedy, peer_llama, perplexity_matches,
                       prefix_cache_hit_is_bitwise, rewinds_restore_the_state_exactly, states_matter)
from lowbit.gguf import GGUFError
from lowbit.synth import synth_lfm2

BASE = dict(layers=4, dim=256, ffn=512, heads=4, kv_heads=2, ctx=1024, embd_type="F16", wtype="Q8_0", seed=3)
MOE = dict(BASE, arch="lfm2moe", layers=5, experts=8, top_k=2, expert_ffn=256, leading_dense=1, expert_type="Q8_0")
FILES = {"lfm2": dict(BASE), "lfm2-swa": dict(BASE, layers=6, window=24),
         "lfm2moe": dict(MOE), "lfm2moe-softmax": dict(MOE, gating="softmax")}
N_CTX = 640
# Routing near-ties: lfm2moe's sigmoid scores (probabilities, 8 experts) sit within 1e-2 of each
# other at a third of the positions here, and lowbit's and llama.cpp's hidden states differ by ~1%
# (accumulation order), ~5e-3 in a score: the positions where a margin is below TIE are not judged.
TIE = 1e-2


paths, case = family_fixtures("lfm2", synth_lfm2, FILES, N_CTX)  # (name, path, llama.cpp's greedy run) per file


def test_config(case):
    name, path, _ = case
    c = lowbit.load(path, n_ctx=N_CTX).config
    assert c.arch == name.split("-")[0] and c.shortconv and c.ssm_conv == 3 and c.rope_neox and c.qk_norm
    assert c.n_kv == 2 and c.head_dim == 64 and not c.attn_gate
    if name == "lfm2-swa":
        assert c.recurrent == (True, True, False, True, True, False) and c.window == (24,) * 6
    else:
        assert c.recurrent == (True, True, False, True, True)[:c.n_layer] and not any(c.window)
    if name.startswith("lfm2moe"):
        assert (c.n_expert, c.n_expert_used, c.expert_ffn, c.ffn, c.n_dense_lead) == (8, 2, 256, 512, 1)
        assert c.expert_norm and c.exp_probs_b and c.shexp_ffn == 0 and c.expert_scale == 1.0
        assert c.expert_gating == ("softmax" if name.endswith("softmax") else "sigmoid")
    else:
        assert c.n_expert == 0


def test_teacher_forced_top1_matches_llama_cpp(case):
    name, path, run = case
    ours, ref, counted, agree = compare_top1(lowbit.load(path, n_ctx=N_CTX, threads=2), run, TIE)
    print(f"\n{name}: top-1 {agree}/{counted}, max |logit diff| {np.abs(ours - ref).max():.4f}")
    # (an MoE file judges fewer positions: the routing near-ties above are left out, ~45% of them)
    assert counted >= (0.35 if "moe" in name else 0.5) * len(ref) and agree >= 0.99 * counted


def test_perplexity_matches_llama_cpp(case):
    name, path, _ = case
    perplexity_matches(path, N_CTX, peer_llama(path, N_CTX), name)


def test_each_feature_matters(case, monkeypatch):
    """The same file with a feature done wrong no longer matches llama.cpp: rope on adjacent pairs,
    no q / k norms, no sliding window (lfm2-swa), the MoE's weights not renormalised, without the
    selection bias, or routed by the other gating function. And the conv state: the same
    positions with every conv layer's state zeroed once, halfway, move the logits after it."""
    name, path, run = case
    wrong = {"adjacent pairs": dict(rope_neox=False), "no q/k norms": dict(qk_norm=False)}
    if name == "lfm2-swa":
        wrong["no window"] = dict(window=(0,) * 6)
    if name.startswith("lfm2moe"):
        other = "sigmoid" if name.endswith("softmax") else "softmax"
        wrong.update({"not renormalised": dict(expert_norm=False), "no selection bias": dict(exp_probs_b=False),
                      f"{other} gating": dict(expert_gating=other)})
    m, ours = features_matter(monkeypatch, path, N_CTX, run, wrong, TIE)
    ids = run[0]
    states_matter(m, ids, ours)


# ---- chunks, threads, batches, rewinds -----------------------------------------------------


@pytest.mark.parametrize("name", ("lfm2", "lfm2moe"))
def test_chunks_threads_and_batches_bitwise(paths, name):
    """A token's logits do not depend on how its prompt was chunked, on the thread count or on
    another slot sharing its batch (I8): the conv runs each slot's tokens in order."""
    hybrid_chunks_threads_batches_bitwise(paths[name])


def test_rewind_restores_the_conv_state_exactly(paths):
    """Rewinds (the checkpoint, the replay log of a 2..8-token call, a replay from the start) give
    bitwise the conv state of never having gone ahead, and the same logits after."""
    # position, 3 conv layers x dim x (l_cache - 1)
    rewinds_restore_the_state_exactly(paths["lfm2"], 8 + 3 * 256 * 2 * 4)


def test_speculative_greedy_is_plain_greedy(paths):
    """Prompt-lookup speculative decoding rewinds rejected drafts: the conv state restored exactly,
    its greedy text is token for token the plain greedy text."""
    lookup_spec_is_plain_greedy(lowbit.load(paths["lfm2moe"], n_ctx=192, threads=2))


def test_prefix_cache_hit_is_bitwise(paths):
    """The server's prefix cache on LFM2: a hit loads the KV blocks and the conv state snapshot at
    the chain's end, and the logits after it equal, bit for bit, those of the whole prompt."""
    prefix_cache_hit_is_bitwise(paths["lfm2"])


# ---- the CLI and bad files ---------------------------------------------------------------------

def test_synth_cli_writes_lfm2_models(tmp_path, capsys):
    from lowbit.cli import main
    out = tmp_path / "m.gguf"
    assert main(["synth", "lfm2", str(out), "--arch", "lfm2moe", "--dim", "128", "--heads", "2", "--kv-heads", "1",
                 "--layers", "4", "--attn-layers", "1,3", "--experts", "4", "--top-k", "2", "--expert-ffn", "64",
                 "--leading-dense", "2", "--expert-type", "Q8_0"]) == 0
    m = lowbit.load(str(out), n_ctx=32)
    c = m.config
    assert (c.arch, c.recurrent, c.n_expert, c.n_dense_lead, c.expert_ffn) == ("lfm2moe", (True, False, True, False),
                                                                              4, 2, 64)
    assert m.forward([1, 2, 3]).shape == (1, c.vocab)
    assert main(["info", "-m", str(out)]) == 0
    assert "2 of 4 layers short-conv (kernel 3)" in capsys.readouterr().out
    # a published shape fills what is not given; a wrong arch or bad layer list is a usage error
    assert main(["synth", "lfm2", str(out), "--shape", "lfm2-1.2b", "--layers", "3", "--dim", "128", "--heads", "2",
                 "--kv-heads", "1", "--ffn", "128"]) == 0
    c = lowbit.load(str(out), n_ctx=32).config
    assert c.recurrent == (True, True, False) and c.n_kv == 1
    capsys.readouterr()
    assert main(["synth", "lfm2", str(out), "--shape", "lfm2-8b-a1b", "--arch", "lfm2"]) == 2
    err = capsys.readouterr().err
    assert "--shape lfm2-8b-a1b is a lfm2moe model: lowbit synth lfm2 OUT --shape lfm2-8b-a1b (not --arch lfm2)" in err
    assert main(["synth", "lfm2", str(out), "--attn-layers", "1,9"]) == 2
    assert "attention layers [1, 9] must be distinct layers of 0..3" in capsys.readouterr().err


def test_bad_files_are_refused_in_one_line(paths, monkeypatch):
    cases = [(paths["lfm2"], {"lfm2.attention.head_count_kv": 2},
              "head_count_kv must be an array of one count per layer"),
             (paths["lfm2"], {"lfm2.attention.head_count_kv": [0, 0, 2, 1]},
              "one positive KV head count for every attention layer; 0 marks a short-conv layer"),
             (paths["lfm2"], {"lfm2.shortconv.l_cache": None}, "lfm2.shortconv.l_cache is missing"),
             (paths["lfm2"], {"lfm2.shortconv.l_cache": 1}, "l_cache = 1 must be at least 2"),
             (paths["lfm2moe"], {"lfm2moe.expert_gating_func": None}, "expert_gating_func = None is missing"),
             (paths["lfm2moe"], {"lfm2moe.leading_dense_block_count": 9}, "must be an integer in 0..5")]
    for path, meta, msg in cases:
        with pytest.raises(GGUFError, match=msg) as e:
            load_edited(monkeypatch, path, **meta)
        assert "\n" not in str(e.value)
