"""A prompt's prefill alone, for A/B runs of two builds (alternate them: the host is shared):
512 random token ids (ids 100..29999, a fixed seed), one forward of the whole prompt after a
64-token warm-up, repeated; prints tok/s per repetition. `lowbit bench e2e` is the figure to
report (llama.cpp in the same run); this is the quick loop behind BENCHMARKS.md round (9).

    PYTHONPATH=build/dev:src python tools/bench_prefill.py MODEL [REPS [MEMORY]]

MEMORY: mmap (default), copy or hugepages (lowbit.load's memory argument). 2 threads.
"""
import sys
import time

import numpy as np

import lowbit

if len(sys.argv) < 2:
    sys.exit(__doc__)
reps = int(sys.argv[2]) if len(sys.argv) > 2 else 3
m = lowbit.load(sys.argv[1], n_ctx=1024, threads=2, memory=sys.argv[3] if len(sys.argv) > 3 else "mmap")
toks = [int(t) for t in np.random.default_rng(0).integers(100, min(30000, m.config.vocab), 512)]
m.forward(toks[:64])
for _ in range(reps):
    m.reset()
    t = time.perf_counter()
    m.forward(toks)
    print(f"prefill of 512 tokens: {512 / (time.perf_counter() - t):.1f} tok/s", flush=True)
