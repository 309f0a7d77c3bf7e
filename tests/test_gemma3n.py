"""Gemma 3n (llama.cpp's gemma3n: E2B / E4B) on small synthetic files, against llama.cpp.

gemma3n (lowbit.synth.synth_gemma3n) is gemma3's layer (scaled embeddings, pre- and post-norms,
GeGLU, per-head q / k norms, a tied head, logits capped at 30) with v RMS-normed, 4:1 sliding
layers, and around it:
  - AltUp: 4 residual streams per token (streams 1-3 projected from the embeddings and rescaled to
    their norm); before each layer the streams predict each other through coefficients routed by
    the active stream, the layer runs on the active prediction, after it the streams are corrected
    by the layer's innovation; at the end streams 1-3 are projected back, rescaled and averaged
    with stream 0 (csrc/altup.cpp);
  - LAuReL: a rank-64 residual beside the attention, (x + attention + laurel) / sqrt 2;
  - per-layer embeddings (Gemma 4 E2B's block, on the corrected active stream times a scale,
    added to streams 1-3);
  - the first 10 layers' FFN gates keep only values above mean + 1.645 std of their row;
  - from layer 20 on a layer keeps no KV and reads layer 18's (sliding) or 19's (full).

Files: "g3n" (6 layers, width 256, the streams mixed by ~0.2 per layer) and "g3n-kv" (22 layers,
the last two reading layer 18's KV, the streams mixed weakly and the blocks scaled down), llama.cpp's
fixed widths (per-layer embeddings of 256, LAuReL rank 64, 4 streams).
Parity as the other families: teacher-forced over llama.cpp's greedy run, top-1 >= 99% where
llama.cpp's margin is >= 0.1, perplexity within 0.5%, each feature done wrong moves the logits.
"""
import numpy as np
import pytest

import lowbit
from llama_ref import family_fixtures, features_matter, perplexity_matches, peer_llama, top1_matches
from lowbit.synth import synth_gemma3n

FILES = {"g3n": dict(layers=6, embd_type="Q8_0", seed=3),
         # (per_layer_token_embd: 49152 x 5632. 22 random layers as g3n's are chaotic: llama.cpp's own flash
         # and plain attention paths differ on them by a median 2 (0.27 with weakly mixed streams); with
         # weakly mixed streams and blocks scaled by 0.3, by a median 0.09 (max 0.12), as other families)
         "g3n-kv": dict(layers=22, embd_type="Q4_0", router_std=0.25, block_scale=0.3, seed=6)}
N_CTX = 640

paths, case = family_fixtures("gemma3n", synth_gemma3n, FILES, N_CTX)  # (name, path, llama.cpp's greedy run) per file


def test_config(case):
    name, path, _ = case
    c = lowbit.load(path, n_ctx=N_CTX).config
    assert c.arch == "gemma3n" and c.rope_neox and c.tied_output and c.post_norms and c.v_norm and c.qk_norm
    assert (c.altup, c.ple_dim, c.sparse_layers, c.ffn_act, c.logit_softcap) == (4, 256, 10 if name == "g3n-kv" else 6,
                                                                               "gelu", 30.0)
    assert c.attn_scale == 1.0 and c.embd_scale == float(np.sqrt(np.float32(256))) and c.rope_base_swa == 10000.0
    assert c.window == ((64,) * 4 + (0,)) * (c.n_layer // 5) + (64,) * (c.n_layer % 5)
    assert c.kv_source == (((-1,) * 20 + (18, 18)) if name == "g3n-kv" else ())
    assert c.attention_layers == list(range(min(c.n_layer, 20)))


def test_teacher_forced_top1_matches_llama_cpp(case):
    top1_matches(case, N_CTX)


def test_perplexity_matches_llama_cpp(case):
    name, path, _ = case
    perplexity_matches(path, N_CTX, peer_llama(path, N_CTX), name)


def test_each_feature_matters(case, monkeypatch):
    """The same file with a feature done wrong no longer matches llama.cpp: the FFN gates dense
    (no activation sparsity), v not normed, the sliding layers at the global rope base; g3n-kv's
    last layers with KV of their own."""
    name, path, run = case
    wrong = {"no activation sparsity": dict(sparse_layers=0), "no v norm": dict(v_norm=False),
             "one rope base": dict(rope_base_swa=0.0)}
    if name == "g3n-kv":
        wrong = {"own KV in every layer": dict(kv_source=())}
    features_matter(monkeypatch, path, N_CTX, run, wrong)


def test_streams_and_laurel_matter(paths):
    """AltUp's coefficients, LAuReL and the per-layer block each move the logits (their weights
    zeroed in place: the model no longer matches itself)."""
    m = lowbit.load(paths["g3n"], n_ctx=64, threads=2)
    ids = m.tokenize("The quick brown fox jumps over the lazy dog, and the dog sleeps on.")
    base = m.logits(ids, chunk=len(ids))
    for slot, n in (("altup_predict_coef", 64), ("altup_correct_coef", 16), ("laurel_post_norm", 256),
                    ("per_layer_post_norm", 256)):
        m = lowbit.load(paths["g3n"], n_ctx=64, threads=2)
        zero = np.zeros(n, np.float32)
        for i in range(m.config.n_layer):
            m.engine.set_vec(slot, i, zero)
        assert float(np.abs(m.logits(ids, chunk=len(ids)) - base).max()) > 0.5, slot


@pytest.mark.parametrize("name", ["g3n", "g3n-kv"])
def test_chunks_threads_and_slots_are_bitwise(paths, name):
    """A token's logits do not depend on the chunking of its prompt, the thread count or the batch
    it shares (I8): the streams and the sparse gates are per token."""
    m = lowbit.load(paths[name], n_ctx=256, threads=2, n_slots=2)
    ids = m.tokenize("In a hole in the ground there lived a hobbit. Not a nasty, dirty, wet hole, filled with "
                     "the ends of worms and an oozy smell, nor yet a dry, bare, sandy hole with nothing in it " * 2)
    assert len(ids) > 64
    whole = m.logits(ids, chunk=len(ids))
    assert np.array_equal(whole, m.logits(ids, chunk=1)) and np.array_equal(whole, m.logits(ids, chunk=7))
    assert np.array_equal(whole, lowbit.load(paths[name], n_ctx=256, threads=1).logits(ids, chunk=len(ids)))
    a, b = ids[:20], ids[20:50]
    alone = m.logits(b, chunk=len(b))
    la, lb = lowbit.load(paths[name], n_ctx=256, threads=2, n_slots=2).forward_batch([(0, a), (1, b)], all_logits=True)
    assert np.array_equal(la, whole[:20]) and np.array_equal(lb, alone)


def test_pipeline_stages_are_refused(paths):
    """AltUp's streams (like the per-layer embeddings) need every layer in one engine."""
    with pytest.raises(Exception, match="per-layer embeddings need every layer"):
        lowbit.load(paths["g3n"], n_ctx=64, stages=2)
