"""Token sampling: greedy, temperature, top-k, top-p, min-p, repetition / presence / frequency
penalties, seed."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np


@dataclass
class Sampler:
    """One sequence's sampling rule (and its random stream).

    The order, in one place. What the server does before the Sampler sees a row: logit_bias is
    added (OpenAI's rule), then a structured output's grammar masks what it cannot take
    (scheduler._sample / _verify). Then, here (penalize, then probs / sample):
      1. repeat_penalty over the last repeat_last_n tokens of prompt + generated text
         (llama.cpp's rule: divide a positive logit, multiply a negative one);
      2. presence / frequency penalties (OpenAI's rule):
             logit[t] -= frequency_penalty * count[t] + presence_penalty * (count[t] > 0)
         count[t]: how often t occurs in history[prompt_len:], the tokens generated so far in
         this sequence (all of them: no window);
      3. greedy: the argmax. Else temperature, top-k, the softmax, min-p, top-p (_support), the
         draw (draw(): the token numpy's Generator.choice gives for one uniform draw).
    Log-probabilities reported to clients (server logprobs, generate(logprobs=k)) are of the raw
    logits, before all of this (generate.token_logprobs).

    The penalties' window: OpenAI defines the counts over the text generated so far, and clients
    tune these two fields against that definition, so lowbit counts every generated token and
    no prompt token (a word of the question is not penalised in the answer). llama.cpp's server
    applies the same two terms, in the same pass as its repeat penalty, to the last
    penalty_last_n (64) tokens of prompt and generation: it feeds the prompt to its sampler
    chain (tools/server/server-context.cpp: common_sampler_accept(..., false) per prompt token;
    src/llama-sampler.cpp: llama_sampler_penalties_apply). Past 64 generated tokens, and for
    tokens of the prompt, the two differ.

    prompt_len: where the generated tokens start in the `history` passed to sample / probs; the
    owner of the sequence sets it (generate(), the scheduler's submit). Counting is vectorised
    (np.unique over the generated ids: O(generated) per token, nothing over the vocabulary
    beyond the row copy the penalties need)."""
    temperature: float = 0.0     # <= 0: greedy (argmax)
    top_k: int = 0               # 0: off
    top_p: float = 1.0           # 1: off
    min_p: float = 0.0           # 0: off; keep tokens with p >= min_p * p_max
    repeat_penalty: float = 1.0  # 1: off; llama.cpp's rule: divide positive logits, multiply negative
    repeat_last_n: int = 64
    seed: int | None = None
    presence_penalty: float = 0.0   # 0: off; -2..2, subtracted once from each generated token's logit
    frequency_penalty: float = 0.0  # 0: off; -2..2, subtracted per occurrence in the generated tokens
    prompt_len: int = 0          # history[prompt_len:] are the generated tokens (presence / frequency)
    rng: np.random.Generator = field(init=False, repr=False)

    def __post_init__(self):
        if self.top_k < 0 or not 0.0 < self.top_p <= 1.0 or not 0.0 <= self.min_p <= 1.0 or self.repeat_penalty <= 0:
            raise ValueError("sampling: need top_k >= 0, 0 < top_p <= 1, 0 <= min_p <= 1, repeat_penalty > 0")
        if not (-2.0 <= self.presence_penalty <= 2.0 and -2.0 <= self.frequency_penalty <= 2.0):
            raise ValueError("sampling: presence_penalty and frequency_penalty must be in -2..2 (OpenAI's range)")
        self.rng = np.random.default_rng(self.seed)

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    def replace(self, **changes) -> "Sampler":
        """A copy with some fields changed, and a fresh random stream from its seed (a draft
        model's sampler, choice i of a request)."""
        return dataclasses.replace(self, **changes)

    def choice(self, i: int) -> "Sampler":
        """The sampler of choice i of an n-choice request. Choice 0 is this sampler's own seed
        (so n=1 and choice 0 of n draw the same); choice i > 0 is seeded with the first 64-bit
        word of numpy's SeedSequence([seed, i]): deterministic in (seed, i), independent
        streams. No seed: every choice draws fresh entropy."""
        if i == 0:
            return self.replace()
        if self.seed is None:
            return self.replace(seed=None)
        word = np.random.SeedSequence([self.seed, i]).generate_state(1, np.uint64)[0]
        return self.replace(seed=int(word))

    def penalize(self, logits: np.ndarray, history) -> np.ndarray:
        """logits after steps 1 and 2 of the order (a copy; the input when no penalty applies)."""
        repeat = self.repeat_penalty != 1.0 and len(history) > 0
        counted = (self.presence_penalty != 0.0 or self.frequency_penalty != 0.0) and len(history) > self.prompt_len
        if not repeat and not counted:
            return logits
        logits = logits.copy()
        if repeat:
            ids = np.unique(np.asarray(history[-self.repeat_last_n:], dtype=np.int64))
            v = logits[ids]
            logits[ids] = np.where(v > 0, v / self.repeat_penalty, v * self.repeat_penalty)
        if counted:
            ids, count = np.unique(np.asarray(history[self.prompt_len:], dtype=np.int64), return_counts=True)
            logits[ids] -= self.frequency_penalty * count + self.presence_penalty
        return logits

    def _support(self, logits: np.ndarray, history) -> tuple[np.ndarray | None, np.ndarray]:
        """(ids, p): the tokens a draw can give, ascending (None: every id), and their
        probabilities (float64, summing to 1), after penalties, temperature and the filters.
        Past top-k only the k survivors are worked on; the softmax's exps are float32, each to 1
        ulp, summed in float64 (numpy's float64 exp has no AVX2 SIMD path: 0.6 ms per 49152-token
        row, most of a sampled token's cost before; BENCHMARKS.md, "Sampling features' cost")."""
        z = self.penalize(np.asarray(logits, dtype=np.float64), history) / self.temperature
        ids = None
        if self.top_k and self.top_k < z.size:
            kth = np.partition(z, -self.top_k)[-self.top_k]
            ids = np.flatnonzero(z >= kth)  # (ties at the k-th value all stay)
            z = z[ids]
        p = np.exp((z - z.max()).astype(np.float32)).astype(np.float64)
        p /= p.sum()
        if self.min_p > 0.0:
            keep = np.flatnonzero(p >= self.min_p * p.max())
            ids, p = (keep if ids is None else ids[keep]), p[keep]
            p /= p.sum()
        if self.top_p < 1.0:
            keep = _nucleus(p, self.top_p)
            ids, p = (keep if ids is None else ids[keep]), p[keep]
            p /= p.sum()
        return ids, p

    def probs(self, logits: np.ndarray, history=()) -> np.ndarray:
        """The distribution sampling draws from (after penalty, temperature and the filters)."""
        if self.greedy:
            p = np.zeros(np.shape(logits)[-1])
            p[int(np.argmax(self.penalize(np.asarray(logits, dtype=np.float64), history)))] = 1.0
            return p
        ids, q = self._support(logits, history)
        if ids is None:
            return q
        p = np.zeros(np.shape(logits)[-1])
        p[ids] = q
        return p

    def sample(self, logits: np.ndarray, history=()) -> int:
        if self.greedy:
            return int(np.argmax(self.penalize(np.asarray(logits), history)))
        ids, p = self._support(logits, history)
        j = draw(p, self.rng.random())
        return j if ids is None else int(ids[j])


def _nucleus(p: np.ndarray, top_p: float) -> np.ndarray:
    """Positions (ascending) of the smallest set of the most likely entries of p whose sum reaches
    top_p: p sorted by -p, ties by the lower position, cut after the first prefix sum >= top_p.
    Without top-k, p is the whole vocabulary and a full sort costs ~8 ms: the nucleus is looked
    for among the m largest (m = 64, 256, ...; a partition is O(size)) and that is exact as long
    as the cut falls on a value above the m-th largest (below it, ties could reorder: sort all)."""
    m = 64
    while m < p.size:
        top = np.sort(np.argpartition(-p, m - 1)[:m])  # the m largest (any of a tie at the m-th)
        order = top[np.argsort(-p[top], kind="stable")]
        n = int(np.searchsorted(np.cumsum(p[order]), top_p) + 1)
        if n < m and p[order[n - 1]] > p[order[-1]]:
            return np.sort(order[:n])
        m *= 4
    order = np.argsort(-p, kind="stable")  # (ties: the lower position first)
    return np.sort(order[: int(np.searchsorted(np.cumsum(p[order]), top_p) + 1)])


DRAW_BLOCK = 256  # probabilities per block of draw()'s two-level search


def draw(p: np.ndarray, u: float) -> int:
    """The index numpy's Generator.choice(p.size, p=p) gives for its uniform draw u: the first i
    whose cumulative probability exceeds u (the zeros outside a support add nothing, so a draw
    over the support is the same token as over the whole vocabulary). A whole-vocabulary cumsum
    is sequential (0.2 ms for 49152 probabilities here), so a long p is searched in two levels:
    the blocks' sums (vectorised), then one block's cumsum. The sums' rounding differs from
    one long cumsum only in the last bits: a different token only when u falls within ~1e-16 of
    a boundary."""
    if p.size <= 16 * DRAW_BLOCK:
        cdf = np.cumsum(p)
        return min(int(cdf.searchsorted(u * cdf[-1], side="right")), p.size - 1)
    n = p.size // DRAW_BLOCK * DRAW_BLOCK
    sums = np.append(p[:n].reshape(-1, DRAW_BLOCK).sum(axis=1), p[n:].sum())
    cum = np.cumsum(sums)
    target = u * cum[-1]
    b = min(int(cum.searchsorted(target, side="right")), sums.size - 1)
    block = p[b * DRAW_BLOCK:(b + 1) * DRAW_BLOCK]
    cdf = np.cumsum(block) + (cum[b - 1] if b else 0.0)
    return b * DRAW_BLOCK + min(int(cdf.searchsorted(target, side="right")), block.size - 1)
