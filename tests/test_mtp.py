"""MTP (nextn) speculative decoding (lowbit.mtp) on small synthetic hybrid Qwens, glm4moe, deepseek2.

llama.cpp 0.3.36 has the MTP graph (src/models/qwen35moe.cpp graph_mtp), but llama-cpp-python does
not wrap what drives it: the trunk's t_h_nextn and the MTP context's hidden-row input go through
llama-ext.h (llama_set_embeddings_nextn, llama_get_embeddings_nextn_ith: C++ symbols, not in its
Python API; calling them by mangled name through ctypes was not attempted). So the block is checked
against float64 numpy from the file's weights instead:

- known functions: MTP weights edited so the block is eh_proj = [I | 0] (the embedding half) with
  the attention and FFN contributing exactly 0, or [0 | I] (the hidden half): the draft logits are
  then the head of the normed embedding, or the trunk's own logits one position back;
- one whole random MTP block (its attention keys zero, so the softmax is uniform over the cached
  positions and rope drops out: the check sees every cached cell's (token, hidden) pair) against
  a float64 forward over several positions, through draft chains and a rejected window;
- greedy decoding with draft="mtp" is token for token plain greedy, on models whose trunk is close
  to a bigram of the current token (its layers' input norms scaled down) and whose MTP block is that
  bigram (eh_proj = [I | 0]): drafts are accepted often and rejected often (both counted); the
  same for glm4moe and deepseek2 (MLA) nextn blocks;
- after rejected windows the recurrent state is bitwise that of plain decoding;
- a drafter kept across chat turns reuses the slot's cache (only the new tokens are prefilled);
- bad input: --mtp 0, --mtp on a model without an MTP block, --mtp with --lookup.
"""
import numpy as np
import pytest

import lowbit
from lowbit.generate import Stats
from lowbit.mtp import MTP
from lowbit.synth import synth_hybrid, synth_moe

from mtp_models import DIM, SMALL, edit, eh, mtp_block_silent, near_bigram, set_matrix  # noqa: F401

PROMPT = "the cat sat on the mat, the cat sat on the mat, the cat sat on the"


@pytest.fixture(scope="module")
def bigram_models(tmp_path_factory):
    d = tmp_path_factory.mktemp("mtp")
    return {a: edit(synth_hybrid(d / f"{a}.gguf", arch=a, mtp_layers=1, **SMALL), lambda T: near_bigram(T, 4))
            for a in ("qwen35moe", "qwen35")}


def ids_of(pieces):
    return [t for p in pieces for t in p.ids]


def check_greedy(m, ks=(2, 3)):
    """greedy with draft="mtp" equals plain greedy token for token; returns the stats per k."""
    plain = ids_of(m.generate(PROMPT, max_tokens=40, details=True))
    assert len(plain) == 40
    out = {}
    for k in ks:
        st = Stats()
        assert ids_of(m.generate(PROMPT, max_tokens=40, draft="mtp", spec=k, stats=st, details=True)) == plain, k
        out[k] = st
    return out


@pytest.mark.parametrize("arch", ["qwen35moe", "qwen35"])
def test_greedy_with_mtp_is_plain_greedy(bigram_models, arch):
    m = lowbit.load(bigram_models[arch], n_ctx=256, threads=2)
    for k, st in check_greedy(m).items():
        assert st.rounds > 0 and 0 < st.accepted < st.drafted, (k, st.accepted, st.drafted)
        assert "drafts accepted" in st.line()


def test_a_drafter_kept_across_turns_reuses_the_cache(bigram_models):
    """A chat keeps one MTP drafter (lowbit chat --mtp): the next turn, whose prompt extends the last,
    prefills only its new tokens (the slot's cache and the drafter's cells cover the rest), drafts,
    and stays token for token plain greedy. A fresh drafter re-prefills (it has no cells)."""
    m = lowbit.load(bigram_models["qwen35"], n_ctx=256, threads=2)
    d = MTP(m)
    first = ids_of(m.generate(PROMPT, max_tokens=12, draft=d, spec=2, details=True))
    turn2 = m.tokenize(PROMPT) + first + m.tokenize(" and then the dog")
    plain = ids_of(m.generate(turn2, max_tokens=20, details=True))
    list(m.generate(PROMPT, max_tokens=12, draft=d, spec=2))  # (the plain run moved the slot on: turn 1 again)
    st = Stats()
    assert ids_of(m.generate(turn2, max_tokens=20, draft=d, spec=2, stats=st, details=True)) == plain
    assert st.cached > len(m.tokenize(PROMPT)) and st.accepted > 0
    st2 = Stats()
    list(m.generate(turn2, max_tokens=4, draft=MTP(m), spec=2, stats=st2))
    assert st2.cached == 0


# ---- the glue against float64 ------------------------------------------------------------------
def f64(f, name):
    t = f.tensors[name]
    assert t.format.name == "F32", name
    return np.asarray(t.raw).view(np.float32).reshape(t.shape).astype(np.float64)


def rms(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def test_glue_embedding_half(tmp_path):
    """eh_proj = [I | 0], silent block: every draft's logits are output . rms(rms(embed(x)) enorm) shnorm
    for its input token x (the last committed one, then each draft)."""
    p = edit(synth_hybrid(tmp_path / "e.gguf", arch="qwen35", mtp_layers=1, **SMALL),
             lambda T: (T["blk.4.nextn.eh_proj.weight"].__setitem__(..., eh("e")), mtp_block_silent(T, 4)))
    m = lowbit.load(p, n_ctx=64, threads=2)
    f, eps = m.file, m.config.eps
    ids = m.tokenize(PROMPT)[:12]
    d = MTP(m)
    d.attach(m)
    m.forward(ids[:-1])
    drafts, _ = d.propose(ids, 3)
    W = lambda n: f64(f, n)  # noqa: E731
    for x, got in zip([ids[-1]] + drafts[:-1], d.draft_logits):
        y = rms(W("token_embd.weight")[x], W("blk.4.nextn.enorm.weight"), eps)
        want = W("output.weight") @ rms(y, W("blk.4.nextn.shared_head_norm.weight"), eps)
        assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()


def test_glue_hidden_half_is_the_trunk_one_position_back(tmp_path):
    """eh_proj = [0 | I], silent block, hnorm = shared_head_norm = output_norm = 1: the block's output
    is rms(rms(h)) = h (to eps), so draft 1's logits are the trunk's logits at the position before
    the last committed token (the h llama.cpp pairs with it), and every later draft repeats them."""
    def e(T):
        T["blk.4.nextn.eh_proj.weight"][...] = eh("h")
        mtp_block_silent(T, 4)
        for n in ("blk.4.nextn.hnorm.weight", "blk.4.nextn.shared_head_norm.weight", "output_norm.weight"):
            T[n][...] = 1
    m = lowbit.load(edit(synth_hybrid(tmp_path / "h.gguf", arch="qwen35moe", mtp_layers=1, **SMALL), e),
                    n_ctx=64, threads=2)
    ids = m.tokenize(PROMPT)[:12]
    d = MTP(m)
    d.attach(m)
    trunk = m.forward(ids[:-1], all_logits=True)
    drafts, _ = d.propose(ids, 2)
    for got in d.draft_logits:
        assert np.abs(got - trunk[-1]).max() <= 1e-4 * np.abs(trunk[-1]).max()
    assert np.abs(d.draft_logits[0] - trunk[-2]).max() > 0.1 * np.abs(trunk[-1]).max()  # (the test can fail)


def one_layer_trunk_hidden(path, ids):
    """float64 t_h_nextn of a one-layer qwen35 trunk (a gated delta-net layer, dense FFN): the
    oracle of tests/test_qwen35.py, up to the output norm."""
    from test_qwen35 import oracle_logits
    return oracle_logits(path, ids, hidden=True)


def mtp_block64(f, c, pairs):
    """float64 forward of MTP block 1 (qwen35: gated attention with attn_k = 0, so each query attends
    uniformly to the cached positions 0..q; a dense FFN) over (token, h) pairs at positions 0..n-1.
    Returns per position (logits, h')."""
    cache = {}
    W = lambda n: cache[n] if n in cache else cache.setdefault(n, f64(f, n))  # noqa: E731
    p, eps, hd, H, Hkv = "blk.1.", c.eps, c.head_dim, c.n_head, c.n_kv
    silu = lambda x: x / (1 + np.exp(-x))  # noqa: E731
    vs, out = [], []
    for x, h in pairs:
        y = W(p + "nextn.eh_proj.weight") @ np.concatenate([rms(W("token_embd.weight")[x], W(p + "nextn.enorm.weight"), eps),
                                                           rms(h, W(p + "nextn.hnorm.weight"), eps)])
        a = rms(y, W(p + "attn_norm.weight"), eps)
        qg = (W(p + "attn_q.weight") @ a).reshape(H, 2, hd)
        vs.append((W(p + "attn_v.weight") @ a).reshape(Hkv, hd))
        v = np.mean(vs, axis=0)                                   # uniform over positions 0..q
        att = np.stack([v[hh // (H // Hkv)] for hh in range(H)]) / (1 + np.exp(-qg[:, 1]))
        y = y + W(p + "attn_output.weight") @ att.reshape(-1)
        g = rms(y, W(p + "post_attention_norm.weight"), eps)
        y = y + W(p + "ffn_down.weight") @ (silu(W(p + "ffn_gate.weight") @ g) * (W(p + "ffn_up.weight") @ g))
        hn = rms(y, W(p + "nextn.shared_head_norm.weight"), eps)
        out.append((W("output.weight") @ hn, hn))
    return out


def test_whole_block_against_float64(tmp_path):
    """A random MTP block (attn_k zero) after a one-delta-net-layer trunk, all F32: the draft logits of
    a chain of 3, then after a verify window whose drafts were rejected (rewound), equal a float64
    forward fed the committed (token, trunk h one position back) pairs and then the chain's own h'.
    (The KV cache is half: tolerance 3e-3 of the largest logit; a wrong pairing is off by O(1).)"""
    kw = dict(SMALL, layers=1, full_attention_interval=4)
    p = edit(synth_hybrid(tmp_path / "b.gguf", arch="qwen35", mtp_layers=1, **kw),
             lambda T: T["blk.1.attn_k.weight"].__setitem__(..., 0))
    m = lowbit.load(p, n_ctx=64, threads=2)
    f, c = m.file, m.config
    ids = m.tokenize(PROMPT)[:14]
    H = one_layer_trunk_hidden(p, ids)                     # [len(ids), dim]
    d = MTP(m)
    d.attach(m)

    def check(hist, k):
        P = len(hist) - 1
        drafts, _ = d.propose(hist, k)
        pairs = [(hist[q], H[q - 1] if q else np.zeros(DIM)) for q in range(P + 1)]
        ref = mtp_block64(f, c, pairs)
        want = [ref[-1][0]]
        for i in range(1, k):                                     # the chain: draft i-1 with the block's own h'
            pairs.append((drafts[i - 1], ref[-1][1]))
            ref = mtp_block64(f, c, pairs)
            want.append(ref[-1][0])
        for got, w in zip(d.draft_logits, want):
            assert np.abs(got - w).max() <= 3e-3 * np.abs(w).max()
        return drafts
    m.forward(ids[:9])
    drafts = check(ids[:10], 3)
    m.forward([ids[9]] + [t ^ 1 for t in drafts], all_logits=True)  # a window of wrong drafts...
    m.rewind(10)                                                  # ... all rejected
    check(ids[:11], 2)
    m.forward([ids[10]])
    m.forward(ids[11:13])
    check(ids[:14], 3)


# ---- state after rejected windows --------------------------------------------------------------
def test_recurrent_state_after_rejections_is_plain(bigram_models):
    """At every round (the target holding history[:-1] after the previous window's rejected drafts
    were rewound), the slot's conv + delta-net state is bitwise that of running those tokens plainly."""
    m = lowbit.load(bigram_models["qwen35moe"], n_ctx=256, threads=2, n_slots=2)
    d = MTP(m)
    real = d.propose
    seen = {"rounds": 0, "after_reject": 0}
    st = Stats()

    def state(slot):
        buf = np.empty(m.engine.rstate_bytes(), np.uint8)
        m.engine.rstate_copy(slot, buf, True)
        return buf

    def propose(history, k):
        if len(history) > 1 and m.slot_pos[0] == len(history) - 1:
            mine = state(0)
            m.rewind(0, slot=1)
            m.forward_batch([(1, history[:-1])])
            assert np.array_equal(mine, state(1))
            seen["rounds"] += 1
            seen["after_reject"] += st.drafted > st.accepted
        return real(history, k)
    d.propose = propose
    list(m.generate(PROMPT, max_tokens=30, draft=d, spec=3, stats=st))
    assert seen["rounds"] >= 5 and seen["after_reject"] >= 3 and st.drafted > st.accepted > 0
    assert m.log_replays > 0  # the rewinds of rejected drafts: the engine's replay log, no forward


# ---- glm4moe ---------------------------------------------------------------------------------
def test_glm4moe_greedy_with_mtp(tmp_path):
    """glm4moe's nextn block (the same glue, an MoE layer with q/k/v biases) drafts; greedy is exact."""
    p = synth_moe(tmp_path / "glm.gguf", arch="glm4moe", layers=2, dim=DIM, heads=2, kv_heads=1, experts=4, top_k=2,
                  expert_ffn=128, dense_ffn=256, leading_dense=1, nextn=1, wtype="F32", embd_type="F32",
                  expert_type="Q8_0", seed=7)
    m = lowbit.load(edit(p, lambda T: near_bigram(T, 2)), n_ctx=256, threads=2)
    assert m.config.n_nextn == 1
    for k, st in check_greedy(m, ks=(2,)).items():
        assert 0 < st.accepted < st.drafted, (st.accepted, st.drafted)


def test_deepseek2_greedy_with_mtp(tmp_path):
    """deepseek2's nextn block (MLA attention, routed + shared experts, the same glue) drafts; greedy
    is exact."""
    from lowbit.synth import synth_deepseek2
    p = synth_deepseek2(tmp_path / "ds.gguf", layers=2, dim=DIM, heads=2, kv_lora_rank=32, qk_nope=32, rope_dims=16,
                        v_head_dim=32, experts=4, top_k=2, expert_ffn=128, dense_ffn=256, leading_dense=1,
                        shared_experts=1, wtype="F32", embd_type="F32", expert_type="Q8_0", nextn=1, seed=8)
    m = lowbit.load(edit(p, lambda T: near_bigram(T, 2)), n_ctx=256, threads=2)
    assert m.config.n_nextn == 1 and m.config.n_layer == 2
    for k, st in check_greedy(m, ks=(2,)).items():
        assert 0 < st.accepted < st.drafted, (st.accepted, st.drafted)


# ---- bad input -------------------------------------------------------------------------------
def test_bad_input(tmp_path, capsys):
    from lowbit.cli import main
    p = synth_hybrid(tmp_path / "nomtp.gguf", arch="qwen35", **dict(SMALL, layers=2))
    assert main(["run", "-m", p, "--mtp", "0", "-n", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("lowbit: error: --mtp must be in 1..64") and "\n" not in err
    assert main(["run", "-m", p, "--mtp", "2", "-n", "2", "-p", "hi"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("lowbit: error: --mtp:") and "no MTP (nextn) block" in err[-1]
    with pytest.raises(SystemExit) as e:
        main(["run", "-m", p, "--mtp", "2", "--lookup"])
    assert e.value.code == 2
    m = lowbit.load(p, n_ctx=32)
    with pytest.raises(ValueError, match="no MTP"):
        list(m.generate("hi", max_tokens=2, draft="mtp"))
