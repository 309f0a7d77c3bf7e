"""DeepSeek V2/V3 (llama.cpp's deepseek2: multi-head latent attention, csrc/mla.cpp) on small
synthetic files, against llama.cpp.

Two models (lowbit.synth.synth_deepseek2), 3 layers each (layer 0 a dense SwiGLU FFN, 1-2 routed
experts plus 2 shared experts), width 256, 4 heads, kv_lora_rank 64, qk_nope 32, rope 16, v_head 32,
YaRN factor 40 with V2-Lite's yarn_log_multiplier (so the softmax scale carries DeepSeek's mscale^2):
  "v2":  a plain attn_q (no q_lora, as V2-Lite), softmax gating over 8 experts, top-2;
  "v3":  q_lora 64 (attn_q_a, attn_q_a_norm, attn_q_b), sigmoid gating with exp_probs_b, the top-K
         renormalised and times 2.5, group-limited routing (4 groups of 4 experts, 2 used), top-4.
Parity as tests/test_gemma_glm*.py: teacher-forced over llama.cpp's own greedy continuation,
top-1 >= 99% where llama.cpp's top-2 margin is >= 0.1 (leaving out lowbit's routing near-ties),
perplexity within 0.5%; each feature switched off or wrong in lowbit moves the logits by whole units
(the comparison can fail). Then the compressed cache: its bytes, chunk / thread / rewind
invariance (bitwise), the prefix cache's kv_copy; the MLA kernel at every level; synth; bad input.
"""
import dataclasses
import os

import numpy as np
import pytest

import lowbit
from conftest import LEVELS
from gemma_glm_models import PROMPT, compare, peer
from llama_ref import llama_greedy, llama_perplexity
from lowbit._native import lib
from lowbit.synth import synth_deepseek2

ISA = {n: i for i, n in enumerate(lib.isa_names())}
BASE = dict(layers=3, dim=256, heads=4, kv_lora_rank=64, qk_nope=32, rope_dims=16, v_head_dim=32, experts=8,
            top_k=2, expert_ffn=256, dense_ffn=512, leading_dense=1, shared_experts=2, embd_type="F16",
            wtype="Q8_0", expert_type="Q4_K")
MODELS = {"v2": dict(BASE, seed=21),
          "v3": dict(BASE, q_lora_rank=64, gating="sigmoid", expert_norm=True, expert_scale=2.5, experts=16,
                     top_k=4, expert_groups=4, expert_groups_used=2, seed=22)}
GEN = 40


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    """Per variant: (path, llama.cpp peer, its greedy run of PROMPT), made once."""
    out, d = {}, tmp_path_factory.mktemp("deepseek2")

    def get(which):
        if which not in out:
            path = synth_deepseek2(d / f"{which}.gguf", **MODELS[which])
            llm = peer(path)
            out[which] = (path, llm, llama_greedy(llm, llm.tokenize(PROMPT, add_bos=False), GEN))
        return out[which]
    return get


def load(path, **kw):
    return lowbit.load(path, n_ctx=kw.pop("n_ctx", 128), threads=kw.pop("threads", 2), **kw)


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
    c3 = load(ds("v3")[0]).config
    assert c3.q_lora_rank == 64 and c3.expert_gating == "sigmoid" and c3.exp_probs_b and c3.expert_norm
    assert (c3.expert_scale, c3.expert_groups, c3.expert_groups_used) == (2.5, 4, 2)


# ---- parity with llama.cpp -------------------------------------------------------------------

@pytest.mark.parametrize("which", list(MODELS))
def test_matches_llama_cpp(which, ds):
    path, llm, run = ds(which)
    m = load(path)
    ids, ours, ref, tie, counted, agree = compare(m, run)
    assert tie.sum() <= 0.15 * len(ids), f"{int(tie.sum())} routing near-ties in {len(ids)} positions"
    assert counted >= 20, f"only {counted} positions with a margin >= 0.1"
    assert agree >= 0.99 * counted, f"top-1 agrees at {agree}/{counted} positions with margin >= 0.1"
    diff = np.abs(ours - ref)[~tie]
    print(f"\ndeepseek2 {which}: top-1 {agree}/{counted}; max |logit diff| {diff.max():.4f}, "
          f"mean {diff.mean():.5f}, spread {float((ref.max(1) - ref.min(1)).mean()):.2f}")
    for layer in range(m.config.n_dense_lead, m.config.n_layer):  # routing is not degenerate
        assert len(set(m.engine.last_routes(layer))) >= m.config.n_expert // 2, layer


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


def _load_with(monkeypatch, path, **changes):
    from lowbit.model import ModelConfig
    real = ModelConfig.from_gguf
    monkeypatch.setattr(ModelConfig, "from_gguf", classmethod(lambda cls, f: dataclasses.replace(real(f), **changes)))
    try:
        return load(path)
    finally:
        monkeypatch.setattr(ModelConfig, "from_gguf", real)


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
        m = _load_with(monkeypatch, path, **change)
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


@pytest.mark.parametrize("which", list(MODELS))
def test_chunks_threads_rewind_bitwise(which, ds):
    """A token's logits do not depend on the chunking (1, 7, all at once), the threads (the MLA
    kernel's head groups follow them) or a rewind."""
    path = ds(which)[0]
    m2 = load(path, n_ctx=64)
    ids = m2.tokenize("In a hole in the ground there lived a hobbit, not a nasty dirty wet hole")[:24]
    whole = m2.logits(ids, chunk=24)
    assert np.array_equal(m2.logits(ids, chunk=1), whole)
    assert np.array_equal(m2.logits(ids, chunk=7), whole)
    m1 = load(path, n_ctx=64, threads=1)
    assert np.array_equal(m1.logits(ids, chunk=24), whole)
    m2.rewind(15)
    assert np.array_equal(m2.forward(ids[15:], all_logits=True), whole[15:])


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


# ---- the MLA kernel --------------------------------------------------------------------------

def _mla_inputs(rng, nh=16, dk=80, kd=88, n=300):
    q = (rng.standard_normal((nh, dk)) * 0.5).astype(np.float32)
    C = (rng.standard_normal((n, kd)) * 0.5).astype(np.float16).view(np.uint16)
    return q, C


@pytest.mark.parametrize("level", LEVELS)
def test_mla_kernel_matches_reference(rng, level):
    """Every level against the scalar reference (the spec) and float64 within the half rounding
    of the probabilities (tests/test_attn.py's bound), for every key count 1..40 and a long one
    (the tails of the key groups and blocks); head h's output does not depend on the other heads
    of the call (I3: the engine groups heads by threads)."""
    q, C = _mla_inputs(rng)
    scale = 0.17
    vmax = float(np.abs(C[:, :64].view(np.float16)).max())
    for n in list(range(1, 41)) + [300]:
        ref, name0 = lib.attend_mla(q, np.ascontiguousarray(C[:n]), 64, scale, ISA["scalar"])
        ours, name = lib.attend_mla(q, np.ascontiguousarray(C[:n]), 64, scale, ISA[level])
        assert np.abs(ours - ref).max() <= 2.0 ** -11 * vmax + 1e-6, (level, n, name)
        Cf = C[:n].view(np.float16).astype(np.float64)
        qh = q.astype(np.float16).astype(np.float64)
        s = scale * qh @ Cf[:, :80].T
        p = np.exp(s - s.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        exact = p @ Cf[:, :64]
        assert np.abs(ours - exact).max() <= 2.0 ** -11 * vmax + 1e-6, (level, n)
        for h0, h1 in ((0, 1), (3, 7), (5, 16)):
            part, _ = lib.attend_mla(np.ascontiguousarray(q[h0:h1]), np.ascontiguousarray(C[:n]), 64, scale, ISA[level])
            assert np.array_equal(part, ours[h0:h1]), (level, n, h0, h1)


@pytest.mark.parametrize("level", LEVELS)
def test_mla_kernel_is_the_attention_kernel_per_head(rng, level):
    """With the value as wide as the key (dv = dk), each head's result is bitwise the engine's
    attention kernel (attend_f16) on that head with K = V = the latent rows, at the same level:
    the same rounding points and, per level, the same arithmetic."""
    q, C = _mla_inputs(rng, nh=5, dk=80, kd=80, n=77)
    out, _ = lib.attend_mla(q, C, 80, 0.3, ISA[level])
    for h in range(5):
        one, _ = lib.attend_f16(np.ascontiguousarray(q[h]), C, C, 0.3, ISA[level])
        assert np.array_equal(one[0], out[h]), (level, h)


def test_mla_kernel_refuses_bad_shapes():
    q = np.zeros((2, 80), np.float32)
    with pytest.raises(ValueError, match="attend_mla"):
        lib.attend_mla(q, np.zeros((4, 72), np.uint16), 64, 1.0)   # row narrower than dk
    with pytest.raises(ValueError, match="attend_mla"):
        lib.attend_mla(q, np.zeros((4, 80), np.uint16), 96, 1.0)   # dv > dk


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
