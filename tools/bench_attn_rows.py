"""The shared-rows attention kernel (kernels.h mla_f16_fn: a GQA group's 3 query rows against one
KV head's half rows, as a decode step of the default model calls it) on 3000 positions, with the
head's rows `kd` halves apart: 192 = 3 heads x 64 interleaved (the cache's layout before it was
head-major), 64 = one head's rows contiguous (head-major). 40 caches in turn (92 MB: DRAM on a
32 MB L3) or one (in cache). Microseconds per call, the median of the rounds. BENCHMARKS.md,
"Prompt attention in blocks, a head-major KV cache".

    PYTHONPATH=build/dev:src python tools/bench_attn_rows.py
"""
import statistics
import time

import numpy as np

from lowbit._native import lib

rng = np.random.default_rng(0)
L, dk, nq = 3000, 64, 3
q = rng.standard_normal((nq, dk)).astype(np.float32)
for kd in (192, 64):
    for n in (40, 1):
        caches = [tuple(rng.standard_normal((L, kd)).astype(np.float16).view(np.uint16) for _ in range(2))
                  for _ in range(n)]
        rounds = []
        for rep in range(max(3, 120 // n)):
            t0 = time.perf_counter()
            for C, V in caches:
                lib.attend_mla(q, C, dk, 0.125, -1, [], V, [])
            rounds.append((time.perf_counter() - t0) / n)
        print(f"rows {kd:3d} halves apart, {'DRAM' if n > 1 else 'cache'}: {1e6 * statistics.median(rounds):6.1f} us a call")
