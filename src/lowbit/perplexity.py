"""Perplexity as llama.cpp's perplexity tool computes it.

The text is tokenized once (with BOS if the model adds one), cut into chunks of `ctx` tokens;
each chunk is evaluated from an empty cache and only the second half of its positions is
scored (the first half is context), so every scored token sees at least ctx/2 tokens.
"""
from __future__ import annotations

import math
import sys

import numpy as np


def chunk_nll(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """-log p(target) per row, in float64, with a stable log-sum-exp."""
    z = logits.astype(np.float64)
    m = z.max(axis=1)
    lse = m + np.log(np.exp(z - m[:, None]).sum(axis=1))
    return lse - z[np.arange(len(targets)), targets]


def perplexity(model, text: str, ctx: int = 512, progress: bool = True) -> tuple[float, int]:
    toks = model.tokenize(text)
    if ctx < 4 or ctx > model.n_ctx:
        raise ValueError(f"--ppl-ctx must be in 4..{model.n_ctx}")
    n_chunks = len(toks) // ctx
    if n_chunks < 1:
        raise ValueError(f"the text has {len(toks)} tokens, fewer than one chunk of {ctx}")
    nll, count = 0.0, 0
    first = ctx // 2
    for c in range(n_chunks):
        chunk = toks[c * ctx:(c + 1) * ctx]
        logits = model.logits(chunk)
        nll += chunk_nll(logits[first:ctx - 1], np.asarray(chunk[first + 1:ctx])).sum()
        count += ctx - 1 - first
        if progress:
            done = (c + 1) / n_chunks
            bar = "#" * int(30 * done)
            print(f"\r[{bar:<30}] chunk {c + 1}/{n_chunks}  ppl {math.exp(nll / count):.4f}",
                  end="", file=sys.stderr, flush=True)
    if progress:
        print(file=sys.stderr)
    return math.exp(nll / count), count
