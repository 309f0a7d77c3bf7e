"""Structured output with speculative decoding: per-token time of one constrained greedy request
(response_format json_schema, an array of >= 12 objects, 160 tokens) with and without --lookup
(the server's default drafting policy), alternating in one run through the server's Scheduler (no
HTTP); the texts must be identical. BENCHMARKS.md, "Serving at scale" (structured output).

    PYTHONPATH=build/dev:src python tools/bench_structured_spec.py [--rounds 5]
"""
import argparse
import queue
import statistics
import time

import lowbit
from lowbit.sampling import Sampler
from lowbit.server import spec
from lowbit.server.scheduler import Request, Scheduler
from lowbit.server.structured import Constraint, grammar

ap = argparse.ArgumentParser()
ap.add_argument("--rounds", type=int, default=5)
a = ap.parse_args()
m = lowbit.load(None, n_ctx=1024, threads=2, n_slots=1)
g = grammar({"type": "json_schema", "json_schema": {"schema": {"type": "array", "minItems": 12, "items": {
    "type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}, "required": ["name", "age"]}}}})
ids = m.tokenize(m.tokenizer.apply_chat_template([{"role": "user", "content": "List twelve people with their ages as JSON."}]))
per_token = {"plain": [], "lookup": []}
last = {}
for rnd in range(a.rounds + 1):  # round 0: warm-up, not counted
    for kind in per_token:
        sched = Scheduler(m, 1, spec=spec.lookup() if kind == "lookup" else None, spec_k=4)
        q = queue.Queue()
        r = Request(prompt=ids, max_tokens=160, sampler=Sampler(temperature=0.0), emit=q.put,
                    constraint=Constraint(m.tokenizer, m.config.vocab, g))
        t0 = time.perf_counter()
        sched.submit(r)
        text = ""
        while (ev := q.get())[0] == "text":
            text += ev[1]
        dt = time.perf_counter() - t0
        st = sched.status()
        sched.close()
        if rnd:
            per_token[kind].append(dt / r.generated)
        last[kind] = (text, r.generated, st["steps"], st["spec"])
if last["plain"][0] != last["lookup"][0]:
    raise SystemExit("the texts differ")
p, lk = (statistics.median(per_token[k]) for k in ("plain", "lookup"))
print(f"{last['plain'][1]} tokens; steps: plain {last['plain'][2]}, lookup {last['lookup'][2]}; spec {last['lookup'][3]}")
print(f"ms per token (wall, median of {a.rounds}): plain {p * 1e3:.2f}, lookup {lk * 1e3:.2f}, ratio {lk / p:.3f}x")
