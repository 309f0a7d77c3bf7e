"""Structured output's decode cost: per-token decode time of one request at a time, free text
(end-of-generation banned) against response_format json_schema, 4 alternating rounds in one
run, through the server's Scheduler and Metrics (no HTTP). BENCHMARKS.md, "Serving at scale".

    PYTHONPATH=build/dev:src python tools/bench_structured.py
"""
import queue, time, sys, numpy as np, lowbit
from lowbit.sampling import Sampler
from lowbit.server.scheduler import Request, Scheduler
from lowbit.server.metrics import Metrics
from lowbit.server.structured import grammar, Constraint
m = lowbit.load(None, n_ctx=1024, threads=2, n_slots=1)
g = grammar({"type": "json_schema", "json_schema": {"schema": {"type": "array", "items": {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}, "required": ["name", "age"]}, "minItems": 12}}})
ids = m.tokenize(m.tokenizer.apply_chat_template([{"role": "user", "content": "List twelve people with their ages as JSON."}]))
bias = {t: -100.0 for t in m.tokenizer.eog_ids}
res = {"free": [], "json": []}
for rnd in range(4):
    for kind in ("free", "json"):
        met = Metrics()
        sched = Scheduler(m, 1, metrics=met)
        q = queue.Queue()
        c = Constraint(m.tokenizer, m.config.vocab, g) if kind == "json" else None
        sched.submit(Request(prompt=ids, max_tokens=96, sampler=Sampler(), emit=q.put, logit_bias=bias if c is None else {}, constraint=c))
        text = ""
        while True:
            ev = q.get()
            if ev[0] == "text": text += ev[1]
            else: break
        sched.close()
        res[kind].append(met.tpot.sum / met.tpot.count)
        if rnd == 0: print(kind, ev[:2], ev[2]["completion_tokens"] if len(ev) > 2 else "", repr(text[:80]))
f, j = np.median(res["free"]), np.median(res["json"])
print(f"per-token decode: free {f*1e3:.2f} ms, json_schema {j*1e3:.2f} ms: {j/f:.3f}x (median of 4 alternating)")
