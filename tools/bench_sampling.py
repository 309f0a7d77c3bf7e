"""The per-token cost of the sampling features on the engine thread: presence / frequency
penalties and logprobs, against plain sampling, on a vocabulary of the default model's size
(49152): the figure of BENCHMARKS.md's "Sampling features' cost".

    PYTHONPATH=build/dev:src python tools/bench_sampling.py [--vocab 49152] [--prompt 200]
        [--generated 256] [--steps 3000] [--clock cpu|wall] [-m default|MODEL [-t 2]] [--before REV]

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
With --before REV (a git revision), the plain arms of REV's Sampler (src/lowbit/sampling.py
there) run too, interleaved with the others: this branch's sampling against it in one run.
With -m, each step also runs one decode step of that model (one token at a fixed position after
a --prompt-token prompt, rewound after it: the same cost every step) and prints every arm as a
share of it; the clock is then the wall clock for all (the step runs on the engine's pool
threads, sampling on the engine thread while the pool waits). --vocab is the model's then.
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


def _sampler_at(rev: str):
    """The Sampler class of src/lowbit/sampling.py at git revision rev."""
    import importlib.util
    import subprocess
    import tempfile
    src = subprocess.run(["git", "-C", os.path.join(HERE, ".."), "show", f"{rev}:src/lowbit/sampling.py"],
                         check=True, capture_output=True, text=True).stdout
    path = os.path.join(tempfile.mkdtemp(), "sampling_before.py")
    with open(path, "w") as f:
        f.write(src)
    spec = importlib.util.spec_from_file_location("sampling_before", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["sampling_before"] = mod  # (dataclasses look the module up)
    spec.loader.exec_module(mod)
    return mod.Sampler


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vocab", type=int, default=49152)
    ap.add_argument("--prompt", type=int, default=200)
    ap.add_argument("--generated", type=int, default=256)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--clock", choices=["cpu", "wall"], default="cpu")
    ap.add_argument("-m", "--model", default=None, help='also time a decode step of this model ("default": '
                    "lowbit's default model)")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--before", default=None, metavar="REV", help="also time REV's Sampler (git revision)")
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    step = None
    if a.model:
        import lowbit
        m = lowbit.load(None if a.model == "default" else a.model, n_ctx=a.prompt + 8, threads=a.threads)
        a.vocab, a.clock = m.config.vocab, "wall"
        m.reset()
        m.forward(rng.integers(0, a.vocab, a.prompt).tolist())

        def step():
            m.forward([1])
            m.rewind(a.prompt)
    clock = time.thread_time_ns if a.clock == "cpu" else time.perf_counter_ns
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
    if a.before:
        old = _sampler_at(a.before)
        for name, kw in (("greedy", {}), ("t=1", dict(temperature=1.0, seed=1)), ("sampled", filt)):
            arms[f"{name} ({a.before})"] = (lambda s=old(**kw): s.sample(logits, history), name)
    if step is not None:
        arms["decode step"] = (step, "decode step")
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
        share = f"   {100 * med[name] / med['decode step']:5.1f}% of a decode step" if step is not None else ""
        print(f"  {name:<22} {med[name]:9.1f} us   x{med[name] / med[base]:.2f} of {base}{share}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
