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
        """The distribution sampling draws from (after penalty, temperature and the filters)."""
        z = self.penalize(np.asarray(logits, dtype=np.float64), list(history))
        if self.greedy:
            p = np.zeros_like(z)
            p[int(np.argmax(z))] = 1.0
            return p
        z = z / self.temperature
        if self.top_k and self.top_k < z.size:
            kth = np.partition(z, -self.top_k)[-self.top_k]
            z = np.where(z >= kth, z, -np.inf)
        p = np.exp(z - z.max())
        p /= p.sum()
        if self.min_p > 0.0:
            p = np.where(p >= self.min_p * p.max(), p, 0.0)
            p /= p.sum()
        if self.top_p < 1.0:
            order = np.argsort(-p, kind="stable")
            cum = np.cumsum(p[order])
            keep = order[: int(np.searchsorted(cum, self.top_p) + 1)]
            q = np.zeros_like(p)
            q[keep] = p[keep]
            p = q / q.sum()
        return p

    def sample(self, logits: np.ndarray, history: list[int] = ()) -> int:
        if self.greedy:
            return int(np.argmax(self.penalize(np.asarray(logits), list(history))))
        p = self.probs(logits, history)
        return int(self.rng.choice(p.size, p=p))
