"""What one batched forward of N decode tokens (N slots, one token each) costs relative to one
token: the ceiling of `lowbit serve`'s N-client throughput (N / cost). CPU time of all threads,
median of 12 interleaved repetitions. BENCHMARKS.md, "Serving at scale".

    PYTHONPATH=build/dev:src python tools/bench_step_cost.py [threads]

With --loop N SECONDS: N-token steps back to back for SECONDS, printing the wall time per step
(for A/B runs of two builds or settings, alternated: BENCHMARKS.md, round of 2026-12-04 (5)).
`lowbit bench serve` prints the same ceiling for its --clients (lowbit/server/bench.py step_ceiling).
With --ctx N: each slot first holds an N-token prompt (default: a 13-token one), as a server's
requests do after a few hundred tokens: the attention's share of a step grows with it
(BENCHMARKS.md, round (8)). With --model PATH: that GGUF instead of the default model.
"""
import sys
import time

import numpy as np

import lowbit

loop = None
ctx = 0
model = None
if "--model" in sys.argv:
    i = sys.argv.index("--model")
    model = sys.argv[i + 1]
    del sys.argv[i:i + 2]
if "--ctx" in sys.argv:
    i = sys.argv.index("--ctx")
    ctx = int(sys.argv[i + 1])
    del sys.argv[i:i + 2]
if "--loop" in sys.argv:
    i = sys.argv.index("--loop")
    loop = (int(sys.argv[i + 1]), float(sys.argv[i + 2]))
    del sys.argv[i:i + 3]
m = lowbit.load(model, n_ctx=1024, threads=int(sys.argv[1]) if len(sys.argv) > 1 else 1, n_slots=16)
ids = m.tokenize("Once upon a time, in a kingdom by the sea, there lived")
if ctx:
    ids = (ids * (ctx // len(ids) + 1))[:ctx]
for s in range(16):  # each slot its own tokens (a MoE routes each sequence its own way)
    m.rewind(0, s)
    m.forward_batch([(s, ids[s % len(ids):] + ids[:s % len(ids)])])


def step(n):
    t = time.process_time()
    m.forward_batch([(s, [42 + 97 * s]) for s in range(n)])
    dt = time.process_time() - t
    for s in range(n):
        m.rewind(m.slot_pos[s] - 1, s)
    return dt


if loop:
    from lowbit.server.bench import decode_steps
    n, secs = loop
    per = decode_steps(m, n, secs)
    at = f" at {len(ids)} positions" if ctx else ""
    print(f"{n} tokens{at}: {per * 1e3:.2f} ms wall per step (steps back to back for {secs:g} s)")
    sys.exit(0)

res = {n: [] for n in (1, 2, 4, 8, 16)}
for _ in range(12):
    for n in res:
        res[n].append(step(n))
b = np.median(res[1])
for n, v in res.items():
    med = np.median(v)
    print(f"{n:2d} tokens: {med * 1e3:7.2f} ms  ({med / b:.2f}x one token; ceiling {n * b / med:.2f}x tok/s)")
