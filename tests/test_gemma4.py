"""Gemma 4 dense (llama.cpp's gemma4) on small synthetic files, against llama.cpp.

gemma4 (lowbit.synth.synth_gemma4) is gemma3's layer (scaled embeddings, pre- and post-norms, GeGLU,
q / k norms, a tied head, the final soft-cap) with a per-layer attention geometry: the sliding layers
have more, narrower KV heads (key_length_swa) than the full layers (key_length), head_count_kv is one
count per layer, the sliding layers rotate rope.dimension_count_swa dims with rope.freq_base_swa and
the full layers all their dims with rope_freqs' "proportional" factors (1e30 past the rotated
fraction); v is RMS-normed without a weight, a full layer without attn_v takes v = k's projection;
the softmax is unscaled (q and k are normed); each layer's output is times layer_output_scale.
The engine's side: EngineConfig::layer_kv / layer_hd / rope_dims_swa / v_norm (csrc/engine.h), a KV
cache laid out per layer (KvLayer).

Files: "g4" (6 layers, pattern sliding, sliding, full; 2 KV heads of 64 / 1 of 128; v = k in the full
layers; a layer_output_scale per layer; Q8_0) and "g4-v" (4 layers alternating; 2 KV heads of 64 / 2
of 256, attn_v everywhere, the sliding layers rotating 32 of their 64 dims, no soft-cap, no output
scale; Q4_K where the rows allow) and "g4-moe" (26B-A4B's MoE layers: 8 Q4_0 GeGLU experts, top 2,
beside the dense MLP; the router on the residual's weightless RMSNorm times ffn_gate_inp.scale; a
per-expert output scale) and "g4-e" (E2B / E4B's layers: per-layer embeddings of 64, the last 3 of 6
layers reading layers 1 and 2's KV, their FFNs twice as wide, Q8_0 per-layer and token embeddings).
Parity as the other families: teacher-forced over llama.cpp's greedy
run, top-1 >= 99% where llama.cpp's margin is >= 0.1, perplexity within 0.5%, each feature done wrong
moves the logits; a q8_0 cache against llama.cpp's flash attention.
"""
import numpy as np
import pytest

import lowbit
from llama_ref import (family_fixtures, features_matter, llama_greedy, load_edited, peer_llama,
                       perplexity_matches, top1_matches)
from lowbit.gguf import GGUFError
from lowbit.synth import synth_gemma4

FILES = {"g4": dict(seed=5),
         "g4-v": dict(layers=4, swa_pattern=2, kv_heads_full=2, head_dim_full=256, v_shared_full=False,
                      rope_dims_swa=32, softcap=0.0, out_scale=False, wtype="Q4_K", embd_type="F16", seed=6),
         "g4-moe": dict(layers=4, swa_pattern=2, experts=8, top_k=2, expert_ffn=128, expert_type="Q4_0", seed=7),
         "g4-e": dict(layers=6, swa_pattern=3, ple_dim=64, shared_kv=3, double_wide=True, embd_type="Q8_0", seed=8)}
N_CTX = 640
# positions judged: llama.cpp's margin >= 0.1 and, in g4-moe, no routing margin below 1e-2 in lowbit's
# router at any layer (its softmax over 8 experts flips within 1e-2 on the two engines' float
# differences, as LFM2 MoE's and Nemotron-H MoE's do; elsewhere the median |diff| is 0.06)
TIE = {"g4-moe": 1e-2}
# perplexity's bound: 1% for g4-moe, whose router flips on the engines' float differences (TIE) at
# positions that no perplexity can leave out (later tokens attend to them): lowbit's avx2 and avx512
# levels differ by 0.05% there, and sit 0.49% / 0.53% from llama.cpp on an AVX-512 host (84231 / 84189
# against 84641); the other files keep 0.5%
PPL_TOL = {"g4-moe": 0.01}

paths, case = family_fixtures("gemma4", synth_gemma4, FILES, N_CTX)  # (name, path, llama.cpp's greedy run) per file


def test_config(case):
    name, path, _ = case
    m = lowbit.load(path, n_ctx=N_CTX)
    c = m.config
    assert c.arch == "gemma4" and c.rope_neox and c.tied_output and c.post_norms and c.v_norm and c.ffn_act == "gelu"
    assert c.attn_scale == 1.0 and c.embd_scale == float(np.sqrt(np.float32(256))) and c.rope_base_swa == 10000.0
    if name == "g4":
        assert c.layer_kv == (2, 2, 1, 2, 2, 1) and c.layer_hd == (64, 64, 128, 64, 64, 128)
        assert c.window == (64, 64, 0, 64, 64, 0) and c.rope_dims == 128 and c.rope_dims_swa == 64
        assert (c.n_kv, c.head_dim, c.logit_softcap) == (2, 128, 30.0)
    elif name == "g4-v":
        assert c.layer_kv == (2, 2, 2, 2) and c.layer_hd == (64, 256, 64, 256) and c.rope_dims_swa == 32
        assert c.logit_softcap == 0.0
    elif name == "g4-moe":
        assert (c.n_expert, c.n_expert_used, c.expert_ffn, c.ffn) == (8, 2, 128, 512)
        assert c.moe_mlp and c.expert_norm and c.expert_scale == 1.0 and c.expert_gating == "softmax"
    else:
        assert (c.ple_dim, c.kv_source, c.layer_ffn) == (64, (-1, -1, -1, 1, 1, 2), (512,) * 3 + (1024,) * 3)
        assert c.attention_layers == [0, 1, 2] and c.ffn == 1024
    assert c.moe_mlp == (name == "g4-moe") and (c.ple_dim > 0) == (name == "g4-e")
    # each layer with its own cache holds its own heads: K and V, half
    assert m.engine.kv_bytes(1) == sum(2 * 2 * c.layer_kv[i] * c.layer_hd[i] for i in c.attention_layers)
    assert m.engine.validate() == ""


def test_teacher_forced_top1_matches_llama_cpp(case):
    top1_matches(case, N_CTX, TIE.get(case[0], 1e-3))


def test_perplexity_matches_llama_cpp(case):
    name, path, _ = case
    perplexity_matches(path, N_CTX, peer_llama(path, N_CTX), name, PPL_TOL.get(name, 0.005))


def test_each_feature_matters(case, monkeypatch):
    """Done wrong, each part moves the logits by > 0.5: v's norm, the sliding windows, the sliding
    layers' rope base and rotated dims, the post-norms, the embedding scale; and (g4) the layer
    output scales."""
    name, path, run = case
    c = lowbit.load(path, n_ctx=16).config
    wrong = {"sliding windows": dict(window=tuple(w // 4 for w in c.window)),
             "sliding layers' rope base": dict(rope_base_swa=1e6),
             "post-norms": dict(post_norms=False), "embedding scale": dict(embd_scale=0.0)}
    if name == "g4-v":  # (g4's full layers have no attn_v: they need v_norm's rule)
        wrong |= {"v norm": dict(v_norm=False), "sliding layers' rotated dims": dict(rope_dims_swa=64)}
    if name == "g4-moe":
        wrong |= {"the MLP beside the experts": dict(moe_mlp=False)}  # (renormalising: the post-norm cancels it)
    if name == "g4-e":
        wrong |= {"per-layer embeddings": dict(ple_dim=0)}
    # (g4-moe: a routing flip just past the 1e-2 tie bound moves later positions by up to ~0.7 at
    # other levels (the scalar one); its parity is test_teacher_forced_top1_matches_llama_cpp's)
    m, ours = features_matter(monkeypatch, path, N_CTX, run, wrong, TIE.get(name, 1e-3),
                              match=None if name == "g4-moe" else 0.5)
    ids, c = run[0], m.config
    ones = {"g4": [("layer_output_scale", 1)], "g4-moe": [("down_exps_scale", c.n_expert), ("router_in_scale", c.dim)],
            "g4-e": [("per_layer_post_norm", c.dim)]}
    for slot, n in ones.get(name, []):  # a scale vector of the file left out (all ones)
        keep = np.ones(n, np.float32)
        for i in range(c.n_layer):
            m.engine.set_vec(slot, i, keep)
        m.reset()
        assert float(np.abs(m.forward(ids, all_logits=True) - ours).max()) > 0.5, slot
        m = lowbit.load(path, n_ctx=N_CTX, threads=2)


@pytest.mark.parametrize("name", ["g4", "g4-moe", "g4-e"])
def test_chunks_and_threads_are_bitwise(paths, name):
    """A token's logits do not depend on the chunking of its prompt or the thread count (I8), with
    sliding windows shorter than the prompt (g4-moe: and the experts' windows and GEMM tier; g4-e:
    each token's per-layer inputs, the layers reading others' KV)."""
    m = lowbit.load(paths[name], n_ctx=256, threads=2)
    ids = m.tokenize("In a hole in the ground there lived a hobbit. Not a nasty, dirty, wet hole, filled with "
                     "the ends of worms and an oozy smell, nor yet a dry, bare, sandy hole with nothing in it " * 2)
    assert len(ids) > 64
    whole = m.logits(ids, chunk=len(ids))
    assert np.array_equal(whole, m.logits(ids, chunk=1)) and np.array_equal(whole, m.logits(ids, chunk=7))
    one = lowbit.load(paths[name], n_ctx=256, threads=1)
    assert np.array_equal(whole, one.logits(ids, chunk=len(ids)))


@pytest.mark.parametrize("name", ["g4-v", "g4-e"])
def test_batched_slots_are_bitwise(paths, name):
    """Two sequences in one batch give each its own logits bit for bit (the per-layer cache rows of
    two slots do not overlap; g4-e: nor do its shared layers' reads)."""
    m = lowbit.load(paths[name], n_ctx=128, threads=2, n_slots=2)
    a = m.tokenize("The quick brown fox jumps over the lazy dog.")
    b = m.tokenize("A journey of a thousand miles begins with a single step, they say.")
    la, lb = m.forward_batch([(0, a), (1, b)], all_logits=True)
    assert np.array_equal(la, m.logits(a, chunk=len(a))) and np.array_equal(lb, m.logits(b, chunk=len(b)))


@pytest.mark.parametrize("name", ["g4", "g4-e"])
def test_kv_copy_round_trip(paths, name):
    """The prefix cache's save / load of a slot's rows (engine.kv_copy) over layers of two widths
    (g4-e: the layers with their own cache only): loaded into another slot, the next token's logits
    are bitwise those of the original slot."""
    m = lowbit.load(paths[name], n_ctx=128, threads=2, n_slots=2)
    ids = m.tokenize("Once upon a time there was a little engine that could pull a long train up a hill.")
    n = len(ids) - 1
    m.forward_batch([(0, ids[:n])])
    buf = np.empty(m.engine.kv_bytes(n), np.uint8)
    m.engine.kv_copy(0, 0, n, buf, True)
    m.engine.kv_copy(1, 0, n, buf, False)
    m.slot_pos[1] = n
    m.slot_tokens[1] = list(ids[:n])
    la, lb = m.forward_batch([(0, ids[n:]), (1, ids[n:])])
    assert np.array_equal(la, lb)


@pytest.mark.parametrize("kv", ["q8_0"])
def test_quantized_cache_matches_llama_cpp_flash_attention(paths, kv):
    """A q8_0 cache (each layer's rows at its own width, Hadamard-rotated by its own width as
    llama.cpp's iSWA caches): top-1 >= 95% at margins >= 0.1 (test_kv_quant's bound)."""
    from test_gpt_oss import PROMPT
    from test_kv_quant import peer_llm
    for name in ("g4", "g4-v", "g4-e"):
        llm = peer_llm(paths[name], kv, n_ctx=160, n_threads=1)
        ids, ref = llama_greedy(llm, llm.tokenize(PROMPT, add_bos=False), 100)
        m = lowbit.load(paths[name], n_ctx=160, threads=2, kv=kv)
        ours = m.forward(ids, all_logits=True)
        top2 = np.sort(ref, 1)[:, -2:]
        clear = top2[:, 1] - top2[:, 0] >= 0.1
        agree = int((ours.argmax(1) == ref.argmax(1))[clear].sum())
        print(f"\n{name} {kv}: top-1 {agree}/{int(clear.sum())}, max |logit diff| {np.abs(ours - ref).max():.3f}")
        assert clear.sum() >= 40 and agree >= 0.95 * clear.sum()


def test_unsupported_variants_are_refused_by_name(paths, monkeypatch):
    """Shared KV layers that do not follow a sliding and a full layer, bad head counts or rope dims:
    one GGUFError naming the problem, never a wrong answer."""
    for meta, msg in ((dict(**{"gemma4.attention.shared_kv_layers": 2}), "a sliding and a full layer"),
                      (dict(**{"gemma4.embedding_length_per_layer_input": -1}), "per_layer_input"),
                      (dict(**{"gemma4.attention.head_count_kv": [3, 3, 1, 2, 2, 1]}), "does not divide"),
                      (dict(**{"gemma4.rope.dimension_count_swa": 96}), "dimension_count_swa"),
                      (dict(**{"gemma4.attention.sliding_window_pattern": 3}), "a bool per layer")):
        with pytest.raises(GGUFError, match=msg):
            load_edited(monkeypatch, paths["g4"], **meta)


def test_synth_cli_writes_gemma4(tmp_path, capsys):
    from lowbit.cli import main
    out = tmp_path / "g.gguf"
    assert main(["synth", "gemma4", str(out), "--layers", "3", "--dim", "128", "--heads", "2", "--kv-heads", "2",
                 "--kv-heads-full", "1", "--head-dim", "32", "--head-dim-full", "64", "--ffn", "256",
                 "--window", "16", "--swa-pattern", "3"]) == 0
    m = lowbit.load(str(out), n_ctx=32)
    c = m.config
    assert c.layer_kv == (2, 2, 1) and c.layer_hd == (32, 32, 64) and c.window == (16, 16, 0)
    assert "blk.2.attn_v.weight" not in m.file.tensors and "blk.1.attn_v.weight" in m.file.tensors
    assert m.forward([1, 2, 3]).shape == (1, c.vocab)
    assert main(["info", "-m", str(out)]) == 0
    assert "2 heads, by layer 2 of 2 KV heads of 32 or 1 of 1 KV heads of 64" in capsys.readouterr().out
    assert main(["synth", "gemma4", str(tmp_path / "bad.gguf"), "--rope-dims-swa", "33"]) == 2
    assert main(["synth", "gemma4", str(out), "--layers", "2", "--experts", "4", "--top-k", "2", "--expert-ffn", "64",
                 "--swa-pattern", "2"]) == 0
    c = lowbit.load(str(out), n_ctx=32).config
    assert (c.n_expert, c.n_expert_used, c.expert_ffn, c.moe_mlp) == (4, 2, 64, True)
    assert main(["synth", "gemma4", str(tmp_path / "bad.gguf"), "--experts", "2", "--top-k", "3"]) == 2
    assert main(["synth", "gemma4", str(out), "--ple-dim", "32", "--shared-kv", "3", "--double-wide"]) == 0
    c = lowbit.load(str(out), n_ctx=32).config
    assert (c.ple_dim, c.kv_source, c.layer_ffn) == (32, (-1, -1, -1, 1, 1, 2), (512,) * 3 + (1024,) * 3)
    assert main(["synth", "gemma4", str(tmp_path / "bad.gguf"), "--shared-kv", "2"]) == 2
    assert main(["info", "-m", str(out)]) == 0
    assert "per-layer embeddings of 32, layers 3-5 read layers [1, 2]' KV" in capsys.readouterr().out
