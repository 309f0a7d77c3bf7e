"""Token sampling: greedy, temperature, top-k, top-p, min-p, repetition penalty, seed."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class Sampler:
    temperature: float = 0.0     # <= 0: greedy (argmax)
    top_k: int = 0               # 0: off
    top_p: float = 1.0           # 1: off
    min_p: float = 0.0           # 0: off; keep tokens with p >= min_p * p_max
    repeat_penalty: float = 1.0  # 1: off; llama.cpp's rule: divide positive logits, multiply negative
    repeat_last_n: int = 64
    seed: int | None = None
    rng: np.random.Generator = field(init=False, repr=False)

    def __post_init__(self):
        if self.top_k < 0 or not 0.0 < self.top_p <= 1.0 or not 0.0 <= self.min_p <= 1.0 or self.repeat_penalty <= 0:
            raise ValueError("sampling: need top_k >= 0, 0 < top_p <= 1, 0 <= min_p <= 1, repeat_penalty > 0")
        self.rng = np.random.default_rng(self.seed)

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    def penalize(self, logits: np.ndarray, history: list[int]) -> np.ndarray:
        if self.repeat_penalty == 1.0 or not history:
            return logits
        logits = logits.copy()
        ids = np.unique(np.asarray(history[-self.repeat_last_n:], dtype=np.int64))
        v = logits[ids]
        logits[ids] = np.where(v > 0, v / self.repeat_penalty, v * self.repeat_penalty)
        return logits

    def probs(self, logits: np.ndarray, history: list[int] = ()) -> np.ndarray:
        """The distribution sampling draws from (after penalty, temperature and the filters), over
        the whole vocabulary."""
        if self.greedy:
            z = self.penalize(np.asarray(logits, dtype=np.float64), list(history))
            p = np.zeros_like(z)
            p[int(np.argmax(z))] = 1.0
            return p
        ids, q = self.candidates(logits, history)
        p = np.zeros(np.asarray(logits).size)
        p[ids] = q
        return p

    def candidates(self, logits: np.ndarray, history: list[int] = ()) -> tuple[np.ndarray, np.ndarray]:
        """The tokens a (non-greedy) draw can give, ascending, and their probabilities (float64,
        summing to 1): probs() without its zeros."""
        ids, p = self._filtered(logits, history)
        return (np.arange(p.size) if ids is None else ids), p

    def _filtered(self, logits: np.ndarray, history) -> tuple[np.ndarray | None, np.ndarray]:
        """candidates(), with ids None when every token stays. Only the penalty, the temperature
        and the top-k cut touch the whole vocabulary (O(vocab)); the softmax, min-p and top-p run
        on the top-k survivors (llama.cpp's order: top-k, then the softmax, min-p, top-p). With
        llama.cpp's defaults on a 49152-token vocabulary this is ~0.2 ms a token, where a float64
        softmax and a sort of the whole vocabulary took ~3 ms. The exponentials are float32 (as
        llama.cpp's softmax; within 2e-6 relative of float64's), summed in float64."""
        z = self.penalize(np.asarray(logits, dtype=np.float64), list(history))
        if self.temperature != 1.0:
            z = z / self.temperature
        ids = None
        if self.top_k and self.top_k < z.size:
            kth = np.partition(z, -self.top_k)[-self.top_k]
            ids = np.flatnonzero(z >= kth)  # (ties at the k-th value all stay)
            z = z[ids]
        e = np.exp((z - z.max()).astype(np.float32))  # (float32's exp, as llama.cpp's: 4x faster)
        p = e / e.sum(dtype=np.float64)
        if self.min_p > 0.0 or self.top_p < 1.0:
            ids = np.arange(p.size) if ids is None else ids
        if self.min_p > 0.0:
            keep = p >= self.min_p * p.max()
            ids, p = ids[keep], p[keep] / p[keep].sum()
        if self.top_p < 1.0:
            keep = _nucleus(p, self.top_p)
            ids, p = ids[keep], p[keep] / p[keep].sum()
        return ids, p

    def sample(self, logits: np.ndarray, history: list[int] = ()) -> int:
        if self.greedy:
            return int(np.argmax(self.penalize(np.asarray(logits), list(history))))
        ids, p = self._filtered(logits, history)
        # numpy's Generator.choice(n, p=p) on the candidates: one uniform draw against the
        # normalised cumulative sum (the same draw over the whole vocabulary: zeros add nothing)
        cdf = np.cumsum(p)
        i = min(int(np.searchsorted(cdf / cdf[-1], self.rng.random(), side="right")), p.size - 1)
        return i if ids is None else int(ids[i])


def _nucleus(p: np.ndarray, top_p: float) -> np.ndarray:
    """Positions (ascending) of the smallest set of the most likely entries of p whose sum reaches
    top_p: p sorted by -p, ties by the lower position, cut after the first prefix sum >= top_p.
    Without top-k, p is the whole vocabulary and a full sort costs ~8 ms: the nucleus is looked
    for among the m largest (m = 64, 256, ...; a partition is O(size)) and that is exact as long
    as the cut falls on a value above the m-th largest (below it, ties could reorder: sort all)."""
    m = 64
    while True:
        if m >= p.size:
            order = np.argsort(-p, kind="stable")
            break
        top = np.sort(np.argpartition(-p, m - 1)[:m])  # the m largest (any of a tie at the m-th)
        order = top[np.argsort(-p[top], kind="stable")]
        cum = np.cumsum(p[order])
        n = int(np.searchsorted(cum, top_p) + 1)
        if n < m and p[order[n - 1]] > p[order[-1]]:
            return np.sort(order[:n])
        m *= 4
    n = int(np.searchsorted(np.cumsum(p[order]), top_p) + 1)
    return np.sort(order[:n])

