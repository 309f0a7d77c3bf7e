"""Decode's share of the machine's read bandwidth, both measured in one process, interleaved.

    PYTHONPATH=BUILD:SRC python tools/decode_share.py MODEL [REPS] [GEN]

Loads MODEL with 2 threads, prefills 128 tokens of bench e2e's prompt, then REPS times: GEN greedy
decode steps (m.forward + argmax, as bench e2e's loop; rewound to the prompt's end each time) and
`bench membw`'s two 512 MB reads (plain and prefetching; the higher). Prints one JSON line: decode
tok/s per rep, membw GB/s per rep, the weight bytes per token (bench.model_work) and each rep's
share = tok/s x bytes / membw. Pairing each decode rep with its own membw keeps the share
meaningful on a VM whose bandwidth moves from minute to minute. For an A/B of two builds run it
alternately with each build's PYTHONPATH (BENCHMARKS.md, "MoE decode at DRAM speed").
"""
import io
import json
import sys
import time

import numpy as np

from lowbit.bench import E2E_PROMPT, bench_membw, membw_buffer, model_work
from lowbit.model import load


def main() -> None:
    path = sys.argv[1]
    reps = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    gen = int(sys.argv[3]) if len(sys.argv) > 3 else 32
    m = load(path, n_ctx=512, threads=2)
    toks = m.tokenize(E2E_PROMPT * 20)[:128]
    m.reset()
    logits = m.forward(toks)
    p0 = m.pos
    buf = membw_buffer(512.0)
    dec, bw = [], []
    for _ in range(reps):
        m.rewind(p0)
        tok = int(np.argmax(logits[-1]))
        t0 = time.perf_counter()
        for _ in range(gen):
            tok = int(np.argmax(m.forward([tok])[-1]))
        dec.append(gen / (time.perf_counter() - t0))
        bw.append(bench_membw(512.0, 2, 3, out=io.StringIO(), buf=buf))
    w = model_work(path)["bytes"]
    print(json.dumps(dict(dec=dec, bw=bw, bytes=w, share=[d * w / 1e9 / b for d, b in zip(dec, bw)])))


if __name__ == "__main__":
    main()
