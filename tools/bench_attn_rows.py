"""The shared-rows attention kernel (kernels.h mla_f16_fn) on the shapes the engine gives it, one
thread: microseconds per call (the median of the rounds), its multiply-adds per second (scores and
values: 2 x rows x keys x head_dim) and the cache bytes it read per second.

Shapes, KEYSxDIMxROWS[xCACHES] (CACHES: that many caches in turn, so they come from DRAM on a
32 MB L3; 1: the same cache every call, in L2 / L3):
    3000x64x3x40     a decode step of the default model at 3000 positions (a GQA group of 3)
    1000x64x48       a prompt block of the default model (16 tokens x 3 heads) at 1000 positions
    32768x256x8x2    a decode step of Qwen3.6-35B-A3B's attention layers at 32K (groups of 8, head 256)
    2048x128x64      a prompt block of Llama-3-8B's shape (8 tokens x 8 heads) at 2048 positions
--kd HALVES: the cache rows that far apart (default: head_dim, the head-major cache). A/B two
builds by running this with each build's directory first on PYTHONPATH, interleaved.
BENCHMARKS.md, "Prompt attention in blocks, a head-major KV cache" and "Attention kernel, round 2".

    PYTHONPATH=build/dev:src python tools/bench_attn_rows.py [SHAPE ...] [--kd HALVES] [--rounds N]
"""
import argparse
import statistics
import time

import numpy as np

from lowbit._native import lib

DEFAULT = ["3000x64x3x40", "1000x64x48", "32768x256x8x2", "2048x128x64"]


def run(keys: int, dk: int, rows: int, caches: int, kd: int, rounds: int) -> float:
    rng = np.random.default_rng(0)
    q = rng.standard_normal((rows, dk)).astype(np.float32)
    cs = [tuple(rng.standard_normal((keys, kd)).astype(np.float16).view(np.uint16) for _ in range(2))
          for _ in range(caches)]
    lib.attend_mla(q, cs[0][0], dk, 1.0 / np.sqrt(dk), -1, [], cs[0][1], [])  # (warm-up)
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for C, V in cs:
            lib.attend_mla(q, C, dk, 1.0 / np.sqrt(dk), -1, [], V, [])
        times.append((time.perf_counter() - t0) / caches)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("shapes", nargs="*", default=DEFAULT, help="KEYSxDIMxROWS[xCACHES]")
    ap.add_argument("--kd", type=int, default=0, help="halves between cache rows (default: head_dim)")
    ap.add_argument("--rounds", type=int, default=0, help="rounds (default: ~0.5 s of calls)")
    a = ap.parse_args()
    for shape in a.shapes:
        f = [int(x) for x in shape.split("x")]
        if len(f) not in (3, 4) or min(f) < 1 or f[1] % 8:
            raise SystemExit(f"bench_attn_rows: bad shape {shape!r} (KEYSxDIMxROWS[xCACHES], DIM a multiple of 8)")
        keys, dk, rows = f[:3]
        caches = f[3] if len(f) == 4 else 1
        kd = max(a.kd, dk)
        macs = 2.0 * rows * keys * dk
        rounds = a.rounds or max(3, int(0.5 / max(macs / 25e9, 1e-6) / caches))
        t = run(keys, dk, rows, caches, kd, rounds)
        print(f"{keys:6d} keys x {dk:3d} dims x {rows:3d} rows, {'DRAM' if caches > 1 else 'cache'}"
              f"{'' if kd == dk else f', rows {kd} halves apart'}: {1e6 * t:9.1f} us a call, "
              f"{macs / t / 1e9:5.1f} GMAC/s, {2 * keys * dk * 2 / t / 1e9:5.1f} GB/s of K and V")


if __name__ == "__main__":
    main()
