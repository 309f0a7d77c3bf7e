"""Time to the first token of a chat's second turn on a hybrid model, with and without the reply's
recurrent-state snapshot in the prefix cache (server/prefix.py: PrefixCache(replies=...)): the
figure of BENCHMARKS.md's section "Prefix cache for hybrid models".

    PYTHONPATH=build/dev:src python tools/bench_reply_state.py [-m MODEL] [-t 2] [--prompt 400]
        [--reply 200] [--rounds 5]

Without -m: the qwen35moe synthetic model of tests/test_prefix_cache_hybrid.py (its SMALL shape).
One Scheduler per arm over one loaded model (one slot), as `lowbit serve` runs it. Each round
runs both arms in turn (A/B interleaved), each with an empty cache: turn 1 (a prompt of --prompt
random token ids, a greedy reply of up to --reply tokens), then turn 2 (turn 1's prompt and
reply, then 24 new tokens; max_tokens 1). Turn 2's time to first token is from its submit to its
"done" event, on the wall clock and as the process's CPU time meanwhile (the engine thread's and
its helpers'; the waiting main thread uses none). The replies must be identical in both arms;
the cached tokens of turn 2 are printed with the medians and the with/without ratios.
"""
from __future__ import annotations

import argparse
import os
import queue
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "src"))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

import numpy as np  # noqa: E402

import lowbit  # noqa: E402
from lowbit.sampling import Sampler  # noqa: E402
from lowbit.server.prefix import PrefixCache  # noqa: E402
from lowbit.server.scheduler import Request, Scheduler  # noqa: E402


def turn(sched: Scheduler, ids: list[int], n: int) -> tuple[list[int], int, float, float]:
    """(the request's history, its cached prompt tokens, wall s, process CPU s to its end)."""
    q: queue.Queue = queue.Queue()
    r = Request(prompt=list(ids), max_tokens=n, sampler=Sampler(temperature=0.0), emit=q.put)
    w0, c0 = time.perf_counter(), time.process_time()
    sched.submit(r)
    while (ev := q.get(timeout=600))[0] == "text":
        pass
    w, c = time.perf_counter() - w0, time.process_time() - c0
    if ev[0] != "done":
        raise RuntimeError(f"turn failed: {ev}")
    return r.history, r.cached, w, c


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", help="a hybrid GGUF (default: the tests' synthetic qwen35moe)")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=400, help="turn 1's prompt tokens")
    ap.add_argument("--reply", type=int, default=200, help="turn 1's reply tokens at most")
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    path = a.model
    if path is None:
        from lowbit.synth import synth_hybrid
        from test_prefix_cache_hybrid import SMALL
        path = synth_hybrid(os.path.join(tempfile.mkdtemp(), "q35moe.gguf"), **SMALL)
    m = lowbit.load(path, n_ctx=a.prompt + a.reply + 64, threads=a.threads, n_slots=1)
    if not m.engine.hybrid:
        raise SystemExit(f"{path} is not a hybrid model")
    rng = np.random.default_rng(1)
    vocab = m.config.vocab
    arms = {"with": True, "without": False}
    res: dict[str, dict[str, list]] = {k: {"wall": [], "cpu": [], "cached": []} for k in arms}
    for rnd in range(a.rounds + 1):  # round 0: warm-up, not counted
        p1 = rng.integers(0, vocab, a.prompt).tolist()
        extra = rng.integers(0, vocab, 24).tolist()
        replies = []
        for name, replies_on in arms.items():
            sched = Scheduler(m, 1, cache=PrefixCache(m, 512 << 20, replies=replies_on))
            try:
                h1, _, _, _ = turn(sched, p1, a.reply)
                _, cached, w, c = turn(sched, h1 + extra, 1)
            finally:
                sched.close()
            replies.append(h1)
            if rnd:
                res[name]["wall"].append(w)
                res[name]["cpu"].append(c)
                res[name]["cached"].append(cached)
        if replies[0] != replies[1]:
            raise SystemExit("the arms' replies differ")
    print(f"# {os.path.basename(path)}, {a.threads} threads, turn 1: {a.prompt} prompt + {len(replies[0]) - a.prompt} "
          f"reply tokens, turn 2: +24, median of {a.rounds} rounds (A/B interleaved)")
    print("| reply snapshot | turn-2 prompt | cached | TTFT wall | TTFT CPU |")
    print("| --- | --- | --- | --- | --- |")
    med = {k: {f: statistics.median(v) for f, v in d.items()} for k, d in res.items()}
    for name in arms:
        d = med[name]
        print(f"| {name} | {len(replies[0]) + 24} | {d['cached']:.0f} | {d['wall'] * 1e3:.1f} ms | {d['cpu'] * 1e3:.1f} ms |")
    print(f"ratio with/without: wall {med['with']['wall'] / med['without']['wall']:.3f}x, "
          f"CPU {med['with']['cpu'] / med['without']['cpu']:.3f}x")


if __name__ == "__main__":
    main()
