"""The wide window (KernelEntry::wide: 16 tokens per pass over a row, avx512's legacy formats)
against the windows of <= 8 tokens and against the GEMM, on matmul's own path, one thread, the
thread's CPU time, the fastest of 7 interleaved runs: microseconds per row and token.

    PYTHONPATH=build/dev:src python tools/bench_wide.py [--mb MB] [--n 576,1536,2048]
        [--formats Q4_0,Q4_1,Q8_0] [--nt 16,24,32] [--against windows|gemm]

`windows`: path 3 (windows of <= 8) / path 1 (the row kernels: the wide window where it takes);
`gemm`: path 2 (the GEMM for any nt) / path 1. A ratio > 1: the wide window is faster.
BENCHMARKS.md, round (8).
"""
import argparse

import numpy as np

from lowbit._native import lib
from lowbit.bench import _weights
from lowbit.formats import BY_NAME
from lowbit.ggml_oracle import ggml as get_ggml


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=1.0, help="MB of weight rows per matrix (default 1: in L2/L3)")
    ap.add_argument("--n", default="576,1536,2048")
    ap.add_argument("--formats", default="Q4_0,Q4_1,Q5_0,Q5_1,Q8_0,IQ4_NL,MXFP4")
    ap.add_argument("--nt", default="16,24,32")
    ap.add_argument("--against", choices=["windows", "gemm"], default="windows")
    a = ap.parse_args()
    g, rng = get_ggml(), np.random.default_rng(0)
    other = 3 if a.against == "windows" else 2
    lib.set_bench_thread_clock(True)
    print(f"# {lib.cpu_info()['model']}; one thread; {a.mb:g} MB of rows; {a.against} / row kernels "
          f"(us per row and token)")
    try:
        for n in (int(x) for x in a.n.split(",")):
            for name in a.formats.split(","):
                f = BY_NAME[name]
                if lib.wide_kernel(f.id) is None:
                    raise SystemExit(f"bench_wide: {name} has no wide window at this level")
                rows = max(64, int(a.mb * 2**20) // f.row_bytes(n))
                raw = _weights(f, n, rows, rng, g)
                cells = []
                for nt in (int(x) for x in a.nt.split(",")):
                    act = lib.quantize_act(BY_NAME[f.act].id, rng.standard_normal((nt, n)).astype(np.float32))
                    t_o, t_w = [], []
                    for _ in range(7):
                        t_o.append(lib.bench_matmul(f.id, raw, act, n, 0.5, 1, 1, -1, other))
                        t_w.append(lib.bench_matmul(f.id, raw, act, n, 0.5, 1, 1, -1, 1))
                    per = lambda t: min(t) / (rows * nt) * 1e6  # noqa: E731
                    cells.append(f"{nt}: {per(t_o):.4f} / {per(t_w):.4f} = {min(t_o) / min(t_w):.2f}x")
                print(f"{name:7s} n={n:5d}  " + "   ".join(cells), flush=True)
    finally:
        lib.set_bench_thread_clock(False)


if __name__ == "__main__":
    main()
