"""Decode ms per token at long contexts, per KV cache format, for two builds of lowbit side by side
(before / after a change to the attention): one child process per build holds a model per format,
prefilled once to the longest context; the parent interleaves the builds and formats in every
round (A then B, formats in turn) so that load from other processes hits them alike, and prints the
medians and the ratios B / A measured in the same run. A build is PYTHONPATH for its child
(its extension's build directory and its src/).

    python tools/bench_kv_builds.py --a /work/wt/base/build/dev:/work/wt/base/src \\
        --b build/dev:src --contexts 2048 4096 --kv f16 q8_0 q4_0 --gen 32 --rounds 5 --threads 2 [--prefill 2048]

The default model (SmolLM2-135M Q4_1: 9 heads, 3 KV heads of 64, 30 layers).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

CHILD = r"""
import json, sys, time
import numpy as np
import lowbit
from lowbit.bench import E2E_PROMPT
cfg = json.loads(sys.argv[1])
top = max(cfg["contexts"])
models = {kv: lowbit.load(None, n_ctx=top + cfg["gen"] + 8, threads=cfg["threads"], kv=kv) for kv in cfg["kv"]}
toks, saved = None, {}
for kv, m in models.items():
    toks = m.tokenize(E2E_PROMPT * (top // 8 + 1))[:top]
    for i in range(0, top, 512):
        m.forward(toks[i:i + 512])
    saved[kv] = np.zeros(m.engine.kv_bytes(top), np.uint8)
    m.engine.kv_copy(0, 0, top, saved[kv], True)
print("ready", flush=True)
for line in sys.stdin:
    what, kv, ctx = line.split()
    m, ctx = models[kv], int(ctx)
    if what == "prefill":  # a prompt of ctx tokens from an empty slot, in chunks of 512
        m.reset()
        t0 = time.perf_counter()
        for i in range(0, ctx, 512):
            m.forward(toks[i:min(ctx, i + 512)])
        print(json.dumps((time.perf_counter() - t0) * 1e3), flush=True)
        continue
    m.reset()  # the prefilled cache back (the previous measurement wrote past its context)
    m.engine.kv_copy(0, 0, top, saved[kv], False)
    m.pos, m.tokens[:] = top, list(toks)
    m.rewind(ctx)
    tok = toks[ctx] if ctx < len(toks) else toks[0]
    t0 = time.perf_counter()
    for _ in range(cfg["gen"]):
        tok = int(np.argmax(m.forward([tok])[-1]))
    print(json.dumps((time.perf_counter() - t0) / cfg["gen"] * 1e3), flush=True)
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", required=True, help="PYTHONPATH of build A (before)")
    ap.add_argument("--b", required=True, help="PYTHONPATH of build B (after)")
    ap.add_argument("--contexts", type=int, nargs="+", default=[2048, 4096])
    ap.add_argument("--kv", nargs="+", default=["f16", "q8_0", "q4_0"])
    ap.add_argument("--gen", type=int, default=32, help="decode steps per measurement")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prefill", type=int, default=0, help="also time a prompt of this many tokens (0: no)")
    args = ap.parse_args()
    cfg = json.dumps(dict(contexts=args.contexts, kv=args.kv, gen=args.gen, threads=args.threads))
    kids = {}
    for name, pp in (("A", args.a), ("B", args.b)):
        env = dict(os.environ, PYTHONPATH=pp)
        kids[name] = subprocess.Popen([sys.executable, "-c", CHILD, cfg], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, text=True, env=env)
    for k in kids.values():
        if k.stdout.readline().strip() != "ready":
            raise SystemExit("a child failed to start")
    ms = {(n, kv, c): [] for n in kids for kv in args.kv for c in args.contexts}
    pf = {(n, kv): [] for n in kids for kv in args.kv}
    for _ in range(args.rounds):
        for c in args.contexts:
            for kv in args.kv:
                for n, k in kids.items():
                    k.stdin.write(f"decode {kv} {c}\n")
                    k.stdin.flush()
                    ms[(n, kv, c)].append(json.loads(k.stdout.readline()))
        for kv in args.kv if args.prefill else []:
            for n, k in kids.items():
                k.stdin.write(f"prefill {kv} {args.prefill}\n")
                k.stdin.flush()
                pf[(n, kv)].append(json.loads(k.stdout.readline()))
    for k in kids.values():
        k.stdin.close()
        k.wait()
    print(f"# decode ms per token (median of {args.rounds} rounds of {args.gen} steps, {args.threads} threads), "
          f"A = {args.a}, B = {args.b}")
    print(f"{'context':>7} {'kv':5} {'A ms':>7} {'B ms':>7} {'B/A':>6}")
    for c in args.contexts:
        for kv in args.kv:
            a, b = statistics.median(ms[("A", kv, c)]), statistics.median(ms[("B", kv, c)])
            print(f"{c:7d} {kv:5} {a:7.2f} {b:7.2f} {b / a:6.2f}")
    if args.prefill:
        print(f"# prefill of {args.prefill} tokens in chunks of 512, ms (median of {args.rounds})")
        for kv in args.kv:
            a, b = statistics.median(pf[("A", kv)]), statistics.median(pf[("B", kv)])
            print(f"{'prefill':>7} {kv:5} {a:7.0f} {b:7.0f} {b / a:6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
