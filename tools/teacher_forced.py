"""Teacher-forced top-1 agreement between lowbit and llama.cpp, and llama.cpp against itself.

    python tools/teacher_forced.py [-m MODEL] [--gen 64] [--prompts FILE] [--threads 2]

llama.cpp (extra buffer types on, the reference) continues each prompt greedily; its token ids
are fed to every contestant and, at every position where the reference's top-2 margin is >= 0.1
("clear positions"), the contestants' top-1 is compared with the reference's. Contestants:
llama.cpp with its extra buffer types off (the floor: how much llama.cpp's own two
configurations disagree), lowbit, and lowbit at the scalar level (LOWBIT_MAX_ISA=scalar in a
child process). Flips are listed with both margins and the logit gap, so a flip can be traced
to a near-tie or to a real error. The prompts default to a set of 40 of every kind (chat, code,
prose, lists, numbers, other languages).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import numpy as np

PROMPTS = [
    "The capital of France is", "def fibonacci(n):\n    ", "Once upon a time, in a small village by the sea,",
    "<|im_start|>user\nWhat is 17 times 3?<|im_end|>\n<|im_start|>assistant\n",
    "Photosynthesis converts light energy into", "The three laws of thermodynamics are",
    "<|im_start|>user\nWrite a haiku about winter.<|im_end|>\n<|im_start|>assistant\n",
    "import numpy as np\nimport matplotlib.pyplot as plt\n\n", "In 1492, Columbus", "SELECT name, age FROM",
    "The best way to learn a new language is", "Q: What is the boiling point of water?\nA:",
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nList three fruits.<|im_end|>\n"
    "<|im_start|>assistant\n", "Dear Sir or Madam,\n\nI am writing to", "1, 1, 2, 3, 5, 8, 13,",
    "The mitochondria is the powerhouse of", "function add(a, b) {\n  return", "La capitale de l'Italie est",
    "Der schnellste Weg nach Berlin ist", "Recipe: chocolate chip cookies\nIngredients:\n-",
    "The stock market fell sharply today after", "#include <stdio.h>\n\nint main(void) {\n",
    "<|im_start|>user\nExplain gravity to a child.<|im_end|>\n<|im_start|>assistant\n",
    "Water is made of hydrogen and", "The quick brown fox", "Chapter 1\n\nIt was a dark and stormy night;",
    "To be, or not to be, that is", "A prime number is a natural number greater than 1 that",
    "<|im_start|>user\nTranslate 'good morning' into Spanish.<|im_end|>\n<|im_start|>assistant\n",
    "class Stack:\n    def __init__(self):\n", "The Pacific Ocean is the largest", "My favourite book is",
    "Step 1: Preheat the oven to", "The theory of relativity was developed by", "Monday, Tuesday, Wednesday,",
    "<|im_start|>user\nWhat is the capital of Japan?<|im_end|>\n<|im_start|>assistant\n",
    "for i in range(10):\n    print(", "Climate change is caused by", "The Great Wall of China",
    "An apple a day keeps",
]


def compare(ref: np.ndarray, ours: np.ndarray, start: int) -> dict:
    """Top-1 agreement at the reference's clear positions (margin >= 0.1) from `start` on."""
    agree = considered = 0
    flips = []
    for i in range(start, len(ref)):
        r, o = ref[i], ours[i]
        top2 = np.sort(r)[-2:]
        best, mine = int(np.argmax(r)), int(np.argmax(o))
        m = float(top2[1] - top2[0])
        if m >= 0.1:
            considered += 1
            agree += mine == best
        if mine != best:
            o2 = np.sort(o)[-2:]
            flips.append(dict(pos=i, ref_margin=round(m, 3), our_margin=round(float(o2[1] - o2[0]), 3),
                              gap=round(float(r[best] - r[mine]), 3), clear=m >= 0.1))
    return dict(agree=agree, considered=considered, flips=flips)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default=None)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompts", default=None, help="a JSON list of prompts (default: the built-in 40)")
    ap.add_argument("--scalar", action="store_true", help="also lowbit at LOWBIT_MAX_ISA=scalar")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    import lowbit
    from lowbit import peer
    path = a.model or lowbit.model.default_model_path()
    if a.child:  # lowbit's logits for the id lists in the file, written back as .npy files
        m = lowbit.load(path, n_ctx=1024, threads=a.threads)
        for k, ids in enumerate(json.load(open(a.child))):
            np.save(f"{a.child}.{k}.npy", m.logits(ids))
        return 0
    prompts = json.load(open(a.prompts)) if a.prompts else PROMPTS
    on = peer.Llama(path, extra_bufts=True, n_ctx=1024, n_batch=512, logits_all=True, n_threads=a.threads)
    off = peer.Llama(path, extra_bufts=False, n_ctx=1024, n_batch=512, logits_all=True, n_threads=a.threads)
    m = lowbit.load(path, n_ctx=1024, threads=a.threads)
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
    from llama_ref import llama_greedy
    runs = []
    for p in prompts:
        pids = on.tokenize(p.encode(), add_bos=False, special=True)
        ids, ref = llama_greedy(on, pids, a.gen)
        off.reset()
        off.eval(ids)
        runs.append((p, pids, ids, ref, np.array(off.scores[:len(ids)]), m.logits(ids)))
    contestants = {"llama.cpp, extra buffer types off": 4, "lowbit": 5}
    scalar = {}
    if a.scalar:
        import tempfile
        with tempfile.TemporaryDirectory() as d:
            f = os.path.join(d, "ids.json")
            json.dump([r[2] for r in runs], open(f, "w"))
            subprocess.run([sys.executable, __file__, "-m", path, "--child", f, "--threads", str(a.threads)],
                           check=True, env={**os.environ, "LOWBIT_MAX_ISA": "scalar"})
            scalar = {k: np.load(f"{f}.{k}.npy") for k in range(len(runs))}
    print(f"# {os.path.basename(path)}, {len(prompts)} prompts x {a.gen} greedy tokens (llama.cpp, extra buffer "
          f"types on, is the reference); CPU: {lowbit._native.lib.cpu_info()['model']}")
    rows = list(contestants.items()) + ([("lowbit, LOWBIT_MAX_ISA=scalar", "scalar")] if scalar else [])
    for name, idx in rows:
        tot = dict(agree=0, considered=0, flips=[])
        for k, r in enumerate(runs):
            ours = scalar[k] if idx == "scalar" else r[idx]
            c = compare(r[3], ours, len(r[1]) - 1)
            tot["agree"] += c["agree"]
            tot["considered"] += c["considered"]
            tot["flips"] += [dict(prompt=k, **f) for f in c["flips"]]
        clear = [f for f in tot["flips"] if f["clear"]]
        worst = max((f["gap"] for f in tot["flips"]), default=0.0)
        print(f"{name:36} top-1 {tot['agree']}/{tot['considered']} = {100 * tot['agree'] / tot['considered']:.2f}% "
              f"at clear positions; flips {len(tot['flips'])} ({len(clear)} clear), worst gap {worst:.3f}")
        for f in clear:
            print(f"    prompt {f['prompt']:2} pos {f['pos']:3}: reference margin {f['ref_margin']:.3f}, "
                  f"contestant's {f['our_margin']:.3f}, gap {f['gap']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
