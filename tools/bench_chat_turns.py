"""Chat turns with and without the KV cache of earlier turns, and two live generators on one
or two slots: the measurements of BENCHMARKS.md's section "Everyday use".

    PYTHONPATH=build/dev:src python tools/bench_chat_turns.py [-m MODEL] [-t 2] [--turns 6] [--reps 3]

Part 1: a conversation of --turns user messages, greedy replies of up to 48 tokens. Each turn
is run twice, side by side: on a Model whose slot holds the earlier turns (lowbit chat's way:
only the new tokens are prefilled) and on a Model emptied first (every turn re-reads the whole
conversation, as before). Per turn: prompt tokens, tokens prefilled, time to the first token of
each (median of --reps), their ratio. The replies must be identical.
Part 2: two generators of 32 tokens stepped in turn, on a Model with 2 slots (each its own) and
on one with 1 slot (shared: each re-reads its context on every switch): tokens/s of both.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))

import lowbit  # noqa: E402
from lowbit.generate import Stats  # noqa: E402
from lowbit.model import common_prefix  # noqa: E402

QUESTIONS = ["What is the capital of France?", "What is it famous for?", "Name three museums there.",
             "Which one is the oldest?", "How do I get there from the airport?", "Thanks! Any food tips?",
             "And a good day trip from there?", "Summarise our conversation."]


def first_token_s(m, ids, reset: bool) -> tuple[float, int, list[int]]:
    """(seconds to the first token, tokens prefilled, the reply's ids)."""
    if reset:
        m.reset()
    st = Stats()
    g = m.generate(ids, max_tokens=48, stats=st, details=True)
    t0 = time.perf_counter()
    out = list(next(g).ids)
    t1 = time.perf_counter()
    for p in g:
        out += p.ids
    return t1 - t0, st.prompt_tokens - st.cached, out


def part1(path, threads, turns, reps):
    warm, cold = lowbit.load(path, n_ctx=2048, threads=threads), lowbit.load(path, n_ctx=2048, threads=threads)
    msgs = []
    print(f"{'turn':>4} {'prompt':>6} {'prefilled (reuse)':>17} {'prefilled (none)':>16} "
          f"{'first token ms (reuse)':>22} {'(none)':>7} {'none/reuse':>10}")
    for i in range(turns):
        msgs.append({"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]})
        ids = warm.tokenize(warm.tokenizer.apply_chat_template(msgs, add_generation_prompt=True))
        tw, tc, nw, nc = [], [], None, None
        keep = common_prefix(warm.tokens, ids)  # what the previous turn left that this one shares
        for _ in range(reps):
            warm.rewind(min(keep, warm.pos))  # every rep starts from the previous turn's cache
            a, nw, rw = first_token_s(warm, ids, reset=False)
            b, nc, rc = first_token_s(cold, ids, reset=True)
            assert rw == rc, "the reply with the cache differs from the reply without"
            tw.append(a)
            tc.append(b)
        msgs.append({"role": "assistant", "content": warm.detokenize(rw)})
        mw, mc = statistics.median(tw), statistics.median(tc)
        print(f"{i + 1:>4} {len(ids):>6} {nw:>17} {nc:>16} {mw * 1e3:>22.1f} {mc * 1e3:>7.1f} {mc / mw:>10.2f}")


def part2(path, threads, reps):
    prompts = ["Once upon a time", "The history of the printing press begins"]
    print(f"{'slots':>5} {'tok/s (both generators)':>24}")
    res = {}
    for slots in (2, 1):
        m = lowbit.load(path, n_ctx=256, threads=threads, n_slots=slots)
        times = []
        for _ in range(reps):
            gens = [m.generate(p, max_tokens=32, details=True) for p in prompts]
            n, t0 = 0, time.perf_counter()
            import warnings
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                for a, b in zip(*gens):
                    n += len(a.ids) + len(b.ids)
            times.append(n / (time.perf_counter() - t0))
        res[slots] = statistics.median(times)
        print(f"{slots:>5} {res[slots]:>24.1f}")
    print(f"own slots / shared slot: {res[2] / res[1]:.2f}x")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default=None)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    c = lowbit._native.lib.cpu_info()
    print(f"# {c['model']}; level {c['selected']}; {a.threads} threads; "
          f"{os.path.basename(a.model or lowbit.model.default_model_path())}")
    part1(a.model, a.threads, a.turns, a.reps)
    print()
    part2(a.model, a.threads, a.reps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
