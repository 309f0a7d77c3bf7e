"""`lowbit bench serve`: lowbit's server against llama-cpp-python's, same model, threads, clients.

    lowbit bench serve [-m MODEL] [-t 2] [--clients 8] [--tokens 128] [--rounds 3]
                       [--rss-requests 200] [--no-llama]
    lowbit bench serve --lookup | --draft MODEL [--spec K] [--copy] [...]   speculative A/B (bench_spec)

Both servers run as subprocesses on loopback, one after the other (never at the same time:
they would share the cores). Each is measured with one streaming client, then with --clients
concurrent streaming clients, --tokens tokens each (the end-of-generation tokens are banned with
logit_bias, so every client gets exactly --tokens tokens), greedy, /v1/completions with a
different prompt per client. Reported per server, medians over --rounds rounds:
  - aggregate tokens/s: all clients' tokens / wall time from the first request to the last token;
  - time to first token (the first chunk with text), p50 and p99 over all rounds' clients;
  - lowbit's engine step ceiling: --clients x one batched decode step of one sequence / one of
    --clients sequences (step_ceiling, the server stopped), the ratio the step itself allows.
Then lowbit alone serves --rss-requests short requests from --clients clients while its resident
memory (VmRSS) is sampled: it should not grow past what the KV slots take at start.
llama-cpp-python's server runs with --interrupt_requests False: it queues concurrent requests
(by default a new request cuts the running one short).
"""
from __future__ import annotations

import concurrent.futures as cf
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse

PROMPTS = ["Once upon a time, in a kingdom by the sea,", "The history of the printing press begins",
           "def quicksort(items):", "Ten facts about the planet Jupiter:", "Dear diary, today I",
           "The recipe for a good bread starts with", "In 1969, the first humans", "Here is a long poem about rain:"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Proc:
    def __init__(self, argv: list[str], ready_path: str):
        import httpx
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(argv + ["--port", str(self.port)], stdout=self.log, stderr=subprocess.STDOUT)
        end = time.monotonic() + 600
        while True:
            if self.proc.poll() is not None:
                self.log.seek(0)
                from ..peer import describe_exit
                tail = self.log.read().decode(errors="replace").strip().splitlines()[-3:]
                raise RuntimeError(f"{' '.join(argv[1:4])} exited with {describe_exit(self.proc.returncode)}: "
                                   + " | ".join(tail))
            try:
                if httpx.get(self.url + ready_path, timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > end:
                raise RuntimeError(f"{argv[:4]} did not start")
            time.sleep(0.1)

    def rss_mb(self) -> float:
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        return float("nan")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _stream(url: str, prompt: str, tokens: int, bias: dict, t0: float) -> tuple[int, float, float]:
    """One streaming completion: (tokens, time to the first text, time of the last), times from t0
    (seconds); tokens from the last event's usage (else the events with text).

    The load generator shares the server's cores here, so it is the standard library's HTTP
    client, not httpx: httpx's streaming took 0.7-0.8 ms of CPU per token against 0.1-0.2 for
    this, CPU the server's threads lost (BENCHMARKS.md, "the benchmark's own client")."""
    parts = urllib.parse.urlsplit(url)
    body = json.dumps({"prompt": prompt, "max_tokens": tokens, "temperature": 0, "stream": True, "logit_bias": bias})
    n, first, last = 0, float("nan"), float("nan")
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=600)
    try:
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        r = conn.getresponse()
        if r.status != 200:
            raise RuntimeError(f"HTTP {r.status} from {url}/v1/completions: {r.read()[:200]!r}")
        while line := r.readline():  # the SSE lines, through the chunked transfer encoding
            if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                continue
            ev = json.loads(line[6:])
            if ev.get("usage"):  # tokens, not events (with --coalesce an event carries several)
                n = ev["usage"]["completion_tokens"]
            elif ev.get("choices") and ev["choices"][0].get("text"):
                now = time.perf_counter() - t0
                if n == 0:
                    first = now
                last = now
                n += 1
    finally:
        conn.close()
    return n, first, last


def _slots_committed(url: str, limit_s: float = 600.0, headers: dict | None = None) -> None:
    """Wait until lowbit's server has committed the slots' KV cache it commits after load (on a
    thread of its own, /v1/status kv.slots_ahead): the rounds then measure steps, not the first
    touch of that memory. (The load test's wait too: headers for a server with an API key.)"""
    import httpx
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        kv = httpx.get(url + "/v1/status", timeout=30, headers=headers).json().get("kv", {})
        if (kv.get("slots_committed") or 0) >= (kv.get("slots_ahead") or 0):
            return
        time.sleep(0.05)


def _round(url: str, clients: int, tokens: int, bias: dict, prompts: list[str] = PROMPTS) -> tuple[float, list[float], int]:
    """clients concurrent streams: (aggregate tokens/s, TTFTs, tokens)."""
    t0 = time.perf_counter()
    with cf.ThreadPoolExecutor(clients) as ex:
        res = list(ex.map(lambda i: _stream(url, prompts[i % len(prompts)], tokens, bias, t0), range(clients)))
    total = sum(r[0] for r in res)
    wall = max(r[2] for r in res)
    return total / wall, [r[1] for r in res], total


def _pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, int(round(p / 100 * len(xs) + 0.5)) - 1))]


def _measure(name: str, url: str, clients: int, tokens: int, rounds: int, bias: dict, out,
             prompts: list[str] = PROMPTS) -> dict:
    _round(url, 1, 8, bias, prompts)  # warm-up
    one, many, ttft, counts = [], [], [], []
    for _ in range(rounds):
        r1, _, _ = _round(url, 1, tokens, bias, prompts)
        rn, tt, total = _round(url, clients, tokens, bias, prompts)
        one.append(r1)
        many.append(rn)
        ttft += tt
        counts.append(total)
        print(f"  {name}: 1 client {r1:7.1f} tok/s, {clients} clients {rn:7.1f} tok/s "
              f"({total} tokens), TTFT max {max(tt) * 1e3:.0f} ms", file=out, flush=True)
    return {"one": statistics.median(one), "many": statistics.median(many), "ttft50": _pct(ttft, 50),
            "ttft99": _pct(ttft, 99), "tokens": counts}


def _rss(proc: _Proc, clients: int, requests: int, bias: dict, out) -> dict:
    import httpx
    samples = [proc.rss_mb()]
    done = 0

    def one(i):
        body = {"prompt": PROMPTS[i % len(PROMPTS)] + f" ({i})", "max_tokens": 16, "temperature": 0.7,
                "seed": i, "logit_bias": bias, "stream": i % 2 == 0}
        r = httpx.post(proc.url + "/v1/completions", json=body, timeout=600)
        r.raise_for_status()

    with cf.ThreadPoolExecutor(clients) as ex:
        for _ in ex.map(one, range(requests)):
            done += 1
            if done % 25 == 0:
                samples.append(proc.rss_mb())
    print(f"  lowbit RSS (MB) every 25 requests: {' '.join(f'{s:.0f}' for s in samples)}", file=out)
    return {"start": samples[0], "end": samples[-1], "max": max(samples)}


def decode_steps(m, n: int, secs: float) -> float:
    """Wall seconds per batched decode step of slots 0..n-1 (one token each, a different one per
    slot, rewound after each step so the positions stay put), steps back to back for `secs`
    seconds. (Slots holding the same prompt and token would route every sequence of a MoE to the
    same experts: a step cheaper than a server's, whose requests differ.)"""
    k, t0 = 0, time.perf_counter()
    while k == 0 or time.perf_counter() - t0 < secs:
        m.forward_batch([(s, [42 + 97 * s]) for s in range(n)])
        for s in range(n):
            m.rewind(m.slot_pos[s] - 1, s)
        k += 1
    return (time.perf_counter() - t0) / k


def step_ceiling(model_path: str, threads: int, n: int, secs: float = 1.5, reps: int = 3) -> dict:
    """The engine's own bound on n clients' throughput against one client's: n * t(1) / t(n), t(k)
    the wall time of one batched decode step of k sequences (decode_steps; medians of `reps`
    alternations), each sequence past a short prompt. Measured in this process with no server
    running. A `bench serve` ratio near it is bound by the step, not by the server around it."""
    import lowbit
    m = lowbit.load(model_path, n_ctx=256, threads=threads, n_slots=n)
    for s in range(n):  # each slot its own prompt, as the clients' (a MoE routes each its own way)
        m.rewind(0, s)
        m.forward_batch([(s, m.tokenize(PROMPTS[s % len(PROMPTS)]))])
    one, many = [], []
    for _ in range(reps):
        one.append(decode_steps(m, 1, secs))
        many.append(decode_steps(m, n, secs))
    t1, tn = statistics.median(one), statistics.median(many)
    return {"one_ms": t1 * 1e3, "many_ms": tn * 1e3, "ceiling": n * t1 / tn}


def bench_serve(model_path: str | None, threads: int, clients: int, tokens: int, rounds: int, rss_requests: int,
                llama: bool = True, out=sys.stdout) -> dict:
    from .. import gguf
    from ..model import default_model_path
    from ..tokenizer import Tokenizer
    path = model_path or default_model_path()
    with gguf.open(path) as f:
        eog = Tokenizer.from_gguf(f.metadata).eog_ids
    bias = {str(t): -100 for t in sorted(eog)}  # every client gets exactly `tokens` tokens
    ctx = 1024
    print(f"# {os.path.basename(path)}, {threads} threads, {clients} concurrent streaming clients x {tokens} "
          f"tokens, loopback, greedy; median of {rounds} rounds", file=out, flush=True)
    res = {}
    lb = _Proc([sys.executable, "-m", "lowbit.cli", "serve", "-m", path, "-t", str(threads), "--parallel",
                str(clients), "--ctx", str(ctx)], "/health")
    try:
        kv_mb = lb.rss_mb()
        _slots_committed(lb.url)
        res["lowbit"] = _measure("lowbit", lb.url, clients, tokens, rounds, bias, out)
        res["rss"] = _rss(lb, clients, rss_requests, bias, out) if rss_requests else None
        res["rss_after_load"] = kv_mb
    finally:
        lb.stop()
    res["step"] = step_ceiling(path, threads, clients)  # (the server stopped: the cores are the engine's)
    if llama:  # llama-cpp-python's server, in the configuration that survives here (lowbit.peer)
        from .. import peer
        try:
            cfg = peer.config(path, threads=threads)
            res["peer"] = cfg.line()
            print(f"# {cfg.line()}", file=out, flush=True)
            ll = _Proc(peer.server_argv(path, ["--n_threads", str(threads), "--n_threads_batch", str(threads),
                                               "--n_ctx", str(ctx * 2), "--verbose", "False",
                                               "--interrupt_requests", "False", "--host", "127.0.0.1"],
                                        threads=threads), "/v1/models")
        except RuntimeError as e:  # llama.cpp died in the probe or while starting
            res["peer_crashed"] = str(e) if isinstance(e, peer.PeerCrashed) else f"peer crashed: {e}"
            print(f"# {res['peer_crashed']}", file=out, flush=True)
        else:
            try:
                res["llama"] = _measure("llama.cpp server", ll.url, clients, tokens, rounds, bias, out)
            except Exception as e:  # noqa: BLE001 - the peer died mid-stream: report, keep lowbit's figures
                code = ll.proc.poll()
                why = peer.describe_exit(code) if code is not None else f"{type(e).__name__}: {e}"
                res["peer_crashed"] = f"peer crashed: llama_cpp.server died mid-stream ({why})"
                print(f"# {res['peer_crashed']}", file=out, flush=True)
            finally:
                ll.stop()
    L = res["lowbit"]
    print(file=out)
    print(f"{'':34} {'lowbit serve':>14} {'llama_cpp.server':>17}", file=out)
    ll = res.get("llama")

    def row(label, key, fmt):
        b = fmt.format(ll[key]) if ll else "-"
        print(f"{label:34} {fmt.format(L[key]):>14} {b:>17}", file=out)

    row("1 client tok/s", "one", "{:.1f}")
    row(f"{clients} clients aggregate tok/s", "many", "{:.1f}")
    print(f"{'aggregate / 1 client':34} {L['many'] / L['one']:>14.2f} "
          f"{(ll['many'] / ll['one']) if ll else float('nan'):>17.2f}", file=out)
    st = res["step"]
    print(f"{'engine step ceiling':34} {st['ceiling']:>14.2f}   ({clients} x {st['one_ms']:.2f} ms one-token step / "
          f"{st['many_ms']:.2f} ms {clients}-token step)", file=out)
    print(f"{'TTFT p50 / p99 (ms)':34} {L['ttft50'] * 1e3:>7.0f} / {L['ttft99'] * 1e3:<5.0f}"
          + (f" {ll['ttft50'] * 1e3:>9.0f} / {ll['ttft99'] * 1e3:<5.0f}" if ll else ""), file=out)
    if ll:
        print(f"lowbit {clients}-client aggregate / llama_cpp.server's: {L['many'] / ll['many']:.2f}x", file=out)
    print(f"lowbit RSS right after load: {res['rss_after_load']:.0f} MB (as it became ready: its slots' KV cache is committed after that)", file=out)
    if res["rss"]:
        r = res["rss"]
        print(f"lowbit RSS: {r['start']:.0f} MB after load and warm-up ({clients} KV slots x {ctx} tokens "
              f"allocated), {r['end']:.0f} MB after {rss_requests} more requests (max {r['max']:.0f}): "
              f"growth {r['end'] - r['start']:+.0f} MB", file=out)
    return res


# --copy: a passage, then the request to repeat it (the output copies the prompt: lookup's case)
PASSAGE = ("The printing press was invented in the fifteenth century. It used movable metal type, oil-based "
           "ink and a wooden press adapted from those that made wine. Books became cheaper, more people learned "
           "to read, and ideas travelled faster than ever before. Within fifty years, presses were at work in "
           "more than two hundred cities across Europe, and millions of books had been printed.")


def copy_prompts() -> list[str]:
    """Eight copy tasks: the passage with its sentences rotated, then "again, word for word"."""
    sents = [x.strip() + "." for x in PASSAGE.split(".") if x.strip()]
    out = []
    for i in range(8):
        text = " ".join(sents[i % len(sents):] + sents[:i % len(sents)])
        out.append(f"{text}\n\nThe same text again, word for word:\n")
    return out


def bench_spec(model_path: str | None, threads: int, clients: int, tokens: int, rounds: int, lookup: bool,
               draft: str | None, k: int, copy: bool = False, out=sys.stdout) -> dict:
    """lowbit serve without and with speculative decoding (--lookup or --draft MODEL, --spec k),
    one server after the other, same prompts (greedy: the same tokens), 1 and `clients` streaming
    clients: aggregate tokens/s of each and the ratios with / without, measured in this run; the
    acceptance rate from /v1/status. copy: copy-task prompts (copy_prompts) instead of PROMPTS."""
    import httpx
    from ..model import default_model_path
    from .. import gguf
    from ..tokenizer import Tokenizer
    path = model_path or default_model_path()
    with gguf.open(path) as f:
        eog = Tokenizer.from_gguf(f.metadata).eog_ids
    bias = {str(t): -100 for t in sorted(eog)}
    flag = ["--lookup"] if lookup else ["--draft", draft]
    name = "lookup" if lookup else f"draft {os.path.basename(draft)}"
    prompts = copy_prompts() if copy else PROMPTS
    print(f"# {os.path.basename(path)}, {threads} threads, 1 and {clients} streaming clients x {tokens} tokens, "
          f"loopback, greedy, {'copy-task' if copy else 'open-ended'} prompts; plain vs speculative ({name}, "
          f"k={k}); median of {rounds} rounds", file=out, flush=True)
    res = {}
    for label, extra in (("plain", []), ("spec", flag + ["--spec", str(k)])):
        p = _Proc([sys.executable, "-m", "lowbit.cli", "serve", "-m", path, "-t", str(threads), "--parallel",
                   str(clients), "--ctx", "1024", "--cache-mb", "0", *extra], "/health")
        try:
            _slots_committed(p.url)
            res[label] = _measure(f"lowbit {label}", p.url, clients, tokens, rounds, bias, out, prompts)
            res[label]["status"] = httpx.get(p.url + "/v1/status", timeout=30).json()
        finally:
            p.stop()
    a, b = res["plain"], res["spec"]
    sp = b["status"]["spec"] or {}
    print(file=out)
    print(f"{'':28} {'plain':>9} {'speculative':>12} {'ratio':>7}", file=out)
    for label, key in (("1 client tok/s", "one"), (f"{clients} clients aggregate tok/s", "many")):
        print(f"{label:28} {a[key]:>9.1f} {b[key]:>12.1f} {b[key] / a[key]:>7.2f}", file=out)
    print(f"drafts: {sp.get('accepted')}/{sp.get('drafted')} accepted (rate {sp.get('acceptance_rate')}), "
          f"{sp.get('windows')} windows with drafts", file=out)
    res["ratio_one"], res["ratio_many"] = b["one"] / a["one"], b["many"] / a["many"]
    return res


def add_parser(bs) -> None:
    """`lowbit bench serve` (bs: the bench command's sub-parsers)."""
    s = bs.add_parser("serve", help="lowbit serve vs llama-cpp-python's server: concurrent clients, TTFT, RSS",
                      description=__doc__.split("\n\n", 2)[2] if __doc__ else None,
                      formatter_class=__import__("argparse").RawDescriptionHelpFormatter)
    s.add_argument("-m", "--model", default=None, help="GGUF file (default: the default model)")
    s.add_argument("-t", "--threads", type=int, default=2)
    s.add_argument("--clients", type=int, default=8)
    s.add_argument("--tokens", type=int, default=128)
    s.add_argument("--rounds", type=int, default=3)
    s.add_argument("--rss-requests", type=int, default=200)
    s.add_argument("--no-llama", action="store_true", help="lowbit only")
    s.add_argument("--prefix", type=int, default=0, metavar="N",
                   help="instead: TTFT with a cached N-token system prompt vs cold (server/bench_ops.py)")
    s.add_argument("--load", type=int, default=0, metavar="N",
                   help="instead: the load and fault test with N requests (server/loadtest.py)")
    s.add_argument("--load-clients", type=int, default=64)
    s.add_argument("--ray", action="store_true", help="instead: lowbit serve --ray (Ray Serve replicas, proxy and "
                   "haproxy ingress) vs one process (server/bench_ray.py; pip install 'lowbit[ray]')")
    s.add_argument("--replicas", type=int, default=2, help="with --ray: the replicas of the multi-replica rows")
    s.add_argument("--coalesce", type=int, default=1, help="with --ray: also a row with N tokens per SSE event")
    x = s.add_mutually_exclusive_group()
    x.add_argument("--lookup", action="store_true", help="instead: lowbit serve without vs with --lookup")
    x.add_argument("--draft", default=None, metavar="MODEL", help="instead: lowbit serve without vs with --draft MODEL")
    s.add_argument("--spec", type=int, default=4, metavar="K", help="with --lookup / --draft: drafts per window")
    s.add_argument("--copy", action="store_true", help="with --lookup / --draft: copy-task prompts (the reply "
                   "repeats a passage of the prompt) instead of open-ended ones")
    from .. import plot
    plot.option(s)
    s.set_defaults(func=_run)


def _run(a) -> int:
    if a.ray:
        from .bench_ray import bench_serve_ray
        bench_serve_ray(a.model, a.threads, a.clients, a.tokens, a.rounds, a.replicas, a.coalesce)
        return 0
    if a.lookup or a.draft:
        problem = (f"--spec must be in 1..64, got {a.spec}" if not 1 <= a.spec <= 64 else
                   f"--draft: no such model file: {a.draft}" if a.draft and not os.path.isfile(a.draft) else None)
        if problem:
            print(f"lowbit bench serve: error: {problem}", file=sys.stderr)
            return 2
        bench_spec(a.model, a.threads, a.clients, a.tokens, a.rounds, a.lookup, a.draft, a.spec, a.copy)
        return 0
    if a.prefix or a.load:  # lowbit's prefix cache and load test (server/bench_ops.py)
        from ..model import default_model_path
        from .bench_ops import bench_ops
        path = a.model or default_model_path()
        res = bench_ops(_Proc, path, a.threads, a.prefix, a.load, a.load_clients, a.rounds, a.clients)
        return 1 if res.get("load", {}).get("problems") else 0
    from .. import plot
    return plot.after(a, "serve", bench_serve(a.model, a.threads, a.clients, a.tokens, a.rounds, a.rss_requests,
                                              llama=not a.no_llama))
