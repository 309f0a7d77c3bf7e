"""The hybrid Qwen families (llama.cpp's qwen35moe, qwen35, qwen3next) on small synthetic files.

Models come from lowbit.synth.synth_hybrid: gated delta-net layers (conv1d state, l2-normed q/k,
decay and beta gates, the delta rule per value head, gated RMS norm) beside gated full-attention
layers (q + gate, q/k norms, partial rope with IMROPE sections), routed experts plus a gated
shared expert (qwen35moe, qwen3next) or a dense FFN (qwen35). The q/k heads (2) are fewer than the
value heads (4), so the head mapping (tiled for qwen35*, interleaved for qwen3next) matters, and
the rope sections (2, 2, 2, 2) leave pairs 6, 7, 14, 15 of the 16 rotated pairs in the 4th section
(position 0 for text; with rope base 1e4 pair 6 turns by 1.5 rad over the test's positions), so the
section rule matters too.

Against llama.cpp (through lowbit.peer): teacher-forced over llama.cpp's own greedy
continuation, top-1 agreement >= 99% where llama.cpp's top-2 margin is >= 0.1 (leaving out MoE
routing near-ties), perplexity within 0.5%; each feature switched off breaks the match (the
comparison can fail). Against float64 numpy: one delta-net layer's whole model in F32. Chunking,
threads, batching and rewinds are bitwise.
"""
import dataclasses
import os

import numpy as np
import pytest

import lowbit
from llama_ref import hybrid_chunks_threads_batches_bitwise, llama_greedy, llama_perplexity, lookup_spec_is_plain_greedy
from lowbit.synth import synth_hybrid

PROMPT = b"Once upon a time, in a small village by the sea, the quick brown fox"
GEN = 40
ROUTE_TIE = 1e-3
SMALL = dict(layers=4, dim=256, heads=4, kv_heads=2, head_dim=64, rope_dims=32, sections=(2, 2, 2, 2), rope_base=1e4,
             full_attention_interval=2, ssm_conv=4, ssm_state=32, ssm_groups=2, ssm_heads=4, experts=8, top_k=2,
             expert_ffn=256, shared_ffn=256, ffn=512, embd_type="F16", wtype="Q8_0", expert_type="Q4_K", seed=5)
ARCHS = ("qwen35moe", "qwen35", "qwen3next")


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    d = tmp_path_factory.mktemp("q35")
    return {a: synth_hybrid(d / f"{a}.gguf", arch=a, **SMALL) for a in ARCHS}


_peers = {}


@pytest.fixture(scope="module", autouse=True)
def _close_peers():
    yield
    for llm in _peers.values():
        llm.close()
    _peers.clear()


def peer_for(path):
    from lowbit import peer
    if path not in _peers:  # one llama.cpp thread: its barrier stalls on a busy machine
        _peers[path] = peer.Llama(path, n_ctx=192, logits_all=True, verbose=False, n_threads=1)
    return _peers[path]


def test_config_reads_every_feature(paths):
    c = lowbit.load(paths["qwen35moe"], n_ctx=64).config
    assert c.hybrid and c.recurrent == (True, False, True, False) and c.attn_gate and c.qk_norm
    assert (c.ssm_conv, c.ssm_state, c.ssm_groups, c.ssm_heads) == (4, 32, 2, 4) and not c.ssm_kv_interleave
    assert c.rope_sections == (2, 2, 2, 2) and c.rope_dims == 32 and c.head_dim == 64 and c.rope_neox
    assert (c.n_expert, c.n_expert_used, c.expert_ffn, c.shexp_ffn) == (8, 2, 256, 256) and c.expert_norm
    assert c.ffn_norm == "post_attention_norm"
    d = lowbit.load(paths["qwen35"], n_ctx=64).config
    assert d.hybrid and d.n_expert == 0 and d.ffn == 512
    n = lowbit.load(paths["qwen3next"], n_ctx=64).config
    assert n.ssm_kv_interleave and n.rope_sections == () and n.shexp_ffn == 256


def compare(m, llm):
    ids, ref = llama_greedy(llm, llm.tokenize(PROMPT, add_bos=False), GEN)
    m.reset()
    ours = m.forward(ids, all_logits=True)
    tie = np.zeros(len(ids), bool)
    if m.config.n_expert:
        for layer in range(m.config.n_layer):
            tie |= np.array(m.engine.last_route_margins(layer)) < ROUTE_TIE
    top2 = np.sort(ref, 1)[:, -2:]
    clear = (top2[:, 1] - top2[:, 0] >= 0.1) & ~tie
    agree = int((ours.argmax(1) == ref.argmax(1))[clear].sum())
    return ids, ours, ref, tie, int(clear.sum()), agree


@pytest.mark.parametrize("arch", ARCHS)
def test_matches_llama_cpp(paths, arch):
    m = lowbit.load(paths[arch], n_ctx=192, threads=2)
    ids, ours, ref, tie, counted, agree = compare(m, peer_for(paths[arch]))
    assert tie.sum() <= 0.15 * len(ids), f"{int(tie.sum())} routing near-ties in {len(ids)} positions"
    assert counted >= 25, f"only {counted} positions with a margin >= 0.1"
    assert agree >= 0.99 * counted, f"{arch}: top-1 agrees at {agree}/{counted} positions with margin >= 0.1"
    diff = np.abs(ours - ref)[~tie]
    print(f"\n{arch}: top-1 {agree}/{counted}; max |logit diff| {diff.max():.4f}, mean {diff.mean():.5f}")
    picked = ref[np.arange(len(ids)), ours.argmax(1)]
    assert float((ref.max(1) - picked)[~tie].max()) <= 0.1


@pytest.mark.parametrize("arch", ("qwen35moe", "qwen35"))
def test_perplexity_matches_llama_cpp(paths, arch):
    """llama.cpp's method (the second half of each 128-token chunk scored), lowbit.perplexity for
    lowbit, the same arithmetic on llama.cpp's logits."""
    from lowbit.perplexity import perplexity
    m = lowbit.load(paths[arch], n_ctx=128, threads=2)
    llm = peer_for(paths[arch])
    text = open(os.path.join(os.path.dirname(lowbit.__file__), "data", "passage.txt"), encoding="utf-8").read()
    ctx = 128
    ours, n = perplexity(m, text, ctx=ctx, progress=False)
    theirs, count = llama_perplexity(llm, text, ctx)
    assert count == n and n >= 100
    print(f"\n{arch} perplexity lowbit {ours:.4f} llama.cpp {theirs:.4f} ({n} tokens)")
    assert abs(ours - theirs) <= 0.005 * theirs


@pytest.mark.parametrize("arch,what", [("qwen35moe", "interleave"), ("qwen35moe", "sections"),
                                       ("qwen35moe", "no_shared"), ("qwen3next", "interleave")])
def test_each_feature_matters(paths, arch, what, monkeypatch):
    """The same file with one feature wrong in lowbit (the q/k head mapping of the value heads, the
    rope sections, the shared expert) no longer matches llama.cpp."""
    from lowbit.model import ModelConfig
    real = ModelConfig.from_gguf
    change = {"interleave": lambda c: dict(ssm_kv_interleave=not c.ssm_kv_interleave),
              "sections": lambda c: dict(rope_sections=()),
              "no_shared": lambda c: dict(shexp_ffn=0)}[what]
    monkeypatch.setattr(ModelConfig, "from_gguf",
                        classmethod(lambda cls, f: dataclasses.replace(real(f), **change(real(f)))))
    m = lowbit.load(paths[arch], n_ctx=192, threads=2)
    monkeypatch.setattr(ModelConfig, "from_gguf", real)
    ids, ours, ref, tie, counted, agree = compare(m, peer_for(paths[arch]))
    diff = float(np.abs(ours - ref)[~tie].max())
    assert diff > 0.5, f"{arch} with {what} wrong: max |logit diff| only {diff:.3f}"


# ---- float64 oracle of the delta-net layer -------------------------------------------------

def _f32(f, name):
    t = f.tensors[name]
    assert t.format.name == "F32", name
    return np.asarray(t.raw).view(np.float32).reshape(t.shape).astype(np.float64)


def oracle_logits(path, ids, hidden=False):
    """float64 forward of a one-layer qwen35 model (that layer a gated delta-net, a dense FFN),
    written from llama.cpp's description with the recurrent state as S[i (key)][j (value)]:
    S <- S exp(g) + k (beta (v - S^T k))^T, o = S^T q / sqrt(S). hidden: return the normed last
    residual (llama.cpp's t_h_nextn, the MTP block's input; tests/test_mtp.py) instead of logits."""
    f = lowbit.gguf.open(path)
    md = f.metadata
    S, Hk, Hv, K = (md["qwen35.ssm.state_size"], md["qwen35.ssm.group_count"], md["qwen35.ssm.time_step_rank"],
                    md["qwen35.ssm.conv_kernel"])
    eps = md["qwen35.attention.layer_norm_rms_epsilon"]
    W = lambda n: _f32(f, n)  # noqa: E731

    def rms(x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w

    def silu(x):
        return x / (1 + np.exp(-x))
    x = W("token_embd.weight")[ids]
    T = len(ids)
    h = rms(x, W("blk.0.attn_norm.weight"))
    qkv = h @ W("blk.0.attn_qkv.weight").T
    z = h @ W("blk.0.attn_gate.weight").T
    beta = 1 / (1 + np.exp(-(h @ W("blk.0.ssm_beta.weight").T)))
    g = np.log1p(np.exp(h @ W("blk.0.ssm_alpha.weight").T + W("blk.0.ssm_dt.bias"))) * W("blk.0.ssm_a")
    cw = W("blk.0.ssm_conv1d.weight")                        # [channels, K]
    xp = np.concatenate([np.zeros((K - 1, qkv.shape[1])), qkv])
    conv = silu(np.stack([(xp[t:t + K] * cw.T).sum(0) for t in range(T)]))
    kd = Hk * S
    q = conv[:, :kd].reshape(T, Hk, S)
    k = conv[:, kd:2 * kd].reshape(T, Hk, S)
    v = conv[:, 2 * kd:].reshape(T, Hv, S)
    q = q / np.sqrt((q * q).sum(-1, keepdims=True) + eps)
    k = k / np.sqrt((k * k).sum(-1, keepdims=True) + eps)
    state = np.zeros((Hv, S, S))                             # [head][key i][value j]
    o = np.zeros((T, Hv, S))
    for t in range(T):
        for hv in range(Hv):
            kh = hv % Hk                                     # qwen35: value head h reads q/k head h % H_k
            st = state[hv] * np.exp(g[t, hv])
            st = st + np.outer(k[t, kh], beta[t, hv] * (v[t, hv] - st.T @ k[t, kh]))
            state[hv] = st
            o[t, hv] = st.T @ q[t, kh] / np.sqrt(S)
    o = rms(o, W("blk.0.ssm_norm.weight")) * silu(z.reshape(T, Hv, S))
    x = x + o.reshape(T, Hv * S) @ W("blk.0.ssm_out.weight").T
    h = rms(x, W("blk.0.post_attention_norm.weight"))
    ffn = (silu(h @ W("blk.0.ffn_gate.weight").T) * (h @ W("blk.0.ffn_up.weight").T)) @ W("blk.0.ffn_down.weight").T
    x = x + ffn
    return rms(x, W("output_norm.weight")) if hidden else rms(x, W("output_norm.weight")) @ W("output.weight").T


def test_deltanet_against_float64_oracle(tmp_path):
    p = synth_hybrid(tmp_path / "one.gguf", arch="qwen35", layers=1, dim=128, full_attention_interval=4, ffn=128,
                     ssm_state=16, ssm_groups=2, ssm_heads=4, wtype="F32", embd_type="F32", seed=11)
    m = lowbit.load(p, n_ctx=64, threads=2)
    ids = m.tokenize("In a hole in the ground there lived a hobbit, not a nasty dirty wet hole")[:24]
    ours = m.logits(ids, chunk=24)
    ref = oracle_logits(p, ids)
    err = np.abs(ours - ref).max(1) / np.abs(ref).max(1)
    worst = int(err.argmax())
    assert err.max() <= 1e-4, f"position {worst}: relative error {err[worst]:.2e}"
    # the oracle can fail: the tiled head mapping read interleaved is far off
    c = dataclasses.replace(lowbit.load(p, n_ctx=64).config, ssm_kv_interleave=True)
    from unittest import mock
    with mock.patch("lowbit.model.ModelConfig.from_gguf", classmethod(lambda cls, f: c)):
        wrong = lowbit.load(p, n_ctx=64, threads=2).logits(ids, chunk=24)
    assert (np.abs(wrong - ref).max(1) / np.abs(ref).max(1)).max() > 1e-2


# ---- chunks, threads, batches, rewinds -----------------------------------------------------

@pytest.mark.parametrize("arch", ("qwen35moe", "qwen3next"))
def test_chunks_threads_and_batches_bitwise(paths, arch):
    """A token's logits do not depend on how its prompt was chunked (1, 5, all), on the thread
    count, or on another slot sharing its batch: the delta-net runs the same token loop."""
    hybrid_chunks_threads_batches_bitwise(paths[arch])


def state(m, slot=0):
    buf = np.empty(m.engine.rstate_bytes(), np.uint8)
    m.engine.rstate_copy(slot, buf, True)
    return buf


def test_rewind_restores_state_exactly(paths):
    """Rewinding a hybrid slot (into its last multi-token call: the checkpoint; before it or after
    single-token steps: a replay from the start) gives bitwise the state of never having gone
    ahead, and the same logits after."""
    m = lowbit.load(paths["qwen35moe"], n_ctx=64, threads=2, n_slots=2)
    ids = m.tokenize("In a hole in the ground there lived a hobbit, not a nasty dirty wet hole, filled with the ends "
                     "of worms and an oozy smell, nor yet a dry, bare, sandy hole")[:32]
    assert len(ids) == 32

    def fresh(n):  # slot 1 runs ids[:n] from nothing
        m.rewind(0, slot=1)
        m.forward_batch([(1, ids[:n])])
        return state(m, 1)
    m.forward(ids[:20])
    m.forward(ids[20:30])
    m.rewind(25)                                            # inside the last call: checkpoint + replay
    assert m.engine.rstate_pos(0) == 25 and np.array_equal(state(m), fresh(25))
    after = m.forward(ids[25:32], all_logits=True)
    assert np.array_equal(after, m.forward_batch([(1, ids[25:32])], all_logits=True)[0])
    m.rewind(10)                                            # before the checkpoint: replay from 0
    assert np.array_equal(state(m), fresh(10))
    for t in ids[10:14]:                                    # single-token steps, then back one
        m.forward([t])
    m.rewind(13)
    assert np.array_equal(state(m), fresh(13))
    m.rewind(0)
    assert np.array_equal(m.forward(ids[:8], all_logits=True), m.logits(ids[:8]))


def test_rewind_from_the_replay_log_is_exact(paths):
    """A call of 2..8 tokens per slot (a speculative window) leaves the engine's replay log: a
    rewind into it folds the logged state inputs into the checkpoint (no forward pass) and gives
    bitwise the state of never having gone ahead. A later call writing at a logged position cuts
    the log there, so a stale entry is never replayed; a longer call leaves none (the forward
    replay serves it)."""
    m = lowbit.load(paths["qwen35moe"], n_ctx=64, threads=2, n_slots=3)
    ids = m.tokenize("In a hole in the ground there lived a hobbit, not a nasty dirty wet hole, filled with the ends "
                     "of worms and an oozy smell, nor yet a dry, bare, sandy hole")[:32]

    def fresh(toks):  # slot 2 runs toks from nothing
        m.rewind(0, slot=2)
        m.forward_batch([(2, list(toks))])
        return state(m, 2)
    m.forward(ids[:20])
    m.forward(ids[20:26])                                   # 6 tokens: logged
    assert m.engine.rstate_log(0) == (20, 6)
    used = m.log_replays
    m.rewind(23)
    assert m.log_replays == used + 1 and m.engine.rstate_pos(0) == 23
    assert np.array_equal(state(m), fresh(ids[:23]))
    after = m.forward(ids[23:27], all_logits=True)          # and the logits after it
    assert np.array_equal(after, m.forward_batch([(2, ids[23:27])], all_logits=True)[0])
    # that 4-token call replaced the log; a single token at 25 (another one) cuts it to 2
    m.rewind(25)
    assert m.engine.rstate_log(0) == (23, 4)
    m.forward([ids[30]])
    assert m.engine.rstate_log(0) == (23, 2)
    m.rewind(24)                                            # inside what the log still holds
    assert np.array_equal(state(m), fresh(ids[:24]))
    m.forward([ids[31]])                                     # at 24: the log keeps (23, 1), too short
    used = m.log_replays
    m.rewind(24)
    m.forward([ids[5]])
    m.rewind(24)                                            # the checkpoint is at 23: log of 1 token
    assert np.array_equal(state(m), fresh(ids[:24]))
    # a KV load (the prefix cache's) at a logged position cuts the log there too
    m.forward(ids[24:28])
    assert m.engine.rstate_log(0) == (24, 4)
    buf = np.empty(m.engine.kv_bytes(2), np.uint8)
    m.engine.kv_copy(0, 26, 2, buf, True)
    m.engine.kv_copy(0, 26, 2, buf, False)
    assert m.engine.rstate_log(0) == (24, 2)
    # two slots in one batch, each its own log
    m.rewind(0, slot=0)
    m.rewind(0, slot=1)
    m.forward_batch([(0, ids[:10]), (1, ids[10:20])])
    m.forward_batch([(0, ids[10:13]), (1, ids[20:28])])
    assert m.engine.rstate_log(0) == (10, 3) and m.engine.rstate_log(1) == (10, 8)
    used = m.log_replays
    m.rewind(11, slot=0)
    m.rewind(17, slot=1)
    assert m.log_replays == used + 2
    assert np.array_equal(state(m, 0), fresh(ids[:11]))
    assert np.array_equal(state(m, 1), fresh(ids[10:27]))  # (slot 1: ids[10:20] then ids[20:28])
    # a call of more than 8 tokens logs nothing (the log keeps positions before it); a rewind
    # into it starts from its checkpoint, which the log does not reach: the forward replay
    m.forward_batch([(1, ids[17:27])])
    assert m.engine.rstate_log(1) == (10, 7)
    used = m.log_replays
    m.rewind(20, slot=1)
    assert m.log_replays == used and np.array_equal(state(m, 1), fresh(ids[10:27] + ids[17:20]))


def test_out_of_order_is_refused(paths):
    m = lowbit.load(paths["qwen35"], n_ctx=64, threads=2)
    m.forward([1, 2, 3, 4])
    logits = np.empty((1, m.config.vocab), np.float32)
    with pytest.raises(ValueError, match="recurrent state is at position 4, not 2"):
        m.engine.forward(np.array([9], np.int32), 2, logits, False)
    # KV loaded without its recurrent state: the slot's state is unknown, a forward is refused
    buf = np.empty(m.engine.kv_bytes(4), np.uint8)
    m.engine.kv_copy(0, 0, 4, buf, True)
    st = state(m)
    m.engine.kv_copy(0, 0, 4, buf, False)
    with pytest.raises(ValueError, match="recurrent state is at position -1, not 4"):
        m.engine.forward(np.array([9], np.int32), 4, logits, False)
    m.engine.rstate_copy(0, st, False)  # with the state loaded too, it continues
    m.engine.forward(np.array([9], np.int32), 4, logits, False)
    m.engine.forward(np.array([9], np.int32), 0, logits, False)  # restarting at 0 is fine


def test_speculative_greedy_is_plain_greedy(paths):
    """Prompt-lookup speculative decoding rewinds rejected drafts: with the recurrent state
    restored exactly, its greedy text is token for token the plain greedy text."""
    lookup_spec_is_plain_greedy(lowbit.load(paths["qwen35moe"], n_ctx=192, threads=2))


def test_synth_cli_writes_hybrid_models(tmp_path):
    from lowbit.cli import main
    out = tmp_path / "m.gguf"
    assert main(["synth", "moe", str(out), "--arch", "qwen35moe", "--dim", "128", "--heads", "2", "--kv-heads", "1",
                 "--experts", "4", "--top-k", "2", "--ffn", "256", "--ssm-state", "16", "--expert-type", "Q8_0"]) == 0
    m = lowbit.load(str(out), n_ctx=32)
    assert m.config.arch == "qwen35moe" and m.config.recurrent == (True, False) and m.config.ssm_state == 16
    assert m.forward([1, 2, 3]).shape == (1, m.config.vocab)
    out2 = tmp_path / "d.gguf"
    assert main(["synth", "dense", str(out2), "--arch", "qwen35", "--dim", "128", "--heads", "2", "--kv-heads", "1",
                 "--ffn", "128", "--layers", "4", "--interval", "4"]) == 0
    d = lowbit.load(str(out2), n_ctx=32)
    assert d.config.recurrent == (True, True, True, False) and d.config.n_expert == 0
    assert d.forward([1, 2, 3]).shape == (1, d.config.vocab)


def test_synth_shape_is_the_published_model(tmp_path, capsys):
    """--shape qwen3.6-35b-a3b writes Qwen3.6-35B-A3B's sizes (its config.json, written out here
    independently of synth's table) except the ones given; a shape of another arch is a usage error."""
    import gguf
    from lowbit.cli import main
    out = tmp_path / "s.gguf"
    # a 4-layer slice with few, narrow experts and a narrow model (small file); the rest is the model's
    assert main(["synth", "moe", str(out), "--shape", "qwen3.6-35b-a3b", "--layers", "4",
                 "--experts", "4", "--top-k", "2", "--dim", "256", "--ssm-type", "F16"]) == 0
    kv = {f.name: f.contents() for f in gguf.GGUFReader(str(out)).fields.values() if f.name.startswith("qwen35moe.")}
    want = {"block_count": 5, "nextn_predict_layers": 1, "embedding_length": 256, "expert_count": 4,
            "expert_used_count": 2, "attention.head_count": 16, "attention.head_count_kv": 2,
            "attention.key_length": 256, "attention.value_length": 256, "rope.dimension_count": 64,
            "rope.dimension_sections": [11, 11, 10, 0], "full_attention_interval": 4, "ssm.conv_kernel": 4,
            "ssm.state_size": 128, "ssm.group_count": 16, "ssm.time_step_rank": 32, "ssm.inner_size": 32 * 128,
            "expert_feed_forward_length": 512, "expert_shared_feed_forward_length": 512, "context_length": 262144}
    got = {k: kv.get("qwen35moe." + k) for k in want}
    assert got == want
    m = lowbit.load(str(out), n_ctx=32)
    assert m.config.recurrent == (True, True, True, False) and m.forward([1, 2, 3]).shape == (1, m.config.vocab)
    capsys.readouterr()
    for bad in (["moe", "--arch", "qwen3moe"], ["dense"]):
        assert main(["synth", bad[0], str(tmp_path / "x.gguf"), "--shape", "qwen3.6-35b-a3b", *bad[1:]]) == 2
        err = capsys.readouterr().err.strip()
        assert "is a qwen35moe model: lowbit synth moe OUT --shape qwen3.6-35b-a3b" in err, err
        assert "\n" not in err and "Traceback" not in err
    assert not (tmp_path / "x.gguf").exists()


# ---- the delta-rule kernel on every level ---------------------------------------------------

from conftest import LEVELS  # noqa: E402


def delta64(M, k, q, v, decay, beta, scale):
    """float64: M[j] *= decay; d = (v - M k) beta; M += d k^T; o = M q scale (M[j][i]: value j, key i)."""
    M = M.astype(np.float64) * decay
    d = (v - M @ k) * beta
    M = M + np.outer(d, k)
    return M, (M @ q) * scale


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("S", [16, 32, 24, 128, 256])
def test_delta_kernel_against_float64(level, S):
    """One token's delta rule on one head, chained over 6 tokens (the state feeds the next step),
    at every level against float64: relative error <= 1e-5 of the largest |state| / |output|;
    S = 24 (not a multiple of 16): the SIMD kernels hand it to the reference. Extreme inputs: decay 1
    and beta 1 (no forgetting, full write), tiny decay, large state values."""
    from lowbit._native import lib
    isa = list(lib.isa_names()).index(level)
    rng = np.random.default_rng(S)
    M = (rng.standard_normal((S, S)) * 3).astype(np.float32)
    M64 = M.astype(np.float64)
    for step, (decay, beta) in enumerate([(0.9, 0.5), (1.0, 1.0), (1e-3, 0.99), (0.5, 0.0), (0.999, 0.7), (0.2, 0.3)]):
        k, q = (rng.standard_normal(S) for _ in range(2))
        k, q = (x / np.linalg.norm(x) for x in (k, q))
        v = rng.standard_normal(S) * 4
        k, q, v = (x.astype(np.float32) for x in (k, q, v))
        o, name = lib.delta_rule(M, k, q, v, decay, beta, 1 / np.sqrt(S), isa)
        M64, o64 = delta64(M64, k.astype(np.float64), q.astype(np.float64), v.astype(np.float64), decay, beta,
                           1 / np.sqrt(S))
        es = np.abs(M - M64).max() / np.abs(M64).max()
        eo = np.abs(o[0] - o64).max() / np.abs(o64).max()
        worst = int(np.abs(o[0] - o64).argmax())
        assert es <= 1e-5 and eo <= 1e-5, f"{name} step {step}: state {es:.2e}, output {eo:.2e} (row {worst})"


def test_mtp_blocks_load_and_the_trunk_matches(tmp_path):
    """A file with an MTP (nextn) block after the trunk (block_count 3, nextn_predict_layers 1):
    lowbit runs the 2 trunk layers, as llama.cpp's main pass does, and matches it."""
    from lowbit import peer
    p = synth_hybrid(tmp_path / "mtp.gguf", arch="qwen35", layers=2, dim=128, heads=2, kv_heads=1, ffn=128,
                     full_attention_interval=2, ssm_state=16, mtp_layers=1, seed=4)
    assert lowbit.gguf.open(p).metadata["qwen35.block_count"] == 3
    m = lowbit.load(p, n_ctx=64, threads=2)
    assert m.config.n_layer == 2 and m.config.recurrent == (True, False)
    llm = peer.Llama(p, n_ctx=64, logits_all=True, verbose=False, n_threads=1)
    try:
        ids = list(range(300, 324))
        llm.reset()
        llm.eval(ids)
        ref = np.array(llm.scores[:len(ids)])
    finally:
        llm.close()
    ours = m.logits(ids)
    top2 = np.sort(ref, 1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] >= 0.1
    assert (ours.argmax(1) == ref.argmax(1))[clear].all() and clear.sum() >= 15
