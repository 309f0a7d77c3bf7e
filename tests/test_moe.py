"""Mixture-of-Experts models (qwen3moe, mixtral, qwen2moe, olmoe) on small synthetic files, against llama.cpp.

The models are written here by lowbit.synth.synth_moe (random weights, SmolLM2's vocabulary):
2 layers, width 256, 8 experts of width 256, top-2. Parity is teacher-forced over llama.cpp's own
greedy continuation (as tests/test_engine.py): where llama.cpp's top-2 margin is >= 0.1, lowbit's
top-1 equals llama.cpp's at >= 99% of the positions, and wherever the two differ lowbit's token
is within 0.1 logit of llama.cpp's best. Measured here (avx512, avx2): every position agrees,
max |logit diff| about 0.06 on a spread of 8.4 (llama.cpp's single-token path alone differs from
its own batched path by about 0.03 on the dense models).

Positions where some layer's routing is a near-tie (the K-th expert's probability within 1e-3
of the best unchosen one's, by lowbit's router) are left out of the comparison: there float noise
of either side picks the expert (measured: olmoe seed 4, a margin of 7e-4, moves one position's
logits by 0.58). At most 10% of the positions may be such ties.

The expert pool's invariant is checked bitwise: a token's logits are identical whether it ran
alone, in a window, or in a chunk of another size, and with 1 or 2 threads.
"""
import numpy as np
import pytest

import lowbit
from llama_ref import llama_greedy
from lowbit.gguf import GGUFError
from lowbit.synth import synth_moe
from lowbit.writer import Writer

PROMPTS = [b"Once upon a time, in a small village by the sea, the quick brown fox"]
GEN = 36
ROUTE_TIE = 1e-3  # router probability margin below which a position's routing is a coin toss

VARIANTS = {
    # name: synth_moe options
    "qwen3moe-q4k-q8down-bf16router": dict(arch="qwen3moe", expert_type="Q4_K", down_type="Q8_0",
                                           router_type="BF16"),
    "qwen3moe-all-q4k": dict(arch="qwen3moe", wtype="Q4_K", expert_type="Q4_K", head_type="Q4_K", top_k=4),
    "mixtral": dict(arch="mixtral", expert_type="Q4_K", router_type="F32"),
    "qwen2moe": dict(arch="qwen2moe", expert_type="Q4_K", router_type="F16", shared_ffn=256),
    "olmoe": dict(arch="olmoe", expert_type="Q4_K", kv_heads=4),
}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("moe")
    return {name: synth_moe(d / f"{name}.gguf", embd_type="F16", seed=i, **opt)
            for i, (name, opt) in enumerate(VARIANTS.items())}


@pytest.mark.parametrize("name", list(VARIANTS))
def test_moe_matches_llama_cpp(models, name):
    from lowbit import peer
    path = models[name]
    m = lowbit.load(path, n_ctx=128, threads=2)
    c = m.config
    assert c.n_expert == 8 and c.n_expert_used == VARIANTS[name].get("top_k", 2) and c.expert_ffn == 256
    assert c.expert_norm == (VARIANTS[name]["arch"] in ("qwen3moe", "mixtral"))
    assert c.shexp_ffn == (256 if name == "qwen2moe" else 0)
    # one llama.cpp thread: its per-node thread barrier stalls for seconds on a busy machine
    llm = peer.Llama(path, n_ctx=128, logits_all=True, verbose=False, n_threads=1)
    agree = counted = ties = positions = 0
    sets, used = set(), [set() for _ in range(c.n_layer)]
    for prompt in PROMPTS:
        ids, ref = llama_greedy(llm, llm.tokenize(prompt, add_bos=False), GEN)
        m.reset()
        ours = m.forward(ids, all_logits=True)
        for layer in range(c.n_layer):
            r = np.array(m.engine.last_routes(layer)).reshape(len(ids), c.n_expert_used)
            used[layer].update(r.ravel().tolist())
            sets.update((layer,) + tuple(sorted(row)) for row in r.tolist())
        # A routing near-tie (the K-th expert's probability within ROUTE_TIE of the next one's,
        # at any layer) is decided by float noise: either side may pick either expert.
        tie = np.zeros(len(ids), bool)
        for layer in range(c.n_layer):
            tie |= np.array(m.engine.last_route_margins(layer)) < ROUTE_TIE
        ties += int(tie.sum())
        positions += len(ids)
        top2 = np.sort(ref, 1)[:, -2:]
        margin = top2[:, 1] - top2[:, 0]
        same = ours.argmax(1) == ref.argmax(1)
        agree += int(same[(margin >= 0.1) & ~tie].sum())
        counted += int(((margin >= 0.1) & ~tie).sum())
        picked = ref[np.arange(len(ids)), ours.argmax(1)]
        below = (ref.max(1) - picked)[~tie]
        worst = float(below.max())
        assert worst <= 0.1, f"{name}: lowbit's token is {worst:.3f} below llama.cpp's best at some position"
    assert ties <= 0.1 * positions, f"{name}: {ties} routing near-ties in {positions} positions"
    assert counted >= 20, f"{name}: only {counted} positions with a margin >= 0.1"
    assert agree >= 0.99 * counted, f"{name}: top-1 agrees at {agree}/{counted} positions with margin >= 0.1"
    # routing is not degenerate: every expert gets tokens, many distinct top-K sets
    assert all(len(u) == c.n_expert for u in used), [sorted(u) for u in used]
    assert len(sets) >= 20, f"only {len(sets)} distinct (layer, top-K set) pairs"


@pytest.mark.parametrize("name", ["qwen3moe-q4k-q8down-bf16router", "qwen3moe-all-q4k", "qwen2moe"])
def test_window_alone_and_threads_bitwise(models, name):
    """A token's logits do not depend on its window (40 at once, chunks of 7, alone) or the
    threads (1, 2, 3). Gate/up and down of a layer's experts run as one work list (moe.cpp: a
    down item waits for its expert's gate/up items; the thread that finishes them quantizes the
    rows for down), so whichever thread finishes an expert or claims its down rows, the bits are
    the same; the 40-token chunk gives experts several tokens (windows of 8, or the GEMM)."""
    path = models[name]
    m2 = lowbit.load(path, n_ctx=64, threads=2)
    ids = m2.tokenize("In a hole in the ground there lived a hobbit, not a nasty dirty wet hole, filled with the "
                      "ends of worms and an oozy smell, nor yet a dry, bare, sandy hole")[:40]
    assert len(ids) == 40
    whole = m2.logits(ids, chunk=40)
    chunks = m2.logits(ids, chunk=7)
    m2.reset()
    alone = np.concatenate([m2.forward([t], all_logits=True) for t in ids])
    assert np.array_equal(whole, chunks)
    assert np.array_equal(whole, alone)
    for threads in (1, 3):
        m = lowbit.load(path, n_ctx=64, threads=threads)
        assert np.array_equal(m.logits(ids, chunk=40), whole), f"{threads} threads differ from 2"
        assert np.array_equal(m.logits(ids, chunk=7), whole), f"{threads} threads differ from 2"
    # a rewind and a re-run of the tail (speculative rollback) gives the same bits again
    m2.rewind(12)
    assert np.array_equal(m2.forward(ids[12:], all_logits=True), whole[12:])


def test_stats_count_experts_and_bytes(models):
    path = models["mixtral"]
    m = lowbit.load(path, n_ctx=64, threads=2)
    f, c = m.file, m.config
    m.engine.set_stats(True)
    m.forward(m.tokenize("one two three four five six seven eight nine ten")[:8])
    m.engine.reset_stats()
    m.forward([42])  # one decode step: exactly K experts per layer
    for i, s in enumerate(m.engine.stats()):
        assert s["calls"] == 1 and s["tokens"] == 1 and s["distinct_experts"] == c.n_expert_used
        p = f"blk.{i}."
        attn = sum(f.tensors[p + n + ".weight"].nbytes for n in ("attn_q", "attn_k", "attn_v", "attn_output"))
        experts = sum(f.tensors[p + n + ".weight"].nbytes for n in ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"))
        want = attn + f.tensors[p + "ffn_gate_inp.weight"].nbytes + experts * c.n_expert_used // c.n_expert
        assert s["weight_bytes"] == want
        assert min(s["t_attn"], s["t_router"], s["t_experts"]) > 0


def test_lookahead_changes_nothing_but_reads(models):
    """Router lookahead only reads pages ahead: logits are bitwise the same with it on; its
    counters add up (a hit is a routed expert that was predicted)."""
    path = models["qwen3moe-all-q4k"]
    ids = list(range(100, 130))
    off = lowbit.load(path, n_ctx=64, threads=2)
    on = lowbit.load(path, n_ctx=64, threads=2, lookahead=True)
    assert np.array_equal(on.logits(ids, chunk=8), off.logits(ids, chunk=8))
    la, c = on.engine.lookahead_stats(), on.config
    windows = 4  # 30 tokens in chunks of 8
    assert 0 < la["hits"] <= la["routed"] <= windows * (c.n_layer - 1) * c.n_expert
    assert la["predicted"] >= la["hits"]
    assert off.engine.lookahead_stats()["routed"] == 0


def test_run_stats_and_lookahead_cli(models, capsys):
    from lowbit.cli import main
    assert main(["run", "-m", models["mixtral"], "-p", "one two three", "-n", "3", "-t", "2",
                 "--stats", "--lookahead", "on"]) == 0
    err = capsys.readouterr().err
    assert "experts/window" in err and "decode: " in err and "lookahead:" in err, err
    assert "outside the layers" in err and "FFN blocks" in err, err


# ---- bad metadata: a tiny file, rejected by ModelConfig before anything else is read ----------

def write_tiny(path, *, experts=4, used=2, ffn=32, meta_ffn=None, drop=(), arch="qwen3moe"):
    w = Writer(path, arch)
    dim = 32
    for k, v in [("block_count", 1), ("context_length", 64), ("embedding_length", dim),
                 ("attention.head_count", 2), ("attention.head_count_kv", 2),
                 ("expert_count", experts), ("expert_used_count", used),
                 ("expert_feed_forward_length", meta_ffn or ffn), ("feed_forward_length", ffn)]:
        if k not in drop:
            w.meta(f"{arch}.{k}", v)
    rng = np.random.default_rng(0)
    w.add("token_embd.weight", rng.standard_normal((16, dim)).astype(np.float32))
    e = max(experts, 1)
    w.add("blk.0.ffn_gate_inp.weight", rng.standard_normal((e, dim)).astype(np.float32))
    w.add("blk.0.ffn_gate_exps.weight", rng.standard_normal((e, ffn, dim)).astype(np.float32))
    w.add("blk.0.ffn_up_exps.weight", rng.standard_normal((e, ffn, dim)).astype(np.float32))
    w.add("blk.0.ffn_down_exps.weight", rng.standard_normal((e, dim, ffn)).astype(np.float32))
    w.close()
    return str(path)


@pytest.mark.parametrize("case,kw,key", [
    ("used0", dict(used=0), "qwen3moe.expert_used_count"),
    ("used>count", dict(used=5), "qwen3moe.expert_used_count"),
    ("count0", dict(experts=0), "qwen3moe.expert_count"),
    ("no-count", dict(drop=("expert_count",)), "qwen3moe.expert_count"),
    ("no-used", dict(drop=("expert_used_count",)), "qwen3moe.expert_used_count"),
    ("ffn-disagrees", dict(meta_ffn=64), "expert_feed_forward_length"),
])
def test_bad_moe_metadata(tmp_path, case, kw, key):
    path = write_tiny(tmp_path / f"{case}.gguf", **kw)
    with pytest.raises(GGUFError) as e:
        lowbit.load(path)
    msg = str(e.value)
    assert key in msg and "\n" not in msg, msg
