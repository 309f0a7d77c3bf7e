"""Speculative decoding: exact under greedy sampling, the target's distribution under sampling.

Greedy: for every k in 1..8 and every drafter (prompt lookup, a draft model, a drafter that
proposes garbage so most rounds reject) the tokens equal plain decoding's, token for token.
That rests on the window-vs-alone bitwise identity of the logits (test_engine.py's
test_window_equals_one_token_at_a_time_bitwise, and the direct check below).
Sampling: on a small Markov "model" (vocabulary 6, logits a function of the last token) the
frequencies of the first three tokens drawn by plain sampling and by speculative sampling,
with a draft model that disagrees and with deterministic (lookup-style) drafts, agree by a
chi-square test at p > 1e-4 (fixed seeds, so the outcome is deterministic); the same test
rejects a verifier that accepts every draft, so it has the power to fail.
"""
import os
import subprocess
import sys

import numpy as np
import pytest

import lowbit
from lowbit.generate import DraftModel, Lookup, Stats, plain, speculative, verify
from lowbit.sampling import Sampler

SCALAR = os.environ.get("LOWBIT_MAX_ISA") == "scalar"
GEN = 8 if SCALAR else 24
KS = [1, 3, 8] if SCALAR else list(range(1, 9))  # the scalar level is ~10x slower: fewer k there
PROMPTS = [
    "The capital of France is",
    "Copy this list exactly: apples, pears, plums, cherries. Again: apples, pears,",
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n",
]


@pytest.fixture(scope="module")
def target():
    return lowbit.load(n_ctx=256, threads=2)


@pytest.fixture(scope="module")
def draft(tmp_path_factory):
    """The default model rewritten in Q4_0: it agrees with the target most of the time, not always."""
    from lowbit.quantize import quantize_file
    p = tmp_path_factory.mktemp("spec") / "draft-q4_0.gguf"
    quantize_file(lowbit.model.default_model_path(), p, "Q4_0", allow_requantize=True)
    return lowbit.load(p, n_ctx=256, threads=2)


def tokens(model, prompt, drafter=None, k=4, n=GEN, sampler=None):
    ids = model.tokenize(prompt)
    sampler = sampler or Sampler()
    model.reset()
    st = Stats()
    gen = plain(model, ids, sampler, st) if drafter is None else speculative(model, ids, sampler, drafter, k, st)
    out = [t for _, t in zip(range(n), gen)]
    gen.close()
    return out, st


class Garbage:
    """Proposes tokens the target almost never picks: nearly every round rejects at once."""

    def __init__(self, seed=0):
        self.rng = np.random.default_rng(seed)

    def start(self, ids):
        pass

    def propose(self, history, k):
        return self.rng.integers(0, 49152, size=k).tolist(), None

    def commit(self, history):
        pass


@pytest.mark.parametrize("prompt", PROMPTS[1:2] if SCALAR else PROMPTS[1:])
def test_greedy_speculative_equals_plain_for_every_k_and_drafter(target, draft, prompt):
    want, _ = tokens(target, prompt)
    accepted = {}
    for k in KS:
        for name, drafter in [("lookup", Lookup()), ("draft", DraftModel(draft, Sampler())), ("garbage", Garbage(k))]:
            got, st = tokens(target, prompt, drafter, k)
            assert got == want, f"{name} k={k}: first difference at {next(i for i, (a, b) in enumerate(zip(got, want)) if a != b)}"
            assert st.rounds > 0 and st.drafted >= st.accepted
            accepted[name] = accepted.get(name, 0) + st.accepted
    # the drafters really drafted: the draft model is mostly right, garbage almost never
    assert accepted["draft"] > 4 * accepted["garbage"]


def test_verified_window_logits_equal_one_token_steps_bitwise(target):
    """What verification reads: rows of a window forward at a position == single steps there."""
    ids = target.tokenize(PROMPTS[1])
    target.reset()
    target.forward(ids[:9])
    window = target.forward(ids[9:17], all_logits=True)
    target.rewind(9)
    alone = np.concatenate([target.forward([t], all_logits=True) for t in ids[9:17]])
    assert np.array_equal(window.view(np.uint32), alone.view(np.uint32))


def test_draft_cache_is_rolled_back_to_the_accepted_text(target, draft):
    d = DraftModel(draft, Sampler())
    tokens(target, PROMPTS[0], d, k=6)
    # after the last round the draft's cache holds a prefix of the text, nothing rejected
    # (the text runs on past what the caller took: the last round yields up to k + 1 tokens)
    more, _ = tokens(target, PROMPTS[0], n=GEN + 8)
    hist = target.tokenize(PROMPTS[0]) + more
    assert len(d.m.tokens) > len(target.tokenize(PROMPTS[0]))
    assert d.m.tokens == hist[:len(d.m.tokens)]


def test_generate_api_and_cli(target, draft):
    plain_text = "".join(target.generate(PROMPTS[1], max_tokens=24))
    assert "".join(target.generate(PROMPTS[1], max_tokens=24, draft="lookup", spec=3)) == plain_text
    assert "".join(target.generate(PROMPTS[1], max_tokens=24, draft=draft, spec=5)) == plain_text
    st = Stats()
    list(target.generate(PROMPTS[1], max_tokens=24, draft="lookup", stats=st))
    line = st.line()
    assert "tokens per round" in line and "ms per round" in line and "draft" in line and "verify" in line
    with pytest.raises(ValueError, match="lookup"):
        list(target.generate("hi", draft="nonsense"))
    with pytest.raises(ValueError, match="spec"):
        list(target.generate("hi", draft="lookup", spec=0))
    path = lowbit.model.default_model_path()
    run = [sys.executable, "-m", "lowbit.cli", "run", "-m", path, "-p", PROMPTS[1], "-n", "16", "-t", "2", "--temp", "0"]
    outs = [subprocess.run(run + extra, capture_output=True, text=True, timeout=300)
            for extra in ([], ["--lookup", "--spec", "5"], ["--draft", draft.path, "--spec", "2"])]
    for r in outs:
        assert r.returncode == 0, r.stderr
    assert outs[0].stdout == outs[1].stdout == outs[2].stdout
    assert "speculative" in outs[1].stderr and "speculative" in outs[2].stderr


def test_draft_with_another_vocabulary_is_refused(target, tmp_path):
    from lowbit.synth import default_vocab, synth_dense
    v = default_vocab()
    v["tokenizer.ggml.tokens"] = list(v["tokenizer.ggml.tokens"])
    v["tokenizer.ggml.tokens"][1000] = "<not-the-same>"
    other = lowbit.load(synth_dense(tmp_path / "other.gguf", layers=1, dim=64, ffn=128, vocab=v), n_ctx=64)
    with pytest.raises(ValueError, match="vocabulary"):
        list(target.generate("hi", draft=other))


# ---- the sampling path on a small vocabulary problem ---------------------------------------
V = 6


class Markov:
    """A stand-in model: the next-token logits are table[last token]; the KV cache is the token
    list. Enough of Model's interface for plain(), speculative() and DraftModel."""

    def __init__(self, table, n_ctx=64):
        self.table, self.n_ctx, self.tokens, self.pos = table, n_ctx, [], 0

    def forward(self, toks, all_logits=False):
        assert self.pos + len(toks) <= self.n_ctx
        self.tokens += list(toks)
        self.pos += len(toks)
        rows = [self.table[t] for t in toks]
        return np.array(rows if all_logits else rows[-1:], dtype=np.float32)

    def rewind(self, pos):
        assert 0 <= pos <= self.pos
        self.pos = pos
        del self.tokens[pos:]

    def reset(self):
        self.rewind(0)


class Repeat:
    """Deterministic drafts (q one-hot, as prompt lookup): propose the last token again."""

    def start(self, ids):
        pass

    def propose(self, history, k):
        return [history[-1]] * k, None

    def commit(self, history):
        pass


def _draws(make_gen, n, seed):
    counts = {}
    for i in range(n):
        seq = tuple(t for _, t in zip(range(3), make_gen(seed * 1_000_003 + i)))
        counts[seq] = counts.get(seq, 0) + 1
    return counts


def _chi2_p(a: dict, b: dict) -> float:
    """p-value of a two-sample chi-square test of homogeneity (cells with few counts pooled)."""
    from math import exp, lgamma, log
    keys = sorted(set(a) | set(b))
    na, nb = sum(a.values()), sum(b.values())
    big = [k for k in keys if a.get(k, 0) + b.get(k, 0) >= 10]
    small = [k for k in keys if k not in big]
    rows = [(a.get(k, 0), b.get(k, 0)) for k in big] + [(sum(a.get(k, 0) for k in small), sum(b.get(k, 0) for k in small))]
    rows = [r for r in rows if r[0] + r[1] > 0]
    chi = 0.0
    for x, y in rows:
        t = x + y
        ea, eb = t * na / (na + nb), t * nb / (na + nb)
        chi += (x - ea) ** 2 / ea + (y - eb) ** 2 / eb
    dof = len(rows) - 1
    # upper tail of chi-square(dof) by the regularized incomplete gamma series / continued fraction
    s, x = dof / 2.0, chi / 2.0
    if x <= 0:
        return 1.0
    if x < s + 1:
        term = total = 1.0 / s
        for n in range(1, 1000):
            term *= x / (s + n)
            total += term
        return 1.0 - exp(-x + s * log(x) - lgamma(s)) * total
    # Lentz continued fraction for Q(s, x)
    b, c, d = x + 1 - s, 1e300, 1 / (x + 1 - s)
    h = d
    for n in range(1, 1000):
        an = -n * (n - s)
        b += 2
        d = an * d + b
        d = 1 / d
        c = b + an / c
        h *= d * c
    return exp(-x + s * log(x) - lgamma(s)) * h


@pytest.mark.parametrize("filters", [dict(temperature=1.0), dict(temperature=0.7, top_k=3)])
def test_speculative_sampling_draws_from_the_target_distribution(filters):
    rng = np.random.default_rng(0)
    p_table = rng.standard_normal((V, V)) * 1.5
    q_table = p_table + rng.standard_normal((V, V)) * 1.5  # a draft that often disagrees
    N = 6000

    def plain_gen(seed):
        return plain(Markov(p_table), [0], Sampler(seed=seed, **filters), Stats())

    def spec_draft(seed):
        s = Sampler(seed=seed, **filters)
        return speculative(Markov(p_table), [0], s, DraftModel(Markov(q_table), s), 3, Stats())

    def spec_repeat(seed):
        return speculative(Markov(p_table), [0], Sampler(seed=seed, **filters), Repeat(), 2, Stats())

    ref = _draws(plain_gen, N, 1)
    for name, g in [("draft model", spec_draft), ("deterministic drafts", spec_repeat)]:
        p = _chi2_p(ref, _draws(g, N, 2))
        assert p > 1e-4, f"{name}: speculative sampling frequencies differ from plain sampling (p={p:.2e})"


def test_the_chi_square_check_can_fail():
    """A verifier that accepts every draft samples the draft's distribution: the test sees it."""
    rng = np.random.default_rng(0)
    p_table = rng.standard_normal((V, V)) * 1.5
    q_table = p_table + rng.standard_normal((V, V)) * 1.5

    def accept_all(logits, drafts, q, history, sampler):
        return len(drafts), sampler.sample(logits[len(drafts)], list(history) + list(drafts))

    import lowbit.generate as g

    def spec_bad(seed):
        s = Sampler(seed=seed, temperature=1.0)
        return speculative(Markov(p_table), [0], s, DraftModel(Markov(q_table), s), 3, Stats())

    ref = _draws(lambda seed: plain(Markov(p_table), [0], Sampler(seed=seed, temperature=1.0), Stats()), 6000, 1)
    orig = g.verify
    g.verify = accept_all
    try:
        bad = _draws(spec_bad, 6000, 2)
    finally:
        g.verify = orig
    assert g.verify is verify
    assert _chi2_p(ref, bad) < 1e-4
