"""A load and fault test of a running `lowbit serve` (loopback): many concurrent clients, mixed
prompt and reply lengths, some streams cancelled mid-way, some bodies malformed.

    load_test(url, pid, clients=64, requests=2000, cancel=0.2, malformed=0.05)

Each of `requests` requests is, by a seeded draw: malformed (a broken body: it must get a 4xx
with OpenAI's error body), cancelled (a stream the client closes after a few chunks), or normal
(chat or completions, streaming or not, 1..max_tokens tokens, prompts of a few to a few hundred
tokens): it must end with finish_reason "stop" or "length" and usage counting the tokens, or
get a clear error (429 with Retry-After when the queue is full). After the run the server must
be alive, idle (nothing active or queued: no leaked slot), and its resident memory within
`rss_tolerance` of what it was after the warm-up. Returns the figures; `problems` lists every
broken expectation (empty: passed). Used by tests/test_serve_load.py (scaled down) and by
`lowbit bench serve --load N` (the full count, for BENCHMARKS.md).
"""
from __future__ import annotations

import collections
import concurrent.futures as cf
import json
import random
import threading
import time

WORDS = ("river stone light paper engine garden winter number silver market window music "
         "forest signal letter mountain question").split()
MALFORMED = [
    b"{not json", b"", b"[1, 2, 3]", b'{"prompt": 5, "max_tokens": 4}', b'{"messages": "hi"}',
    b'{"messages": [{"role": "wizard", "content": "hi"}]}', b'{"messages": [{"role": "user"}]}',
    b'{"prompt": "x", "max_tokens": -1}', b'{"prompt": "x", "temperature": "hot"}',
    b'{"prompt": "x", "n": 9}', b"\xff\xfe\xfd",
]


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _prompt(rng: random.Random, max_words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, max_words)))


def _status(url: str, headers: dict) -> dict:
    import httpx
    return httpx.get(url + "/v1/status", headers=headers, timeout=60).json()


def load_test(url: str, pid: int, clients: int = 64, requests: int = 2000, cancel: float = 0.2,
              malformed: float = 0.05, max_tokens: int = 48, max_words: int = 300, warmup: int = 16,
              seed: int = 0, rss_tolerance: float = 0.10, api_key: str | None = None, out=None) -> dict:
    import httpx
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    problems: list[str] = []
    counts: collections.Counter = collections.Counter()
    lock = threading.Lock()

    def problem(msg: str) -> None:
        with lock:
            if len(problems) < 50:
                problems.append(msg)

    def one(i: int, client: httpx.Client) -> None:
        rng = random.Random(seed * 1_000_003 + i)
        draw = rng.random()
        chat = rng.random() < 0.5
        path = "/v1/chat/completions" if chat else "/v1/completions"
        if draw < malformed:
            body = rng.choice(MALFORMED)
            r = client.post(url + path, content=body, headers={**headers, "Content-Type": "application/json"})
            ok = 400 <= r.status_code < 500 and set(r.json().get("error", {})) == {"message", "type", "param", "code"}
            if not ok:
                problem(f"request {i}: malformed body {body[:40]!r} got {r.status_code} {r.text[:120]}")
            with lock:
                counts["malformed"] += 1
            return
        n = rng.randint(1, max_tokens)
        text = _prompt(rng, max_words)
        body = {"max_tokens": n, "temperature": rng.choice([0, 0.8]), "seed": i}
        body.update({"messages": [{"role": "user", "content": text}]} if chat else {"prompt": text})
        cancelled = draw < malformed + cancel
        stream = cancelled or rng.random() < 0.5
        if not stream:
            r = client.post(url + path, json=body, headers=headers)
            if r.status_code == 429 and r.headers.get("retry-after"):
                with lock:
                    counts["busy"] += 1
                return
            if r.status_code != 200:
                problem(f"request {i}: {r.status_code} {r.text[:200]}")
                return
            d = r.json()
            reason, used = d["choices"][0]["finish_reason"], d["usage"]["completion_tokens"]
            if reason not in ("stop", "length") or not 0 <= used <= n or (reason == "length" and used != n):
                problem(f"request {i}: finish {reason!r} with {used} of {n} tokens")
            with lock:
                counts["completed"] += 1
            return
        body["stream"] = True
        keep = rng.randint(1, 4)  # chunks a cancelling client reads before it hangs up
        with client.stream("POST", url + path, json=body, headers=headers) as r:
            if r.status_code == 429 and r.headers.get("retry-after"):
                with lock:
                    counts["busy"] += 1
                return
            if r.status_code != 200:
                r.read()
                problem(f"request {i}: {r.status_code} {r.text[:200]}")
                return
            seen, last, done = 0, None, False
            for line in r.iter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    done = True
                    break
                ev = json.loads(line[6:])
                if "error" in ev:
                    problem(f"request {i}: error event {ev['error']}")
                    return
                seen += 1
                if ev.get("choices"):
                    last = ev
                if cancelled and seen >= keep:
                    break  # hang up mid-stream (the with-block closes the connection)
        if cancelled and not done:
            with lock:
                counts["cancelled"] += 1
            return
        if not done or last is None:
            problem(f"request {i}: the stream ended without [DONE]")
            return
        reason, used = last["choices"][0]["finish_reason"], last["usage"]["completion_tokens"]
        if reason not in ("stop", "length") or not 0 <= used <= n or (reason == "length" and used != n):
            problem(f"request {i}: finish {reason!r} with {used} of {n} tokens")
        with lock:
            counts["completed" if not cancelled else "cancel_too_late"] += 1

    def run(n_requests: int, base: int) -> float:
        it = iter(range(base, base + n_requests))
        take = threading.Lock()
        t0 = time.perf_counter()

        def worker():
            with httpx.Client(timeout=600) as client:
                while True:
                    with take:
                        i = next(it, None)
                    if i is None:
                        return
                    try:
                        one(i, client)
                    except httpx.HTTPError as e:
                        problem(f"request {i}: {type(e).__name__}: {e}")

        with cf.ThreadPoolExecutor(clients) as ex:
            list(ex.map(lambda _: worker(), range(clients)))
        return time.perf_counter() - t0

    # warm up until the prefix cache holds its budget (its bytes are meant to stay): memory that
    # grows after this is what the test is after
    for k in range(20):
        run(warmup, 10**9 + k * warmup)
        pc = _status(url, headers).get("prefix_cache")
        if not pc or pc["bytes"] + 4 * pc["bytes"] // max(pc["blocks"], 1) >= pc["capacity_bytes"]:
            break
    # and until the server has committed the slots' KV cache it commits after load (kv.slots_ahead)
    from .bench import _slots_committed
    _slots_committed(url, headers=headers)
    counts.clear()
    rss0 = rss_mb(pid)
    wall = run(requests, 0)
    # cancelled streams are dropped by the engine before its next step: wait until it is idle
    end = time.monotonic() + 60
    s = _status(url, headers)
    while (s["requests"]["active"] or s["requests"]["queued"]) and time.monotonic() < end:
        time.sleep(0.05)
        s = _status(url, headers)
    rss1 = rss_mb(pid)
    r = s["requests"]
    if r["active"] or r["queued"]:
        problem(f"not idle after the run: {r['active']} active, {r['queued']} queued")
    if r.get("free_slots") != s["parallel"]:
        problem(f"leaked slots: {r.get('free_slots')} of {s['parallel']} free")
    if not rss1 <= rss0 * (1 + rss_tolerance):
        problem(f"RSS grew from {rss0:.0f} MB to {rss1:.0f} MB (more than {rss_tolerance:.0%})")
    pc = s.get("prefix_cache")
    res = {"requests": requests, "clients": clients, "wall_s": wall, "counts": dict(counts),
           "prefix_cache_mb": pc["bytes"] / 2**20 if pc else 0.0,
           "rss_after_warmup_mb": rss0, "rss_after_run_mb": rss1, "status": r, "problems": problems}
    if out is not None:
        print(f"load test: {requests} requests from {clients} clients in {wall:.1f} s: "
              f"{dict(sorted(counts.items()))}; RSS {rss0:.0f} MB after warm-up, {rss1:.0f} MB after "
              f"({(rss1 / rss0 - 1) * 100:+.1f}%), prefix cache {res['prefix_cache_mb']:.1f} MB; server: {r['done']} done, {r['cancelled']} cancelled, "
              f"{r['failed']} failed, {r['active']} active, {r.get('free_slots')}/{s['parallel']} slots free; "
              f"{len(problems)} problems", file=out, flush=True)
        for p in problems[:10]:
            print(f"  {p}", file=out)
    return res
