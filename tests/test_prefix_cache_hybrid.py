"""The prefix cache on a hybrid model (qwen35moe: gated delta-net layers beside attention): a
cached prefix is its KV blocks plus the recurrent state at the chain's end (prefix.py).

Logits after a cached prefix was loaded must equal, bit for bit, those of computing the whole
prompt (Model.logits on slot 0, its own chunking); a chain with no snapshot at its end is no hit
(its KV alone would leave the recurrent state wrong); the snapshots count in the budget and go
with their blocks. Through the server (prompts chunked by --step-tokens 48, not a block multiple):
requests sharing a system prompt get the greedy text lowbit.generate gives them alone, and the
cache hits.
"""
import concurrent.futures as cf

import httpx
import numpy as np
import pytest

import lowbit
from lowbit.server.prefix import PrefixCache
from lowbit.synth import synth_hybrid
from serve_util import alone, chat_prompt, openai_client, running

B = 32
SMALL = dict(arch="qwen35moe", layers=4, dim=256, heads=4, kv_heads=2, head_dim=64, rope_dims=32, sections=(2, 2, 2, 2),
             full_attention_interval=2, ssm_conv=4, ssm_state=32, ssm_groups=2, ssm_heads=4, experts=8, top_k=2,
             expert_ffn=256, shared_ffn=256, ctx=2048, rope_base=1e4, embd_type="F16", wtype="Q8_0", expert_type="Q4_K",
             seed=7)


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return synth_hybrid(tmp_path_factory.mktemp("hybrid_prefix") / "q35.gguf", **SMALL)


@pytest.fixture(scope="module")
def model(path):
    return lowbit.load(path, n_ctx=512, threads=2, n_slots=3)


def tokens(n, seed):
    return np.random.default_rng(seed).integers(0, 49152, n).tolist()


def compute(m, cache, slot, ids, snaps, chunk=40):
    """ids into an empty slot in chunks cut at `snaps` (as the scheduler feeds a prompt), storing
    the blocks after each chunk and the recurrent state at the snapshot points."""
    m.rewind(0, slot=slot)
    fed = 0
    while fed < len(ids):
        n = min(chunk, len(ids) - fed)
        n = next((p - fed for p in snaps if fed < p < fed + n), n)
        m.forward_batch([(slot, ids[fed:fed + n])])
        fed += n
        cache.store(slot, fed, state=fed in snaps)


def test_hybrid_hit_gives_bitwise_the_same_logits(model):
    m = model
    assert m.engine.hybrid
    cache = PrefixCache(m, 256 << 20, block=B)
    shared = tokens(150, 1)
    a = shared + tokens(60, 2)
    snaps = cache.snapshot_points(a, 0)
    assert snaps == [192]  # nothing cached: only its own last whole block before the last token
    compute(m, cache, 0, a, snaps)
    assert cache.stats()["snapshots"] == 1
    b = shared + tokens(50, 3)  # shares 4 whole blocks' KV with a, but no snapshot there: no hit
    m.rewind(0, slot=1)
    assert cache.load(b, 1) == 0
    snaps = cache.snapshot_points(b, 0)
    assert snaps == [128, 192]  # where b branches off a, and its own last whole block
    compute(m, cache, 1, b, snaps)
    c = shared + tokens(70, 4)
    m.rewind(0, slot=2)
    assert cache.load(c, 2) == 128 and m.slot_pos[2] == 128 and m.engine.rstate_pos(2) == 128
    lg = m.forward_batch([(2, c[128:])], all_logits=True)[0]
    ref = m.logits(c)
    bad = np.flatnonzero(~(lg == ref[128:]).all(axis=1))
    assert bad.size == 0, f"positions {bad[:5] + 128} differ, worst |diff| {np.abs(lg - ref[128:]).max()}"
    m.rewind(0, slot=2)  # the same prompt again: its own last whole block
    snaps = cache.snapshot_points(c, cache.load(c, 2))
    assert snaps == [192]


def test_snapshots_count_in_the_budget_and_go_with_their_block(model):
    m = model
    kv, st = m.engine.kv_bytes(B), m.engine.rstate_bytes()
    cache = PrefixCache(m, 4 * kv + st, block=B)
    a, b = tokens(100, 5), tokens(100, 6)
    compute(m, cache, 0, a, cache.snapshot_points(a, 0))
    s = cache.stats()
    assert s["blocks"] == 3 and s["snapshots"] == 1 and s["bytes"] == 3 * kv + st
    compute(m, cache, 0, b, cache.snapshot_points(b, 0))  # 6 blocks + 2 states: a's leaf (and its state) go
    s = cache.stats()
    assert s["bytes"] <= s["capacity_bytes"] and s["bytes"] == s["blocks"] * kv + s["snapshots"] * st
    m.rewind(0, slot=1)
    assert cache.load(a + [1], 1) == 0  # a's snapshot went with its last block
    m.rewind(0, slot=1)
    assert cache.load(b + [1], 1) == 96


# -- through the server ---------------------------------------------------------------------------
SYSTEM = "You are a careful assistant who answers briefly and checks every fact twice. " * 12  # ~200 tokens


@pytest.fixture(scope="module")
def server(path):
    with running("-m", path, "--ctx", "1024", "--parallel", "2", "-t", "2",
                 "--cache-mb", "256", "--step-tokens", "48") as s:
        yield s


@pytest.fixture(scope="module")
def ref(path):
    return lowbit.load(path, n_ctx=1024, threads=2)


def test_server_hybrid_shared_system_prompt_is_bitwise_and_hits(server, ref):
    client = openai_client(server.url, timeout=300)
    sys_msg = {"role": "system", "content": SYSTEM}
    n_sys = len(ref.tokenize(chat_prompt(ref, [sys_msg])))
    cached = []
    for q in ("What is a prime number?", "Name a river.", "How far is the moon?", "How far is the moon?"):
        msgs = [sys_msg, {"role": "user", "content": q}]
        r = client.chat.completions.create(model="q35", messages=msgs, max_tokens=10, temperature=0)
        assert r.choices[0].message.content == alone(ref, chat_prompt(ref, msgs), 10)[0]
        cached.append(r.usage.prompt_tokens_details.cached_tokens)
    # the first computes all and keeps the state at its last whole block, which (a short question)
    # lies in the system prompt; the others take it, or one at their branch point
    assert cached[0] == 0 and min(cached[1:]) >= (n_sys // B - 1) * B > 0, cached
    s = httpx.get(server.url + "/v1/status").json()["prefix_cache"]
    assert s["hits"] >= 3 and s["snapshots"] >= 1


def test_server_hybrid_concurrent_requests_share_a_prefix(server, ref):
    """Four clients at once with one system prompt (2 slots): a leader computes it and keeps the
    state where its follower goes on; every text is what the request gets alone."""
    client = openai_client(server.url, timeout=300)
    sys_msg = {"role": "system", "content": "Shared context for everyone, told once, at length. " * 20}
    jobs = [[sys_msg, {"role": "user", "content": f"Question number {i}?"}] for i in range(4)]
    want = [alone(ref, chat_prompt(ref, m), 6)[0] for m in jobs]
    with cf.ThreadPoolExecutor(4) as ex:
        rs = list(ex.map(lambda m: client.chat.completions.create(model="q35", messages=m, max_tokens=6,
                                                                  temperature=0), jobs))
    assert [r.choices[0].message.content for r in rs] == want
    n_sys = len(ref.tokenize(chat_prompt(ref, [sys_msg])))
    cached = sorted(r.usage.prompt_tokens_details.cached_tokens for r in rs)
    assert cached[1] >= (n_sys // B - 1) * B > 0, cached
