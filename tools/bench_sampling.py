"""The per-token cost of the sampling features on the engine thread: presence / frequency
penalties and logprobs, against plain sampling, on a vocabulary of the default model's size
(49152): the figure of BENCHMARKS.md's "Sampling features' cost".

    PYTHONPATH=build/dev:src python tools/bench_sampling.py [--vocab 49152] [--prompt 200]
        [--generated 256] [--steps 3000] [--clock cpu|wall]

One logits row (float32, normal * 3, seeded) and one history: --prompt tokens, then --generated
generated ones (random ids, one in 8 repeated). Each step times every arm once, in turn (A/B
interleaved), on the thread's CPU clock (--clock cpu, the default) or the wall clock; the
medians over --steps steps are printed with their ratio to the arm's plain counterpart. The
arms are what the scheduler runs per token for a request:
    greedy / t=1 / sampled        Sampler.sample (t=1: temperature 1, no filter, the server's
                                  default; sampled: temperature 0.8, top-k 40, top-p 0.95,
                                  min-p 0.05: llama.cpp's defaults, the CLI's)
    + penalties                   the same with presence_penalty 0.5, frequency_penalty 0.5
    + logprobs k                  the same plus the row copy and token_logprobs
                                  (scheduler._sample / _take with Request.logprobs = k)
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "src"))

from lowbit.generate import token_logprobs  # noqa: E402
from lowbit.sampling import Sampler  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vocab", type=int, default=49152)
    ap.add_argument("--prompt", type=int, default=200)
    ap.add_argument("--generated", type=int, default=256)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--clock", choices=["cpu", "wall"], default="cpu")
    a = ap.parse_args()
    clock = time.thread_time_ns if a.clock == "cpu" else time.perf_counter_ns
    rng = np.random.default_rng(0)
    logits = (rng.standard_normal(a.vocab) * 3).astype(np.float32)
    gen = rng.integers(0, a.vocab, a.generated)
    gen[::8] = gen[0]
    history = rng.integers(0, a.vocab, a.prompt).tolist() + gen.tolist()
    pen = dict(presence_penalty=0.5, frequency_penalty=0.5, prompt_len=a.prompt)
    filt = dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, seed=1)

    def logprobs(s: Sampler, k: int):
        def run():
            raw = logits.copy()
            tok = s.sample(logits, history)
            return token_logprobs(raw, tok, k)
        return run

    arms = {}
    for name, kw in (("greedy", {}), ("t=1", dict(temperature=1.0, seed=1)), ("sampled", filt)):
        plain, pens = Sampler(**kw), Sampler(**kw, **pen)
        arms[name] = (lambda s=plain: s.sample(logits, history), name)
        arms[f"{name} + penalties"] = (lambda s=pens: s.sample(logits, history), name)
        for k in (0, 5, 20):
            arms[f"{name} + logprobs {k}"] = (logprobs(plain, k), name)
    times = {name: [] for name in arms}
    for _ in range(a.steps):
        for name, (fn, _) in arms.items():
            t0 = clock()
            fn()
            times[name].append(clock() - t0)
    print(f"vocab {a.vocab}, history {a.prompt} prompt + {a.generated} generated tokens, {a.steps} steps, "
          f"{a.clock} clock, median per token")
    med = {name: statistics.median(t) / 1e3 for name, t in times.items()}
    for name, (_, base) in arms.items():
        print(f"  {name:<22} {med[name]:9.1f} us   x{med[name] / med[base]:.2f} of {base}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
