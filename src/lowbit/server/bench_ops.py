"""`lowbit bench serve --prefix N` and `--load N`: the prefix cache's time to first token and the
load and fault test, against a `lowbit serve` subprocess (loopback, the default model).

    --prefix N   a chat whose system prompt has ~N tokens: time to the first token when that
                 system prompt is new (cold: every round a different one) against when it was
                 seen before (cached: the same one, a different user question); medians over
                 --rounds rounds, measured in one run, and the ratio
    --load N     lowbit.server.loadtest.load_test with N requests from --load-clients clients
                 (20% cancelled mid-stream, 5% malformed), its figures and problems
"""
from __future__ import annotations

import json
import random
import statistics
import sys
import time

from .loadtest import WORDS, load_test


def _ttft(url: str, messages: list[dict], bias: dict) -> tuple[float, int]:
    """Seconds from sending to the first streamed text, and the cached prompt tokens reported."""
    import httpx
    body = {"messages": messages, "max_tokens": 2, "temperature": 0, "stream": True, "logit_bias": bias,
            "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    first, cached = float("nan"), -1
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if first != first and ev.get("choices") and ev["choices"][0]["delta"].get("content"):
                first = time.perf_counter() - t0
            if ev.get("usage"):
                cached = ev["usage"].get("prompt_tokens_details", {}).get("cached_tokens", -1)
    return first, cached


def prefix_ttft(url: str, tokenize, n_tokens: int, rounds: int, bias: dict, out=sys.stdout) -> dict:
    rng = random.Random(1)

    def system() -> str:
        words = []
        while len(tokenize(" ".join(words))) < n_tokens:
            words += [rng.choice(WORDS) for _ in range(64)]
        return "You answer questions about this text. " + " ".join(words)

    shared = {"role": "system", "content": system()}
    n_sys = len(tokenize(shared["content"]))
    # warm-up: the shared prompt is cached; the second request, branching off the first after the
    # system prompt, leaves a hybrid model's recurrent state there (prefix.py snapshot_points)
    for q in ("Warm up.", "Warm up again."):
        _ttft(url, [shared, {"role": "user", "content": q}], bias)
    cold, warm, hits = [], [], []
    for i in range(rounds):
        c, _ = _ttft(url, [{"role": "system", "content": system()}, {"role": "user", "content": f"Question {i}?"}],
                     bias)
        w, n = _ttft(url, [shared, {"role": "user", "content": f"Question {i}?"}], bias)
        cold.append(c)
        warm.append(w)
        hits.append(n)
        print(f"  round {i}: cold {c * 1e3:7.1f} ms, cached {w * 1e3:7.1f} ms ({n} prompt tokens from the cache)",
              file=out, flush=True)
    res = {"system_tokens": n_sys, "cold_ms": statistics.median(cold) * 1e3, "cached_ms": statistics.median(warm) * 1e3,
           "cached_tokens": min(hits)}
    res["ratio"] = res["cached_ms"] / res["cold_ms"]
    print(f"TTFT with a {n_sys}-token system prompt: cold {res['cold_ms']:.1f} ms, cached {res['cached_ms']:.1f} ms "
          f"(median of {rounds}): {res['ratio']:.3f}x ({res['cached_tokens']} tokens reused)", file=out, flush=True)
    return res


def bench_ops(proc_factory, path: str, threads: int, prefix: int, load: int, load_clients: int, rounds: int,
              parallel: int, out=sys.stdout) -> dict:
    """proc_factory(argv, ready_path) starts a server (server/bench.py's _Proc)."""
    from .. import gguf
    from ..tokenizer import Tokenizer
    with gguf.open(path) as f:
        tok = Tokenizer.from_gguf(f.metadata)
    bias = {str(t): -100 for t in sorted(tok.eog_ids)}  # the first token is text, never the end
    res = {}
    base = [sys.executable, "-m", "lowbit.cli", "serve", "-m", path, "-t", str(threads), "--no-access-log"]
    if prefix:
        p = proc_factory(base + ["--parallel", "1", "--ctx", str(max(2048, prefix + 256)), "--cache-mb", "256"],
                         "/health")
        try:
            print(f"# prefix cache: {path}, {threads} threads, chat with a ~{prefix}-token system prompt, "
                  f"streaming, greedy", file=out, flush=True)
            res["prefix"] = prefix_ttft(p.url, tok.encode, prefix, rounds, bias, out)
        finally:
            p.stop()
    if load:
        p = proc_factory(base + ["--parallel", str(parallel), "--ctx", "1024", "--cache-mb", "64"], "/health")
        try:
            print(f"# load test: {path}, {threads} threads, --parallel {parallel}, {load_clients} clients, {load} "
                  f"requests of 2..60 words and 1..32 tokens (20% cancelled mid-stream, 5% malformed)", file=out,
                  flush=True)
            res["load"] = load_test(p.url, p.proc.pid, clients=load_clients, requests=load, max_tokens=32,
                                    max_words=60, out=out)
        finally:
            p.stop()
    return res
