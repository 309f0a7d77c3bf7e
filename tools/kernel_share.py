"""The row kernels alone on a model's own tensors against the machine's read bandwidth, one process.

    PYTHONPATH=BUILD:SRC python tools/kernel_share.py MODEL ROUNDS TENSOR [TENSOR ...]

Per round: each TENSOR (a GGUF name, e.g. blk.0.ffn_gate_exps.weight: an expert tensor is run as
one matrix of experts x rows) through `kernels.matmul` with one token and 2 threads, timed, then
`bench membw`'s two 512 MB reads (the higher). Prints each tensor's GB/s and its share of the same
round's membw (median and range): what decode could reach if the step were nothing but that
kernel (BENCHMARKS.md, "MoE decode at DRAM speed"). Pick tensors far above the L3.
"""
import io
import statistics as st
import sys
import time

import numpy as np

from lowbit import gguf, kernels
from lowbit.bench import bench_membw, membw_buffer


def main() -> None:
    path, rounds, names = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    g = gguf.open(path)
    ts = {n: g.tensors[n] for n in names}
    x = {n: np.random.default_rng(0).standard_normal((1, t.n)).astype(np.float32) for n, t in ts.items()}
    buf = membw_buffer(512.0)
    gbs = {n: [] for n in names}
    bw = []
    for _ in range(rounds):
        for n, t in ts.items():
            t0 = time.perf_counter()
            kernels.matmul(t, x[n], threads=2)
            gbs[n].append(t.nbytes / (time.perf_counter() - t0) / 1e9)
        bw.append(bench_membw(512.0, 2, 3, out=io.StringIO(), buf=buf))
    print(f"membw median {st.median(bw):.1f} GB/s ({min(bw):.1f}-{max(bw):.1f}), {rounds} rounds")
    for n, t in ts.items():
        sh = [v / b for v, b in zip(gbs[n], bw)]
        print(f"{n:32} {t.nbytes / 1e6:6.0f} MB {st.median(gbs[n]):5.1f} GB/s, share of the round's membw: "
              f"median {100 * st.median(sh):.0f}% ({100 * min(sh):.0f}-{100 * max(sh):.0f})")


if __name__ == "__main__":
    main()
