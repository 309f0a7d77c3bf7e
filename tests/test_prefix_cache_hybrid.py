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
import itertools

import httpx
import numpy as np
import pytest

import lowbit
from lowbit.generate import Stats, plain
from lowbit.sampling import Sampler
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


def test_a_replys_state_is_adopted_and_resumed_from(model):
    """A reply's state taken at its last whole block while it decoded (the engine has moved on
    since) goes with the reply's KV into the cache (store(snapshot=...)), counted in the budget;
    the next turn resumes there, with bitwise the logits of computing everything."""
    m = model
    kv, st = m.engine.kv_bytes(B), m.engine.rstate_bytes()
    cache = PrefixCache(m, 256 << 20, block=B)
    prompt = tokens(70, 8)
    compute(m, cache, 0, prompt, cache.snapshot_points(prompt, 0))  # its state at 64
    reply, snap = tokens(45, 9), None
    for t in reply:  # decoding, a token a step; the state copied out at each block end passed
        m.forward_batch([(0, [t])])
        if m.slot_pos[0] % B == 0:
            snap = (m.slot_pos[0], np.empty(st, np.uint8))
            m.engine.rstate_copy(0, snap[1], True)
    assert snap[0] == 96 and m.slot_pos[0] == 115
    cache.store(0, snapshot=snap)
    s = cache.stats()
    assert s["snapshots"] == 2 and s["blocks"] == 3 and s["bytes"] == 3 * kv + 2 * st
    turn2 = prompt + reply + tokens(30, 10)
    m.rewind(0, slot=1)
    assert cache.load(turn2, 1) == 96 and m.engine.rstate_pos(1) == 96
    lg = m.forward_batch([(1, turn2[96:])], all_logits=True)[0]
    ref = m.logits(turn2)
    assert (lg == ref[96:]).all(), np.abs(lg - ref[96:]).max()


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


def test_server_next_turn_resumes_after_the_reply(server, ref):
    """Turn 2's prompt is turn 1's prompt, its reply and more (token ids, so that the reply is the
    tokens generated): the cache holds the reply's KV and the state at its last whole block, so
    turn 2 computes only what follows; its text is what it gets alone (no cache)."""
    p1 = tokens(90, 11)
    r1 = httpx.post(server.url + "/v1/completions", json={"prompt": p1, "max_tokens": 40, "temperature": 0},
                    timeout=300).json()
    assert r1["choices"][0]["text"] == alone(ref, p1, 40)[0] and r1["usage"]["completion_tokens"] == 40
    ref.reset()
    reply = list(itertools.islice(plain(ref, p1, Sampler(temperature=0.0), Stats()), 40))
    p2 = p1 + reply + tokens(25, 12)
    r2 = httpx.post(server.url + "/v1/completions", json={"prompt": p2, "max_tokens": 8, "temperature": 0},
                    timeout=300).json()
    assert r2["choices"][0]["text"] == alone(ref, p2, 8)[0]
    # turn 1's slot held 90 + 39 positions (its last token was sampled, not fed): state at 128;
    # without the reply's snapshot the hit ends at turn 1's prompt's last whole block, 64
    assert r2["usage"]["prompt_tokens_details"]["cached_tokens"] == (90 + 39) // B * B == 128


def test_speculating_reply_still_leaves_its_state(model):
    """With lookup drafting every window (spec_cost 0), a window ends at the next block end at
    most, so the slot still stands on the reply's last whole block: turn 2 resumes after the
    reply, and both turns give the tokens of a scheduler with no cache and no speculation."""
    import queue
    from lowbit.server import spec
    from lowbit.server.scheduler import Request, Scheduler

    def run(sched, ids, n):
        q = queue.Queue()
        r = Request(prompt=list(ids), max_tokens=n, sampler=Sampler(temperature=0.0), emit=q.put,
                    logit_bias={t: 4.0 for t in (17, 18, 19, 20)})  # a few tokens recur: lookup drafts
        sched.submit(r)
        while (ev := q.get(timeout=300))[0] == "text":
            pass
        assert ev[0] == "done", ev
        return r.history, r.cached

    p1 = tokens(80, 13)
    outs = []
    for sp, cache in ((None, None), (spec.lookup(), PrefixCache(model, 256 << 20, block=B))):
        sched = Scheduler(model, 2, cache=cache, spec=sp, spec_k=4, spec_cost=0.0)
        try:
            h1, _ = run(sched, p1, 40)
            h2, cached = run(sched, h1 + tokens(20, 14), 10)
            outs.append((h1, h2, cached, sched.status()["spec"]))
        finally:
            sched.close()
    (a1, a2, _, _), (b1, b2, cached, st) = outs
    assert (a1, a2) == (b1, b2)
    assert st["drafted"] > 0 and st["accepted"] > 0, st
    assert len(b1) == 120 and cached == (80 + 39) // B * B == 96
