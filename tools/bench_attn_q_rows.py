"""The quantized cache's shared-rows attention (kernels.h attn_q_rows_fn) against its per-row kernel
(attn_q_fn once per row), interleaved in one run: nq query rows against one KV head's rows of
head_dim 64, as the default model calls them: a decode step's GQA group (3 rows, all `len` keys)
and a prompt block (16 tokens x 3 heads = 48 rows, lengths len-15 .. len). 40 caches in turn
(DRAM on a 32 MB L3 at 4096 positions) or one (in cache). Microseconds per call (the per-row
side: its nq calls), median of the rounds; the ratio per-row / shared.

    PYTHONPATH=build/dev:src python tools/bench_attn_q_rows.py [--len 4096] [--kv q8_0 q4_0]

--qwen36: instead, Qwen3.6-35B-A3B's decode step at 32K positions (a GQA group of 8 rows, head_dim
256; 2 caches in turn, DRAM), the shared kernel alone: us per call and its multiply-adds per second
(scores and values: 2 x rows x keys x head_dim). A/B two builds by running it with each build's
directory first on PYTHONPATH, interleaved (BENCHMARKS.md, round of 2026-12-05 (7)).
"""
import argparse
import statistics
import time

import numpy as np

from lowbit._native import lib

TYPES = {"q8_0": 8, "q4_0": 2}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--len", type=int, default=4096)
    ap.add_argument("--kv", nargs="+", default=["q8_0", "q4_0"])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--qwen36", action="store_true")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    if args.qwen36:
        return qwen36(args, rng)
    L, hd = args.len, 64
    print(f"# attn_q_rows ({lib.cpu_info()['attention_q_rows']}) vs attn_q ({lib.cpu_info()['attention_q']}) "
          f"x rows, {L} positions, head_dim {hd}; us per call, median of {args.rounds}")
    print(f"{'kv':5} {'rows':>4} {'where':5} {'per-row':>9} {'shared':>9} {'ratio':>6}")
    for kv in args.kv:
        t = TYPES[kv]
        for n in (40, 1):
            caches = []
            for _ in range(n):
                x = rng.standard_normal((2, L, hd)).astype(np.float32)
                caches.append(tuple(np.stack([lib.kv_store_row(t, r)[0] for r in x[i]]) for i in range(2)))
            for nq, lens in ((3, [L] * 3), (48, [L - 15 + u for u in range(16) for _ in range(3)])):
                q = rng.standard_normal((nq, hd)).astype(np.float32)
                each, shared = [], []
                for _ in range(args.rounds):
                    t0 = time.perf_counter()
                    for K, V in caches:
                        for r in range(nq):
                            lib.attend_q(q[r], t, K[:lens[r]], t, V[:lens[r]], 0.125)
                    each.append((time.perf_counter() - t0) / n)
                    t0 = time.perf_counter()
                    for K, V in caches:
                        lib.attend_q_rows(q, t, K, t, V, 0.125, -1, lens)
                    shared.append((time.perf_counter() - t0) / n)
                a, b = statistics.median(each) * 1e6, statistics.median(shared) * 1e6
                print(f"{kv:5} {nq:4d} {'DRAM' if n > 1 else 'cache':5} {a:9.1f} {b:9.1f} {a / b:6.2f}")


def qwen36(args, rng) -> None:
    L, hd, nq = 32768, 256, 8
    print(f"# attn_q_rows ({lib.cpu_info()['attention_q_rows']}): {nq} rows x {L} keys x head_dim {hd}, 2 caches "
          f"(DRAM); median of {args.rounds}")
    q = rng.standard_normal((nq, hd)).astype(np.float32)
    for kv in args.kv:
        t = TYPES[kv]
        caches = [tuple(np.stack([lib.kv_store_row(t, r)[0] for r in rng.standard_normal((L, hd)).astype(np.float32)])
                        for _ in range(2)) for _ in range(2)]
        times = []
        for _ in range(args.rounds):
            t0 = time.perf_counter()
            for K, V in caches:
                lib.attend_q_rows(q, t, K, t, V, 0.0625)
            times.append((time.perf_counter() - t0) / len(caches))
        us = statistics.median(times) * 1e6
        print(f"{kv:5} {us:9.1f} us a call  {2 * nq * L * hd / us / 1e3:6.1f} GMAC/s")


if __name__ == "__main__":
    main()
