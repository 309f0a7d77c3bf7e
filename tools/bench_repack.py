"""Q4_K rows as the file has them against Q4_K's R8 layout (csrc/repack.h) at DRAM scale: 400 MB
of rows (n = 4096), both kernels alternated 12 times in one process (the host's bandwidth moves
between runs), GB/s of rows read, median and best. BENCHMARKS.md, round of 2026-12-05 (12).

    PYTHONPATH=build/dev:src python tools/bench_repack.py [NT] [THREADS]
"""
import statistics
import sys

import numpy as np

from lowbit import kernels
from lowbit._native import lib
from lowbit.formats import BY_NAME

nt = int(sys.argv[1]) if len(sys.argv) > 1 else 1
threads = int(sys.argv[2]) if len(sys.argv) > 2 else 2
if "Q4_K" not in kernels.repacked_layouts():
    sys.exit("this level has no kernels for Q4_K's R8 layout (avx512 has)")
n, rb = 4096, 4096 // 256 * 144
rows = (400 << 20) // rb // 8 * 8
rng = np.random.default_rng(0)
base = np.ascontiguousarray(kernels.quantize("Q4_K", rng.standard_normal((256, n)).astype(np.float32))[: 256 * rb])
raw = np.ascontiguousarray(np.tile(base.reshape(256, rb), (rows // 256 + 1, 1))[:rows])
act = lib.quantize_act(BY_NAME["Q8_K"].id, rng.standard_normal((nt, n)).astype(np.float32))
q4k = BY_NAME["Q4_K"].id
t = {False: [], True: []}
for i in range(12):
    for r8 in ((False, True) if i % 2 else (True, False)):  # (each first in turn)
        t[r8].append(lib.bench_rows(q4k, raw, act, n, 1.0, threads, 1, -1, r8))
gb = raw.nbytes / 1e9
print(f"{gb * 1e3:.0f} MB of Q4_K rows, n = {n}, {nt} token(s), {threads} thread(s), 12 alternations: "
      f"as the file has them {gb / statistics.median(t[False]):.1f} GB/s (best {gb / min(t[False]):.1f}), "
      f"R8 {gb / statistics.median(t[True]):.1f} GB/s (best {gb / min(t[True]):.1f})")
