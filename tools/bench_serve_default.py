"""`lowbit serve` as a user starts it (no --parallel: auto, up to 16 slots) against the old default
of 4 slots (--parallel 4): the default model, 2 threads, 1 / 8 / 16 streaming clients x 64 tokens
(lowbit.server.bench's client and prompts, end-of-generation banned), 2 rounds each, the two
servers one after the other, twice. `lowbit bench serve` starts its server with --parallel equal
to its --clients; this measures what the server's default gives. BENCHMARKS.md, round (13).

    PYTHONPATH=build/dev:src python tools/bench_serve_default.py
"""
import statistics
import sys

from lowbit.server.bench import _Proc, _round

BIAS = {"2": -100, "0": -100}
ARMS = (("--parallel 4 (the old default)", ["--parallel", "4"]), ("default (auto)", []))
res = {}
for _ in range(2):
    for tag, extra in ARMS:
        p = _Proc([sys.executable, "-m", "lowbit.cli", "serve", "-t", "2", *extra], "/health")
        try:
            _round(p.url, 1, 8, BIAS)  # warm-up
            for c in (1, 8, 16):
                res.setdefault((tag, c), []).extend(_round(p.url, c, 64, BIAS)[0] for _ in range(2))
        finally:
            p.stop()
for tag, _ in ARMS:
    one = statistics.median(res[(tag, 1)])
    many = "; ".join(f"{c} clients {statistics.median(res[(tag, c)]):6.1f} ({statistics.median(res[(tag, c)]) / one:.2f}x)"
                     for c in (8, 16))
    print(f"{tag:30s} 1 client {one:6.1f} tok/s; {many}")
