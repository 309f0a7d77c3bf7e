"""The server's prefix cache (src/lowbit/server/prefix.py) and Engine.kv_copy under it.

Logits computed after a cached prefix was copied into a slot must equal, bit for bit, the
logits of computing the whole prompt (Model.logits on slot 0, its own chunking); eviction is
least recently used, leaves before their parents, within the byte budget; through the server,
a request served from the cache gets the text lowbit.generate gives it alone (no cache), and
usage.prompt_tokens_details.cached_tokens says how much was reused.
"""
import numpy as np
import pytest

import lowbit
from lowbit.server.prefix import PrefixCache
from serve_util import Server, alone, chat_prompt, openai_client, running, synth_model

B = 32


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return synth_model(tmp_path_factory.mktemp("prefix") / "synth.gguf")


@pytest.fixture(scope="module")
def model(path):
    return lowbit.load(path, n_ctx=512, threads=2, n_slots=3)


def tokens(n, seed):
    return np.random.default_rng(seed).integers(0, 49152, n).tolist()


def compute(m, slot, ids, chunk=40):
    """ids into an empty slot, in chunks, as the scheduler feeds a prompt."""
    m.rewind(0, slot=slot)
    for i in range(0, len(ids), chunk):
        m.forward_batch([(slot, ids[i:i + chunk])])


def test_kv_copy_round_trip_and_bad_arguments(model):
    m = model
    ids = tokens(70, 1)
    compute(m, 0, ids)
    n = m.engine.kv_bytes(B)
    assert n == m.config.n_layer * 2 * B * m.config.n_kv * m.config.head_dim * 2  # half
    a = np.empty(n, np.uint8)
    m.engine.kv_copy(0, 32, B, a, True)
    assert a.any()
    m.engine.kv_copy(2, 0, B, a, False)  # into another slot, then back out: the same bytes
    b = np.zeros(n, np.uint8)
    m.engine.kv_copy(2, 0, B, b, True)
    assert np.array_equal(a, b)
    for args in ((3, 0, B), (-1, 0, B), (0, 500, B), (0, -1, B)):
        with pytest.raises(ValueError):
            m.engine.kv_copy(*args, a, True)
    with pytest.raises(ValueError, match="kv_bytes"):
        m.engine.kv_copy(0, 0, B, np.empty(n - 1, np.uint8), True)


@pytest.mark.parametrize("n_prompt,shared,want", [
    (150, 150, 128),   # 4 whole blocks of the 150 computed ones
    (129, 129, 128),   # 128 + 1: every whole block, the last token computed
    (128, 128, 96),    # at least one token is always computed
    (150, 70, 64),     # the prompts part after 70 tokens: blocks 0 and 1 only
    (20, 20, 0),       # shorter than a block
])
def test_restored_prefix_gives_bitwise_the_same_logits(model, n_prompt, shared, want):
    m = model
    base = tokens(200, 2)
    cache = PrefixCache(m, 64 << 20, block=B)
    compute(m, 0, base[:150])
    cache.store(0)
    prompt = base[:shared] + tokens(n_prompt - shared, 3)
    m.rewind(0, slot=1)
    got = cache.load(prompt, 1)
    assert got == want and m.slot_pos[1] == want and m.slot_tokens[1] == prompt[:want]
    lg = m.forward_batch([(1, prompt[want:])], all_logits=True)[0]
    ref = m.logits(prompt)  # slot 0, the whole prompt computed (chunks of 64)
    bad = np.flatnonzero(~(lg == ref[want:]).all(axis=1))
    assert bad.size == 0, f"positions {bad[:5] + want} differ, worst |diff| {np.abs(lg - ref[want:]).max()}"
    assert cache.stats()["hits"] == (1 if want else 0) and cache.stats()["hit_tokens"] == want


def test_lru_evicts_leaves_first_within_the_budget(model):
    m = model
    cache = PrefixCache(m, 4 * m.engine.kv_bytes(B), block=B)
    a, b = tokens(100, 4), tokens(100, 5)
    compute(m, 0, a)
    assert cache.store(0) == 3
    compute(m, 0, b)
    assert cache.store(0) == 3  # 6 blocks > 4: two of a's go, its last ones first
    s = cache.stats()
    assert s["blocks"] == 4 and s["evicted_blocks"] == 2 and s["bytes"] <= s["capacity_bytes"]
    m.rewind(0, slot=1)
    assert cache.load(a + [1], 1) == 32      # a keeps its first block
    m.rewind(0, slot=1)
    assert cache.load(b + [1], 1) == 96      # b is whole
    # a was used before b: a's last block is now the oldest; a new chain evicts it first
    c = tokens(40, 6)
    compute(m, 0, c)
    assert cache.store(0) == 1
    m.rewind(0, slot=1)
    assert cache.load(a + [1], 1) == 0
    m.rewind(0, slot=1)
    assert cache.load(b + [1], 1) == 96
    for blk in cache._blocks.values():  # no orphan: every block's parent is held
        assert blk.parent is None or blk.parent in cache._blocks
    off = PrefixCache(m, 0, block=B)
    compute(m, 0, a)
    assert off.store(0) == 0 and off.stats()["blocks"] == 0


def test_load_continues_a_whole_block_prefix_only(model):
    m = model
    cache = PrefixCache(m, 64 << 20, block=B)
    compute(m, 1, [1, 2, 3])
    with pytest.raises(ValueError, match="whole-block prefix"):
        cache.load([1, 2, 3, 4], 1)
    # a slot that got block 0 from the cache, then (once another request computed them) the rest
    ids = tokens(140, 7)
    compute(m, 0, ids[:40])
    cache.store(0)
    m.rewind(0, slot=1)
    assert cache.load(ids, 1) == 32
    compute(m, 0, ids[:130])
    cache.store(0)
    assert cache.load(ids, 1) == 96 and m.slot_pos[1] == 128
    lg = m.forward_batch([(1, ids[128:])], all_logits=True)[0]
    assert np.array_equal(lg, m.logits(ids)[128:])
    with pytest.raises(ValueError, match="whole-block prefix"):
        cache.load(tokens(140, 8), 1)  # not what the slot holds


# -- through the server ---------------------------------------------------------------------------
SYSTEM = "You are a careful assistant. " * 30  # ~180 tokens


@pytest.fixture(scope="module")
def server(path):
    with running("-m", path, "--ctx", "512", "--parallel", "2", "-t", "2",
                 "--cache-mb", "64", "--step-tokens", "48") as s:
        yield s


@pytest.fixture(scope="module")
def ref(path):
    return lowbit.load(path, n_ctx=512, threads=2)


def test_server_reuses_a_shared_system_prompt_and_the_last_turn(server, ref):
    client = openai_client(server.url, timeout=120)

    def ask(msgs, n=12):
        r = client.chat.completions.create(model="synth", messages=msgs, max_tokens=n, temperature=0)
        want, _, _ = alone(ref, chat_prompt(ref, msgs), n)
        assert r.choices[0].message.content == want  # the same text as computed without any cache
        return r

    sys_msg = {"role": "system", "content": SYSTEM}
    first = [sys_msg, {"role": "user", "content": "What is a prime number?"}]
    r1 = ask(first)
    n_sys = len(ref.tokenize(chat_prompt(ref, [sys_msg])))
    assert r1.usage.prompt_tokens_details.cached_tokens == 0
    r2 = ask([sys_msg, {"role": "user", "content": "Name a river."}])
    assert r2.usage.prompt_tokens_details.cached_tokens >= (n_sys // B - 1) * B > 0
    # the next turn holds the first turn's prompt and reply: reused beyond the system prompt
    turn2 = first + [{"role": "assistant", "content": r1.choices[0].message.content},
                     {"role": "user", "content": "And another?"}]
    r3 = ask(turn2)
    assert r3.usage.prompt_tokens_details.cached_tokens >= (r1.usage.prompt_tokens // B) * B > n_sys
    s = client.get("/status", cast_to=object)
    assert s["prefix_cache"]["hits"] >= 2 and s["prefix_cache"]["hit_tokens"] >= r3.usage.prompt_tokens_details.cached_tokens


def test_server_without_cache_reports_no_cached_tokens(path, ref):
    s = Server("-m", path, "--ctx", "512", "--parallel", "1", "-t", "2", "--cache-mb", "0")
    try:
        s.wait_ready()
        client = openai_client(s.url, timeout=120)
        msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hi"}]
        for _ in range(2):
            r = client.chat.completions.create(model="synth", messages=msgs, max_tokens=8, temperature=0)
            assert r.usage.prompt_tokens_details.cached_tokens == 0
            assert r.choices[0].message.content == alone(ref, chat_prompt(ref, msgs), 8)[0]
    finally:
        s.stop()


def test_concurrent_requests_compute_a_shared_prefix_once(server, ref):
    """Four clients send the same long system prompt at once: the prefix is computed once (the
    others wait for it and copy it), and each gets the text it gets alone."""
    import concurrent.futures as cf

    import httpx
    client = openai_client(server.url, timeout=120)
    sys_msg = {"role": "system", "content": "Shared context for everyone, told once. " * 25}
    jobs = [[sys_msg, {"role": "user", "content": f"Question number {i}?"}] for i in range(4)]
    want = [alone(ref, chat_prompt(ref, m), 6)[0] for m in jobs]
    n_prompt = [len(ref.tokenize(chat_prompt(ref, m))) for m in jobs]
    before = httpx.get(server.url + "/v1/status").json()["requests"]["prompt_tokens"]
    with cf.ThreadPoolExecutor(4) as ex:
        rs = list(ex.map(lambda m: client.chat.completions.create(model="synth", messages=m, max_tokens=6,
                                                                  temperature=0), jobs))
    assert [r.choices[0].message.content for r in rs] == want
    cached = [r.usage.prompt_tokens_details.cached_tokens for r in rs]
    computed = httpx.get(server.url + "/v1/status").json()["requests"]["prompt_tokens"] - before
    assert computed == sum(n_prompt) - sum(cached)
    # at most one request computed the shared blocks; the others (2 slots: the two running at
    # once, and the two after them) took them from the cache
    n_sys = len(ref.tokenize(chat_prompt(ref, [sys_msg])))
    assert sorted(cached)[1] >= (n_sys // B - 1) * B > 0, cached
