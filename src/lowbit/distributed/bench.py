"""`lowbit bench pipeline`: a model as K pipeline stages (Ray actors) against one process.

    lowbit bench pipeline [-m MODEL] [--stages 2] [--slots 4] [--tokens 64] [--rounds 3] [-t THREADS]

Both run in this process's run, one after the other per round (never at once: they would share
the cores), on the same prompt, greedy:
  - decode of one sequence: ms per token (each token crosses every stage: the pipeline's latency);
  - decode of --slots sequences batched (one token of each per step, cut into micro-batches that
    are in flight together): ms per token (all slots' tokens / wall time);
  - the greedy text of --tokens tokens, which must be identical (exit 1 if not).
Reported: medians over --rounds rounds and the pipeline / one-process ratio of each, with the
machine's load average (the stages share this machine's cores here; on several machines each
stage has its own).
"""
from __future__ import annotations

import os
import statistics
import sys
import time


def _decode_one(m, ids, n, after_prompt=None):
    m.reset()
    m.forward(ids)
    if after_prompt:
        after_prompt()
    t = time.perf_counter()
    for i in range(n):
        m.forward([ids[i % len(ids)]])
    return (time.perf_counter() - t) / n


def _decode_batched(m, ids, slots, n):
    for s in range(slots):
        m.rewind(0, slot=s)
    m.forward_batch([(s, ids) for s in range(slots)])
    t = time.perf_counter()
    for i in range(n):
        m.forward_batch([(s, [ids[(i + s) % len(ids)]]) for s in range(slots)])
    return (time.perf_counter() - t) / (n * slots)


def bench_pipeline(path: str | None, stages: int, slots: int, tokens: int, rounds: int, threads: int | None,
                   out=sys.stdout) -> dict:
    import lowbit
    one = lowbit.load(path, n_ctx=512, n_slots=slots, threads=threads)
    pipe = lowbit.load(path, n_ctx=512, n_slots=slots, threads=threads, stages=stages)
    try:
        ids = one.tokenize("The history of the printing press begins in")
        name = os.path.basename(one.path)
        print(f"# {name}: one process vs {stages} pipeline stages (layers {pipe.engine.ranges}), "
              f"threads {threads or 'all'}, {slots} slots batched; median of {rounds} rounds", file=out, flush=True)
        ga = "".join(one.generate(ids, max_tokens=tokens))
        gb = "".join(pipe.generate(ids, max_tokens=tokens))
        res = {"same_greedy": ga == gb, "one": [], "pipe": [], "one_b": [], "pipe_b": [], "compute": []}
        _decode_one(one, ids, 4), _decode_one(pipe, ids, 4)  # warm-up
        for _ in range(rounds):
            res["one"].append(_decode_one(one, ids, tokens))
            res["pipe"].append(_decode_one(pipe, ids, tokens, lambda: pipe.engine.timing(reset=True)))
            busy = pipe.engine.timing(reset=True)
            res["compute"].append(sum(b for b, _ in busy) / tokens)
            res["one_b"].append(_decode_batched(one, ids, slots, tokens // 2))
            res["pipe_b"].append(_decode_batched(pipe, ids, slots, tokens // 2))
        med = {k: statistics.median(v) * 1e3 for k, v in res.items() if isinstance(v, list)}
        res["median_ms"] = med
        load = os.getloadavg()
        print(f"{'':28} {'one process':>12} {f'{stages} stages':>12} {'ratio':>7}", file=out)
        print(f"{'1 sequence, ms/token':28} {med['one']:12.2f} {med['pipe']:12.2f} {med['pipe'] / med['one']:7.2f}",
              file=out)
        print(f"{f'{slots} sequences, ms/token':28} {med['one_b']:12.2f} {med['pipe_b']:12.2f} "
              f"{med['pipe_b'] / med['one_b']:7.2f}", file=out)
        print(f"1 sequence: of the pipeline's {med['pipe']:.2f} ms/token, {med['compute']:.2f} ms computing in the "
              f"stages (summed), {med['pipe'] - med['compute']:.2f} ms moving between them (Ray)", file=out)
        print(f"greedy text of {tokens} tokens identical: {'yes' if ga == gb else 'NO'}; "
              f"load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} on {os.cpu_count()} CPUs", file=out)
        for s in pipe.engine.stage_info:
            print(f"  stage layers {s['layers'][0]}..{s['layers'][1] - 1}: pid {s['pid']}, weights bound "
                  f"{s['weight_bytes'] / 2**20:.1f} MB, peak RSS {s['rss_mb']:.0f} MB", file=out)
        return res
    finally:
        pipe.close()


def add_parser(bs) -> None:
    p = bs.add_parser("pipeline", help="K pipeline stages on Ray actors vs one process (per-token cost)",
                      description=__doc__.split("\n\n", 2)[2] if __doc__ else None,
                      formatter_class=__import__("argparse").RawDescriptionHelpFormatter)
    p.add_argument("-m", "--model", default=None, help="GGUF file (default: the default model)")
    p.add_argument("--stages", type=int, default=2)
    p.add_argument("--slots", type=int, default=4)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("-t", "--threads", type=int, default=None, help="threads per process / stage (default: all)")
    p.set_defaults(func=_run)


def _run(a) -> int:
    for name, v in (("--stages", a.stages), ("--slots", a.slots), ("--tokens", a.tokens), ("--rounds", a.rounds)):
        if v < 1 or (name == "--stages" and v < 2):
            print(f"lowbit bench pipeline: error: {name} must be >= {2 if name == '--stages' else 1}", file=sys.stderr)
            return 2
    res = bench_pipeline(a.model, a.stages, a.slots, a.tokens, a.rounds, a.threads)
    return 0 if res["same_greedy"] else 1
