"""Gemma 3 (gemma3) and GLM-4.5 (glm4moe) on small synthetic files, against llama.cpp; and the
GeGLU epilogue (csrc/kernels.h GLU_GEGLU) against ggml's own gelu table.

gemma3 (lowbit.synth.synth_dense(arch="gemma3")): 6 layers, width 256, 4 query heads of 128 over
2 KV heads (so q is wider than the model: key_length, not width / heads), GeGLU, q/k norms, the
post-attention and post-FFN norms, embeddings times sqrt(256), layers 0-4 sliding over 8 positions
with rope base 10000 and layer 5 global with base 1e6 (llama.cpp's default pattern 6), the head tied
to token_embd and a final logit soft-cap of 4 (to make it count).

glm4moe (lowbit.synth.synth_moe(arch="glm4moe")): 4 layers run (layer 0 dense, 1-3 routed), then one
MTP layer that llama.cpp loads and does not run; 16 experts, top-4 by sigmoid + exp_probs_b, the
weights renormalised and times 2.5, one shared expert, q/k/v biases, rope over 32 of 64 dims.

Parity as tests/test_gpt_oss.py: teacher-forced over llama.cpp's own greedy continuation, top-1
agreement >= 99% where llama.cpp's top-2 margin is >= 0.1 (glm4moe: leaving out positions whose
routing is a near-tie in lowbit's router), perplexity within 0.5% of llama.cpp's; each feature
switched off in lowbit moves the logits by whole units (the comparison can fail).
"""
import ctypes
import dataclasses
import os

import numpy as np
import pytest
from conftest import LEVELS

import lowbit
from llama_ref import llama_greedy
from lowbit._native import lib
from lowbit.synth import synth_dense, synth_moe

PROMPT = b"Once upon a time, in a small village by the sea, the quick brown fox"
GEN = 40
ROUTE_TIE = 1e-3
GEMMA = dict(arch="gemma3", layers=6, dim=256, ffn=512, heads=4, kv_heads=2, head_dim=128, window=8,
             rope_base=1e6, softcap=4.0, embd_type="F16", wtype="Q8_0", seed=5)
GLM = dict(arch="glm4moe", layers=4, dim=256, heads=4, kv_heads=2, head_dim=64, experts=16, top_k=4,
           expert_ffn=256, dense_ffn=512, leading_dense=1, shared_experts=1, nextn=1, rope_dims=32,
           embd_type="F16", wtype="Q8_0", expert_type="Q4_K", seed=7)
ISA = {n: i for i, n in enumerate(lib.isa_names())}


@pytest.fixture(scope="module")
def gemma_path(tmp_path_factory):
    return synth_dense(tmp_path_factory.mktemp("gemma") / "gemma3.gguf", **GEMMA)


@pytest.fixture(scope="module")
def glm_path(tmp_path_factory):
    return synth_moe(tmp_path_factory.mktemp("glm") / "glm4moe.gguf", **GLM)


def peer(path):
    from lowbit import peer as p
    # one llama.cpp thread: its per-node thread barrier stalls for seconds on a busy machine
    return p.Llama(str(path), n_ctx=128, logits_all=True, verbose=False, n_threads=1)


@pytest.fixture(scope="module")
def gemma_llm(gemma_path):
    return peer(gemma_path)


@pytest.fixture(scope="module")
def glm_llm(glm_path):
    return peer(glm_path)


# ---- configuration ---------------------------------------------------------------------------

def test_gemma3_config(gemma_path):
    c = lowbit.load(gemma_path, n_ctx=64).config
    assert c.arch == "gemma3" and c.rope_neox and c.qk_norm and c.tied_output and c.post_norms
    assert c.ffn_act == "gelu" and c.head_dim == 128 and c.window == (8, 8, 8, 8, 8, 0)
    assert c.embd_scale == float(np.sqrt(np.float32(256)))
    assert c.attn_scale == float(np.float32(1) / np.sqrt(np.float32(128)))  # key_length, not 256 / 4
    assert c.rope_base == 1e6 and c.rope_base_swa == 10000.0 and c.logit_softcap == 4.0


def test_glm4moe_config(glm_path):
    c = lowbit.load(glm_path, n_ctx=64).config
    assert c.arch == "glm4moe" and c.n_layer == 4 and c.n_nextn == 1  # block_count 5: the MTP layer not run
    assert (c.n_expert, c.n_expert_used, c.expert_ffn, c.shexp_ffn, c.ffn) == (16, 4, 256, 256, 512)
    assert c.n_dense_lead == 1 and c.expert_gating == "sigmoid" and c.exp_probs_b and c.expert_norm
    assert c.expert_scale == 2.5 and not c.shexp_gated and c.qkv_bias and not c.qk_norm
    assert c.rope_dims == 32 and c.head_dim == 64 and c.ffn_norm == "post_attention_norm"


# ---- parity with llama.cpp -------------------------------------------------------------------

def compare(m, llm):
    ids, ref = llama_greedy(llm, llm.tokenize(PROMPT, add_bos=False), GEN)
    m.reset()
    ours = m.forward(ids, all_logits=True)
    tie = np.zeros(len(ids), bool)
    if m.config.n_expert:
        for layer in range(m.config.n_dense_lead, m.config.n_layer):
            tie |= np.array(m.engine.last_route_margins(layer)) < ROUTE_TIE
    top2 = np.sort(ref, 1)[:, -2:]
    clear = (top2[:, 1] - top2[:, 0] >= 0.1) & ~tie
    agree = int((ours.argmax(1) == ref.argmax(1))[clear].sum())
    return ids, ours, ref, tie, int(clear.sum()), agree


@pytest.mark.parametrize("which", ["gemma3", "glm4moe"])
def test_matches_llama_cpp(which, request):
    path = request.getfixturevalue("gemma_path" if which == "gemma3" else "glm_path")
    llm = request.getfixturevalue("gemma_llm" if which == "gemma3" else "glm_llm")
    m = lowbit.load(path, n_ctx=128, threads=2)
    ids, ours, ref, tie, counted, agree = compare(m, llm)
    assert tie.sum() <= 0.1 * len(ids), f"{int(tie.sum())} routing near-ties in {len(ids)} positions"
    assert counted >= 20, f"only {counted} positions with a margin >= 0.1"
    assert agree >= 0.99 * counted, f"top-1 agrees at {agree}/{counted} positions with margin >= 0.1"
    diff = np.abs(ours - ref)[~tie]
    print(f"\n{which}: top-1 {agree}/{counted}; max |logit diff| {diff.max():.4f}, mean {diff.mean():.5f}, "
          f"spread {float((ref.max(1) - ref.min(1)).mean()):.2f}")
    picked = ref[np.arange(len(ids)), ours.argmax(1)]
    assert float((ref.max(1) - picked)[~tie].max()) <= 0.1
    if which == "glm4moe":  # routing is not degenerate: most experts get tokens at every routed layer
        for layer in range(1, m.config.n_layer):
            assert len(set(m.engine.last_routes(layer))) >= 12, layer
    else:  # the soft-cap is on: no logit reaches it
        assert np.abs(ours).max() < 4.0


@pytest.mark.parametrize("which", ["gemma3", "glm4moe"])
def test_perplexity_matches_llama_cpp(which, request):
    """llama.cpp's method (the second half of each 128-token chunk scored), lowbit.perplexity's
    code for lowbit, the same arithmetic on llama.cpp's logits."""
    from lowbit.perplexity import chunk_nll, perplexity
    path = request.getfixturevalue("gemma_path" if which == "gemma3" else "glm_path")
    llm = request.getfixturevalue("gemma_llm" if which == "gemma3" else "glm_llm")
    m = lowbit.load(path, n_ctx=128, threads=2)
    text = open(os.path.join(os.path.dirname(lowbit.__file__), "data", "passage.txt"), encoding="utf-8").read()
    ctx = 128
    ours, n = perplexity(m, text, ctx=ctx, progress=False)
    toks = llm.tokenize(text.encode(), add_bos=False)
    nll, count = 0.0, 0
    for c in range(len(toks) // ctx):
        chunk = toks[c * ctx:(c + 1) * ctx]
        llm.reset()
        llm.eval(chunk)
        logits = np.array(llm.scores[:ctx])
        nll += chunk_nll(logits[ctx // 2:ctx - 1], np.asarray(chunk[ctx // 2 + 1:])).sum()
        count += ctx - 1 - ctx // 2
    theirs = float(np.exp(nll / count))
    assert count == n and n >= 100
    print(f"\n{which} perplexity lowbit {ours:.4f} llama.cpp {theirs:.4f} ({n} tokens)")
    assert abs(ours - theirs) <= 0.005 * theirs


def _load_with(monkeypatch, path, **changes):
    from lowbit.model import ModelConfig
    real = ModelConfig.from_gguf
    monkeypatch.setattr(ModelConfig, "from_gguf", classmethod(lambda cls, f: dataclasses.replace(real(f), **changes)))
    try:
        return lowbit.load(path, n_ctx=128, threads=2)
    finally:
        monkeypatch.setattr(ModelConfig, "from_gguf", real)


GEMMA_OFF = {"embd_scale": dict(embd_scale=0.0), "attn_scale": dict(attn_scale=float(1 / np.sqrt(np.float32(64)))),
             "rope_base_swa": dict(rope_base_swa=0.0), "softcap": dict(logit_softcap=0.0),
             "window": dict(window=(0,) * 6), "silu": dict(ffn_act="silu")}
GLM_OFF = {"exp_probs_b": dict(exp_probs_b=False), "softmax": dict(expert_gating="softmax"),
           "no_norm": dict(expert_norm=False), "full_rope": dict(rope_dims=64),
           "qkv_bias": dict(qkv_bias=False)}


@pytest.mark.parametrize("which", ["gemma3", "glm4moe"])
def test_each_feature_matters(which, request, monkeypatch):
    """The comparison can fail: the same file with one feature switched off or wrong in lowbit no
    longer matches llama.cpp (attn_scale: 1/sqrt(width / heads), the 27B's rule, instead of
    1/sqrt(key_length); the post-FFN norm: all-ones weights instead of the file's)."""
    path = request.getfixturevalue("gemma_path" if which == "gemma3" else "glm_path")
    llm = request.getfixturevalue("gemma_llm" if which == "gemma3" else "glm_llm")
    for what, change in (GEMMA_OFF if which == "gemma3" else GLM_OFF).items():
        m = _load_with(monkeypatch, path, **change)
        ids, ours, ref, tie, counted, agree = compare(m, llm)
        diff = float(np.abs(ours - ref)[~tie].max())
        assert diff > 0.5, f"{which}: {what} off: max |logit diff| only {diff:.3f}"
    if which == "gemma3":  # the post norms' weights: all ones instead of the file's
        m = lowbit.load(path, n_ctx=128, threads=2)
        ones = np.ones(m.config.dim, np.float32)
        for i in range(m.config.n_layer):
            m.engine.set_vec("ffn_post_norm", i, ones)
        ids, ours, ref, tie, counted, agree = compare(m, llm)
        assert float(np.abs(ours - ref).max()) > 0.5


@pytest.mark.parametrize("which", ["gemma3", "glm4moe"])
def test_chunks_and_threads_bitwise(which, request):
    """A token's logits do not depend on how the sequence was chunked (1 token at a time, 7, all
    at once), on the threads, or on a rewind: sliding windows, the sigmoid router, the dense lead."""
    path = request.getfixturevalue("gemma_path" if which == "gemma3" else "glm_path")
    m2 = lowbit.load(path, n_ctx=64, threads=2)
    ids = m2.tokenize("In a hole in the ground there lived a hobbit, not a nasty dirty wet hole")[:24]
    whole = m2.logits(ids, chunk=24)
    assert np.array_equal(m2.logits(ids, chunk=1), whole)
    assert np.array_equal(m2.logits(ids, chunk=7), whole)
    m1 = lowbit.load(path, n_ctx=64, threads=1)
    assert np.array_equal(m1.logits(ids, chunk=24), whole)
    m2.rewind(15)
    assert np.array_equal(m2.forward(ids[15:], all_logits=True), whole[15:])


# ---- synth and bad input ---------------------------------------------------------------------

def test_synth_cli_writes_gemma3(tmp_path):
    from lowbit.cli import main
    out = tmp_path / "g.gguf"
    assert main(["synth", "dense", str(out), "--arch", "gemma3", "--layers", "3", "--dim", "128", "--heads", "2",
                 "--kv-heads", "1", "--head-dim", "64", "--ffn", "256", "--window", "4", "--swa-pattern", "3",
                 "--rope-base-swa", "5000", "--softcap", "30"]) == 0
    f = lowbit.gguf.open(str(out))
    assert f.metadata["general.architecture"] == "gemma3" and "output.weight" not in f.tensors
    assert f.tensors["blk.2.post_ffw_norm.weight"].shape == (128,)
    m = lowbit.load(str(out), n_ctx=32)
    c = m.config
    assert c.window == (4, 4, 0) and c.rope_base_swa == 5000.0 and c.logit_softcap == 30.0
    assert m.forward([1, 2, 3]).shape == (1, c.vocab)


def test_synth_cli_writes_glm4moe(tmp_path):
    from lowbit.cli import main
    out = tmp_path / "m.gguf"
    assert main(["synth", "moe", str(out), "--arch", "glm4moe", "--layers", "3", "--dim", "128", "--heads", "2",
                 "--kv-heads", "1", "--head-dim", "64", "--experts", "4", "--top-k", "2", "--ffn", "64",
                 "--dense-ffn", "256", "--leading-dense", "2", "--nextn", "1", "--rope-dims", "16",
                 "--qk-norm", "--expert-type", "Q8_0"]) == 0
    f = lowbit.gguf.open(str(out))
    assert f.metadata["glm4moe.block_count"] == 4 and "blk.3.nextn.eh_proj.weight" in f.tensors
    assert f.tensors["blk.1.ffn_gate.weight"].shape == (256, 128) and "blk.2.exp_probs_b.bias" in f.tensors
    m = lowbit.load(str(out), n_ctx=32)
    c = m.config
    assert (c.n_layer, c.n_dense_lead, c.rope_dims, c.qk_norm) == (3, 2, 16, True)
    assert m.forward([1, 2, 3]).shape == (1, c.vocab)


def test_bad_metadata_names_the_key(tmp_path):
    """A bad value raises GGUFError naming the key (the CLI prints it as one line)."""
    from lowbit.gguf import GGUFError
    from lowbit.model import ModelConfig
    glm = synth_moe(tmp_path / "glm.gguf", arch="glm4moe", layers=2, dim=64, heads=2, kv_heads=1, experts=4,
                    top_k=2, expert_ffn=32, dense_ffn=64, nextn=0, expert_type="Q8_0")
    gem = synth_dense(tmp_path / "gem.gguf", arch="gemma3", layers=2, dim=64, heads=2, kv_heads=1, ffn=64)
    for path, key, val, msg in ((glm, "glm4moe.leading_dense_block_count", 5, "leading_dense_block_count = 5"),
                                (glm, "glm4moe.expert_gating_func", 3, "expert_gating_func = 3"),
                                (glm, "glm4moe.nextn_predict_layers", 2, "nextn_predict_layers = 2"),
                                (glm, "glm4moe.expert_shared_count", None, "expert_shared_count is missing"),
                                (gem, "gemma3.rope.freq_base_swa", -1.0, "freq_base_swa"),
                                (gem, "gemma3.final_logit_softcapping", "x", "final_logit_softcapping")):
        f = lowbit.gguf.open(path)
        if val is None:
            del f.metadata[key]
        else:
            f.metadata[key] = val
        with pytest.raises(GGUFError, match=msg):
            ModelConfig.from_gguf(f)


# ---- the GeGLU epilogue ----------------------------------------------------------------------

GEGLU = 3


def run_geglu(g, u, level):
    out = np.empty_like(g)
    lib.glu(np.ascontiguousarray(g), np.ascontiguousarray(u), out, GEGLU, ISA[level])
    return out


def ggml_gelu_table():
    """ggml's ggml_table_gelu_f16 (filled by ggml_cpu_init), as float32."""
    from lowbit.ggml_oracle import ggml
    arr = (ctypes.c_uint16 * 65536).in_dll(ggml().cpu, "ggml_table_gelu_f16")
    return np.frombuffer(arr, np.uint16).copy().view(np.float16).astype(np.float32)


def geglu_inputs(rng):
    every_half = np.arange(65536, dtype=np.uint16).view(np.float16).astype(np.float32)
    bits = rng.integers(0, 2 ** 32, 20000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    edges = np.array([-10.0, np.nextafter(np.float32(-10), np.float32(0)), 10.0,
                      np.nextafter(np.float32(10), np.float32(0)), -9.999, 9.999, 0.0, -0.0, np.inf, -np.inf,
                      np.nan, 65504.0, 65520.0, -65520.0, 1e-8, -1e-8], np.float32)
    return np.concatenate([edges, every_half, (rng.standard_normal(30000) * 3).astype(np.float32),
                           np.linspace(-12, 12, 20001, dtype=np.float32), bits]).astype(np.float32)


def test_geglu_equals_ggml_table_and_loop(rng):
    """The scalar reference is ggml_vec_geglu_f32 (GGML_GELU_FP16): x <= -10: 0; x >= 10: x * g;
    else table[fp16(x)] * g with ggml's own table, read from libggml-cpu (and fp16() = numpy's
    round-to-nearest-even)."""
    table = ggml_gelu_table()
    g = geglu_inputs(rng)
    u = rng.standard_normal(g.size).astype(np.float32)
    ours = run_geglu(g, u, "scalar")
    with np.errstate(all="ignore"):
        h = g.astype(np.float16).view(np.uint16)
        want = np.where(g <= -10, np.float32(0), np.where(g >= 10, g * u, table[h] * u)).astype(np.float32)
    fin = ~np.isnan(want)
    assert np.array_equal(np.isnan(ours), ~fin)
    bad = np.flatnonzero(ours[fin].view(np.uint32) != want[fin].view(np.uint32))
    assert bad.size == 0, f"{bad.size} differ; first g={g[fin][bad[:3]]}: {ours[fin][bad[:3]]} vs {want[fin][bad[:3]]}"


def test_geglu_close_to_float64(rng):
    """Sanity against the math: gelu-tanh in float64 of the half-rounded input. The result is a
    half (2^-11 relative) computed in float, whose 1 + tanh cancels for x < -2: error <= 2^-9 of
    the larger of |exact| and 2e-4."""
    g = (rng.standard_normal(50000) * 3).astype(np.float32)
    g = g[np.abs(g) < 9.9]
    u = np.ones_like(g)
    x = g.astype(np.float16).astype(np.float64)
    exact = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * x * (1 + 0.044715 * x * x)))
    ours = run_geglu(g, u, "scalar").astype(np.float64)
    assert np.all(np.abs(ours - exact) <= 2.0 ** -9 * np.maximum(np.abs(exact), 2e-4))


@pytest.mark.parametrize("level", LEVELS)
def test_geglu_every_level_equals_scalar_bitwise(rng, level):
    g = geglu_inputs(rng)
    u = rng.standard_normal(g.size).astype(np.float32)
    u[:16] = 1.0
    ref = run_geglu(g, u, "scalar")
    ours = run_geglu(g, u, level)
    assert np.array_equal(ours.view(np.uint32), ref.view(np.uint32)), level
    for n in list(range(0, 40)) + [1535, 1537]:  # every tail length; nothing written past n
        out = np.full(n + 16, 12345.0, np.float32)
        lib.glu(g[5:5 + n].copy(), u[5:5 + n].copy(), out[:n], GEGLU, ISA[level])
        assert np.array_equal(out[:n].view(np.uint32), ref[5:5 + n].view(np.uint32)), (level, n)
        assert np.all(out[n:] == 12345.0)
