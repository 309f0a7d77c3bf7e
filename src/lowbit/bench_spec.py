"""`lowbit bench spec`: plain and speculative decoding of the same target, same prompts, one run.

    lowbit bench spec [-m TARGET] [--draft DRAFT] [--spec 2,4,6] [-n 128] [-t 2] [--reps 3]
    lowbit bench spec -m TARGET --mtp [--spec 2,3] ...   the target's own MTP block as the draft

Three measurements, all greedy, each speculative text checked identical to the plain one:
  window   the cost of verifying a window of w tokens (1 + w-1 drafts) relative to a one-token
           step at the same position (median of --reps; < w means each row decode was shared)
  draft    a draft model (default: the default model, Q4_1) for the target (default: the default
           model rewritten in F16 into ~/.cache/lowbit once) on open-ended prompts
  lookup   prompt lookup on an input-grounded task: repeat a ~1,000-token passage
  mtp      (--mtp, instead of draft and lookup) the target's MTP block (lowbit.mtp) on the draft
           task's prompts
Reported per row: plain and speculative decode tok/s (prefill excluded), their ratio, tokens
per round and the share of drafts accepted.
"""
from __future__ import annotations

import os
import sys
import time
from importlib import resources

import numpy as np

DRAFT_PROMPTS = [
    "<|im_start|>user\nExplain how a bicycle works.<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nWrite a short story about a lighthouse keeper.<|im_end|>\n<|im_start|>assistant\n",
    "def quicksort(items):\n",
]


def passage() -> str:
    return resources.files("lowbit").joinpath("data/passage.txt").read_text(encoding="utf-8")


def lookup_prompt() -> str:
    """Copy the passage: a completion prompt that starts the copy with its first sentence (the
    135M default model does not follow a chat request to repeat a text; it continues this)."""
    text = passage()
    return text + "\nThe same text again, word for word:\n\n" + text[:text.index(".") + 1]


def default_target(kind: str = "F16") -> str:
    """The default model rewritten in `kind`, made once into the user's cache directory."""
    from .model import default_model_path
    from .quantize import quantize_file
    d = os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "lowbit")
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, f"smollm2-135m-instruct-{kind.lower()}.gguf")
    if not os.path.exists(path):
        print(f"# writing the {kind} target {path} (once)", file=sys.stderr)
        quantize_file(default_model_path(), path, kind)
    return path


def window_cost(model, reps: int, at: int = 128) -> list[float]:
    """Median time of a forward of w tokens at position `at` over a one-token step's, w = 1..8."""
    ids = model.tokenize(passage())[:at + 8]
    model.reset()
    model.forward(ids[:at])
    times = {}
    for w in list(range(1, 9)) * reps:
        model.rewind(at)
        t0 = time.perf_counter()
        model.forward(ids[at:at + w], all_logits=True)
        times.setdefault(w, []).append(time.perf_counter() - t0)
    med = {w: float(np.median(v)) for w, v in times.items()}
    return [med[w] / med[1] for w in range(1, 9)]


def run_one(model, prompt: str, n: int, draft, k: int) -> tuple[list[int], object]:
    from .generate import Stats
    st = Stats()
    text = "".join(model.generate(prompt, max_tokens=n, stats=st, draft=draft, spec=k))
    return text, st


def bench_spec(target: str | None, draft_path: str | None, ks: list[int], n: int, threads: int, reps: int,
               out=sys.stdout, mtp: bool = False) -> list[dict]:
    from .model import default_model_path, load
    tpath = target or default_target()
    dpath = draft_path or default_model_path()
    ctx = len(load(tpath, n_ctx=16).tokenize(lookup_prompt())) + n + 16
    m = load(tpath, n_ctx=ctx, threads=threads)
    if mtp and m.config.n_nextn < 1:
        raise ValueError(f"--mtp: {tpath} has no MTP (nextn) block")
    d = None if mtp else load(dpath, n_ctx=ctx, threads=threads)
    print(f"# target {os.path.basename(tpath)}, draft {'its MTP block' if mtp else os.path.basename(dpath)}, "
          f"{threads} threads, {n} tokens per prompt, greedy, median of {reps}", file=out)
    cost = window_cost(m, max(reps, 5))
    print("verify window cost (forward of w tokens / one-token step): "
          + "  ".join(f"w={w}: {c:.2f}" for w, c in enumerate(cost, 1)), file=out)
    print(f"{'task':<7} {'k':>2} {'plain tok/s':>11} {'spec tok/s':>10} {'speedup':>7} {'tok/round':>9} "
          f"{'accepted':>8} {'identical':>9}", file=out, flush=True)
    rows = []
    tasks = [("mtp", DRAFT_PROMPTS, "mtp")] if mtp else [("draft", DRAFT_PROMPTS, d), ("lookup", [lookup_prompt()], "lookup")]
    for task, prompts, drafter in tasks:
        base = []
        for p in prompts:  # plain decoding once per prompt (median of reps)
            runs = [run_one(m, p, n, None, 1) for _ in range(reps)]
            base.append((runs[0][0], float(np.median([st.decode_s for _, st in runs])),
                         runs[0][1].generated))
        for k in ks:
            t_plain = t_spec = 0.0
            gen = rounds = drafted = accepted = 0
            same = True
            for p, (text0, plain_s, g) in zip(prompts, base):
                runs = [run_one(m, p, n, drafter, k) for _ in range(reps)]
                same &= all(text == text0 for text, _ in runs)
                st = runs[0][1]
                t_plain += plain_s
                t_spec += float(np.median([s.decode_s for _, s in runs]))
                gen += g
                rounds += st.rounds
                drafted += st.drafted
                accepted += st.accepted
            r = dict(task=task, k=k, plain_tps=gen / t_plain, spec_tps=gen / t_spec, speedup=t_plain / t_spec,
                     tokens_per_round=(accepted + rounds) / max(rounds, 1),
                     accepted=accepted / max(drafted, 1), identical=same)
            rows.append(r)
            print(f"{task:<7} {k:>2} {r['plain_tps']:11.1f} {r['spec_tps']:10.1f} {r['speedup']:7.2f} "
                  f"{r['tokens_per_round']:9.2f} {100 * r['accepted']:7.0f}% {str(same):>9}", file=out, flush=True)
    if not all(r["identical"] for r in rows):
        raise RuntimeError("a speculative run's text differs from plain decoding (see the table)")
    return rows


def add_bench_parser(bs) -> None:
    s = bs.add_parser("spec", help="plain vs speculative decoding on the same target, one run",
                      description=__doc__, formatter_class=__import__("argparse").RawDescriptionHelpFormatter)
    s.add_argument("-m", "--model", default=None,
                   help="target GGUF (default: the default model rewritten in F16, cached)")
    s.add_argument("--draft", default=None, help="draft GGUF (default: the default model, Q4_1)")
    s.add_argument("--spec", default="2,4,6", help="drafts per round to try, comma-separated")
    s.add_argument("-n", type=int, default=128, help="tokens generated per prompt")
    s.add_argument("-t", "--threads", type=int, default=2)
    s.add_argument("--reps", type=int, default=3, help="runs per configuration; medians are reported")
    s.add_argument("--mtp", action="store_true", help="draft with the target's own MTP block (instead of "
                                                      "--draft and prompt lookup)")
    s.set_defaults(func=lambda a: bench_spec(a.model, a.draft, [int(v) for v in a.spec.split(",")], a.n,
                                             a.threads, a.reps, mtp=a.mtp) and 0)
