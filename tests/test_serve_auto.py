"""`lowbit serve` without --parallel: as many slots as fit (load(n_slots="auto"), up to 16), the
KV cache of a slot committed at its first use (the engine's ZeroArray) or ahead of it (the server's
slots, after load), and 8 concurrent clients decoding together rather than 4 at a time (the default
before)."""
import concurrent.futures as cf
import json
import os
import threading
import time

import httpx
import pytest

import lowbit
import lowbit.model
from lowbit.model import AUTO_SLOTS, auto_slots
from serve_util import Server


def rss_mb() -> float:
    with open(f"/proc/{os.getpid()}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


@pytest.fixture(scope="module")
def model16():
    return lowbit.load(None, n_ctx=2048, threads=2, n_slots=AUTO_SLOTS)


def test_auto_slots_fit_half_the_free_memory(model16, monkeypatch):
    per = model16.engine.kv_bytes(2048)
    assert per > 10 * 2**20  # (the default model: 30 layers x 3 KV heads x 64 x 2 halves x 2048)
    for avail, want in ((None, 16), (2 * 16 * per, 16), (2 * 5 * per + per // 2, 5), (per // 3, 1), (10**15, 16)):
        monkeypatch.setattr(lowbit.model, "_mem_available", lambda a=avail: a)
        assert auto_slots(per) == want, (avail, want)
    monkeypatch.setattr(lowbit.model, "_mem_available", lambda: 10**15)
    assert auto_slots(per, most=3) == 3
    # load(n_slots="auto") sizes the slots by the model's own cache
    monkeypatch.setattr(lowbit.model, "_mem_available", lambda: 2 * 5 * per + per // 2)
    assert lowbit.load(None, n_ctx=2048, n_slots="auto").n_slots == 5
    for bad in ("many", 0, -2, 2.5):
        with pytest.raises(ValueError, match="n_slots must be an integer >= 1 or 'auto'"):
            lowbit.load(None, n_ctx=64, n_slots=bad)


def test_a_slot_that_cannot_be_resident_is_an_error_not_a_kill():
    """A cache larger than the free memory fails with an error naming what to lower: at load
    where the kernel refuses to reserve it (its overcommit policy), else at the slot's first use
    (the process is not left to the OOM killer)."""
    avail = lowbit.model._mem_available()
    n_ctx = int(avail * 1.5 // 23040)  # positions whose cache (23040 B each) is ~1.5x the free memory
    with pytest.raises((MemoryError, RuntimeError), match="lower the context") as e:
        m = lowbit.load(None, n_ctx=n_ctx, threads=2)
        assert m.engine.kv_bytes(n_ctx) == n_ctx * 23040
        m.forward_batch([(0, m.tokenize("hi"))])
    assert "out of memory allocating the KV cache" in str(e.value) or "does not fit in the memory available" in str(e.value)


def test_kv_slots_committed_at_first_use(model16):
    """A slot's cache is resident memory only once a sequence runs in it: 16 slots of 2048
    positions (45 MB each) load with none of it, and each slot's first use adds one slot."""
    m = model16
    per = m.engine.kv_bytes(2048) / 2**20
    ids = m.tokenize("The sea was calm that morning")
    m.forward_batch([(0, ids)])  # the weights' pages and slot 0
    r1 = rss_mb()
    m.forward_batch([(s, ids) for s in (1, 2, 3, 4)])
    r5 = rss_mb()
    grew = r5 - r1
    assert 3.5 * per <= grew <= 4.5 * per, f"4 slots' first use grew RSS by {grew:.0f} MB, one slot is {per:.0f} MB"
    # a slot used again takes nothing more
    for s in (1, 2, 3, 4):
        m.rewind(0, s)
    m.forward_batch([(s, ids) for s in (1, 2, 3, 4)])
    assert rss_mb() - r5 < 0.5 * per
    # and the slots' results are those of one sequence alone (a fresh cache reads as zeros)
    alone = lowbit.load(None, n_ctx=2048, threads=2)
    want = alone.forward_batch([(0, ids)])[0]
    m.rewind(0, 9)
    got = m.forward_batch([(9, ids)])[0]
    assert (got == want).all()


def test_commit_slots_ahead_of_first_use():
    """Engine.commit_slots(n) makes slots [0, n) resident now (what `lowbit serve` does on a thread
    of its own after load, so a first burst of requests does not wait for fresh memory): each
    slot once, the count reported, a slot committed ahead reads as a fresh one."""
    m = lowbit.load(None, n_ctx=2048, threads=2, n_slots=4)
    per = m.engine.kv_bytes(2048) / 2**20
    ids = m.tokenize("The sea was calm that morning")
    want = m.forward_batch([(0, ids)])[0]  # slot 0 by its first use
    assert m.engine.slots_committed == 1
    r1 = rss_mb()
    m.engine.commit_slots(3)
    r3 = rss_mb()
    assert m.engine.slots_committed == 3
    assert 1.5 * per <= r3 - r1 <= 2.5 * per, f"committing slots 1, 2 grew RSS by {r3 - r1:.0f} MB, one slot is {per:.0f} MB"
    m.engine.commit_slots(99)  # (clamped to the engine's slots; slots already committed: nothing)
    assert m.engine.slots_committed == 4
    assert (m.forward_batch([(2, ids)])[0] == want).all()


def test_serve_commits_its_slots_after_load():
    """The server commits its slots' KV cache after load, before any request (/v1/status's
    kv.slots_committed), as many slots as fit in KV_AHEAD_BYTES (kv.slots_ahead): here all 3."""
    s = Server("--ctx", "512", "-t", "2", "--parallel", "3")
    try:
        s.wait_ready()
        end, kv = time.monotonic() + 120, None
        while time.monotonic() < end:  # (a guard against a hang, not a timing check)
            kv = httpx.get(s.url + "/v1/status", timeout=30).json()["kv"]
            if kv["slots_committed"] == 3:
                break
            time.sleep(0.05)
        assert kv["slots_ahead"] == 3 and kv["slots_committed"] == 3, kv
    finally:
        s.stop()


def test_slots_committed_ahead_are_bounded():
    """kv_slots_ahead: the slots whose caches fit in KV_AHEAD_BYTES in all, at least one, at most
    the server's."""
    from types import SimpleNamespace

    from lowbit.server.app import KV_AHEAD_BYTES, kv_slots_ahead

    def model(per):
        return SimpleNamespace(n_ctx=100, engine=SimpleNamespace(kv_bytes=lambda n: per))
    assert kv_slots_ahead(model(KV_AHEAD_BYTES // 16), 16) == 16
    assert kv_slots_ahead(model(KV_AHEAD_BYTES // 16), 4) == 4
    assert kv_slots_ahead(model(KV_AHEAD_BYTES // 5 + 1), 16) == 4
    assert kv_slots_ahead(model(KV_AHEAD_BYTES * 3), 16) == 1


def test_serve_default_runs_eight_clients_together():
    """No --parallel: the startup line names the slots chosen, /v1/status reports them, and 8
    concurrent streams are all active at once (with 4 slots, 4 would wait)."""
    s = Server("--ctx", "512", "-t", "2")
    try:
        s.wait_ready()
        st = httpx.get(s.url + "/v1/status", timeout=30).json()
        assert 8 <= st["parallel"] <= AUTO_SLOTS
        assert f"lowbit serve: {st['parallel']} parallel sequences (--parallel auto" in s.output()
        seen, done = [], threading.Event()

        def stream(i):
            body = {"prompt": f"Story {i}: once upon a time", "max_tokens": 48, "temperature": 0, "stream": True,
                    "logit_bias": {"2": -100, "0": -100}}
            n = 0
            with httpx.stream("POST", s.url + "/v1/completions", json=body, timeout=300) as r:
                assert r.status_code == 200
                for line in r.iter_lines():
                    if line.startswith("data: {"):
                        n += bool(json.loads(line[6:])["choices"][0].get("text"))
            return n

        def watch():
            while not done.is_set():
                seen.append(httpx.get(s.url + "/v1/status", timeout=30).json()["requests"]["active"])
                time.sleep(0.01)

        w = threading.Thread(target=watch)
        w.start()
        with cf.ThreadPoolExecutor(8) as ex:
            counts = list(ex.map(stream, range(8)))
        done.set()
        w.join()
        assert counts == [48] * 8
        assert max(seen) == 8, f"at most {max(seen)} of 8 streams were active at once"
    finally:
        s.stop()
