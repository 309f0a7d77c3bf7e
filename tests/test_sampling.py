"""Sampler: presence / frequency penalties against values written out by hand, their order with
the repeat penalty, the window (generated tokens only), choices' seeds; generate.token_logprobs."""
import math

import numpy as np
import pytest

from lowbit.generate import token_logprobs
from lowbit.sampling import Sampler

LOGITS = np.array([1.0, 2.0, -1.0, 0.5, 3.0, -2.0], dtype=np.float32)


def test_presence_and_frequency_by_hand():
    # prompt [4, 4, 1] (not counted), generated [0, 3, 0, 5, 0]: counts 0 -> 3, 3 -> 1, 5 -> 1
    history = [4, 4, 1, 0, 3, 0, 5, 0]
    s = Sampler(presence_penalty=0.5, frequency_penalty=0.25, prompt_len=3)
    want = [1.0 - 0.25 * 3 - 0.5, 2.0, -1.0, 0.5 - 0.25 - 0.5, 3.0, -2.0 - 0.25 - 0.5]
    np.testing.assert_allclose(s.penalize(LOGITS, history), want, rtol=0, atol=1e-6)
    # negative values reward repetition (OpenAI allows -2..2)
    s = Sampler(presence_penalty=-1.0, frequency_penalty=-2.0, prompt_len=3)
    np.testing.assert_allclose(s.penalize(LOGITS, history), [1 + 6 + 1, 2, -1, 0.5 + 2 + 1, 3, -2 + 2 + 1],
                               rtol=0, atol=1e-6)


def test_nothing_generated_or_zero_penalties_leave_the_logits():
    s = Sampler(presence_penalty=2.0, frequency_penalty=2.0, prompt_len=3)
    assert s.penalize(LOGITS, [4, 4, 1]) is LOGITS  # only prompt tokens: nothing counted
    assert Sampler(prompt_len=0).penalize(LOGITS, [0, 1, 2]) is LOGITS


def test_repeat_penalty_then_presence_frequency():
    # llama.cpp's order (llama_sampler_penalties_apply): the repeat penalty's divide/multiply over
    # the last repeat_last_n tokens of prompt + generated, then the subtraction over generated ones
    history = [4, 2, 0, 0]  # prompt [4, 2], generated [0, 0]
    s = Sampler(repeat_penalty=2.0, repeat_last_n=3, presence_penalty=0.5, frequency_penalty=0.25, prompt_len=2)
    # last 3 tokens {2, 0}: 1.0 / 2 = 0.5, -1.0 * 2 = -2.0; then token 0: - 0.25 * 2 - 0.5
    want = [0.5 - 1.0, 2.0, -2.0, 0.5, 3.0, -2.0]
    np.testing.assert_allclose(s.penalize(LOGITS, history), want, rtol=0, atol=1e-6)


def test_penalties_change_greedy_and_probs():
    # greedy argmax is 4 (3.0); generated once with presence 1.5 -> 1.5 < 2.0: token 1 wins
    s = Sampler(presence_penalty=1.5, prompt_len=1)
    assert s.sample(LOGITS, [0, 4]) == 1
    t = Sampler(temperature=1.0, presence_penalty=1.5, prompt_len=1)
    z = np.array([1.0, 2.0, -1.0, 0.5, 1.5, -2.0])
    want = np.exp(z) / np.exp(z).sum()
    np.testing.assert_allclose(t.probs(LOGITS, [0, 4]), want, rtol=1e-6, atol=0)  # (float32 exps)


def test_out_of_range_penalties_are_refused():
    for kw in ({"presence_penalty": 2.5}, {"frequency_penalty": -2.01}):
        with pytest.raises(ValueError, match="-2..2"):
            Sampler(**kw)


def test_choice_seeds():
    s = Sampler(temperature=1.0, seed=7)
    a, b = s.choice(0), s.choice(1)
    assert a.seed == 7 and b.seed != 7 and s.choice(1).seed == b.seed  # deterministic in (seed, i)
    assert s.choice(2).seed not in (7, b.seed)
    assert Sampler(seed=None).choice(3).seed is None
    assert a.rng.random() == Sampler(temperature=1.0, seed=7).rng.random()  # a fresh stream


def test_token_logprobs_against_float64_by_hand():
    row = np.array([0.0, 2.0, 2.0, -1.0, 1.0], dtype=np.float32)
    lse = math.log(sum(math.exp(v) for v in [0.0, 2.0, 2.0, -1.0, 1.0]))
    lp, top = token_logprobs(row, 3, 3)
    assert lp == pytest.approx(-1.0 - lse, abs=1e-7)  # (log_softmax: within ~1e-7 of float64)
    assert list(top) == [1, 2, 4]  # most likely first, ties by id
    assert top[4] == pytest.approx(1.0 - lse, abs=1e-7)
    assert token_logprobs(row, 0, 0)[1] == {}
    assert list(token_logprobs(row, 0, 9)[1]) == [1, 2, 4, 0, 3]


def reference_probs(z, temperature, top_k=0, top_p=1.0, min_p=0.0):
    """The filters written out plainly in float64 over the whole vocabulary."""
    z = np.asarray(z, dtype=np.float64) / temperature
    if top_k:
        z = np.where(z >= np.sort(z)[-top_k], z, -np.inf)
    p = np.exp(z - z.max())
    p /= p.sum()
    if min_p:
        p = np.where(p >= min_p * p.max(), p, 0.0)
        p /= p.sum()
    if top_p < 1.0:
        order = sorted(range(p.size), key=lambda i: (-p[i], i))
        kept, total = [], 0.0
        for i in order:
            kept.append(i)
            total += p[i]
            if total >= top_p:
                break
        q = np.zeros_like(p)
        q[kept] = p[kept]
        p = q / q.sum()
    return p


@pytest.mark.parametrize("filters", [dict(temperature=1.0), dict(temperature=0.7, top_k=40),
                                     dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05),
                                     dict(temperature=1.3, top_p=0.5), dict(temperature=0.9, min_p=0.1),
                                     dict(temperature=1.0, top_k=3, top_p=0.99)])
def test_probs_and_draws_against_the_plain_filters(filters):
    rng = np.random.default_rng(3)
    z = (rng.standard_normal(4000) * 3).astype(np.float32)
    want = reference_probs(z, **filters)
    got = Sampler(seed=1, **filters).probs(z)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-12)
    assert (got > 0).sum() == (want > 0).sum()
    # draws: the same tokens as numpy's Generator.choice over the reference distribution
    s, g = Sampler(seed=9, **filters), np.random.default_rng(9)
    draws = [s.sample(z) for _ in range(300)]
    assert draws == [int(g.choice(want.size, p=want)) for _ in range(300)]


def test_draw_is_generator_choice():
    from lowbit.sampling import draw
    rng = np.random.default_rng(4)
    for n in (1, 7, 4096, 4097, 49152, 50001):
        p = rng.random(n) ** 8
        p[rng.random(n) < 0.5] = 0.0  # zeros inside, as a filtered row has
        p[-1] += 1e-3
        p /= p.sum()
        a, b = np.random.default_rng(n), np.random.default_rng(n)
        assert [draw(p, a.random()) for _ in range(200)] == [int(b.choice(n, p=p)) for _ in range(200)]
    assert draw(np.array([0.25, 0.75]), 0.0) == 0 and draw(np.array([0.25, 0.75]), 0.999999) == 1


@pytest.mark.parametrize("filters", [dict(temperature=1.3, top_p=0.5), dict(temperature=2.0, top_p=0.95),
                                     dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05)])
def test_top_p_with_ties_at_its_edge(filters):
    """Ties around the k-th value and the top-p cut: without top-k the nucleus is looked for among
    the m largest (sampling._nucleus) and must fall back to a full sort when its cut lands on a
    tie with the m-th; the kept set and the probabilities are the plain filters' all the same."""
    rng = np.random.default_rng(5)
    for trial in range(12):
        z = (rng.standard_normal(3000) * 2.5).astype(np.float32)
        z[rng.integers(0, z.size, 30)] = np.sort(z)[-(5 + 20 * trial)]
        want = reference_probs(z, **filters)
        got = Sampler(**filters).probs(z)
        assert np.array_equal(got > 0, want > 0), f"{filters}, trial {trial}: a different set kept"
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-12)


def test_top_p_cut_inside_a_tie_larger_than_the_first_search():
    """100 tied most-likely tokens spread over the vocabulary, a cut after about half of them:
    the 64 largest a partition returns are any 64 of the tie, not the lowest ids that top-p's
    order keeps, so the search must widen (the guard in sampling._nucleus)."""
    rng = np.random.default_rng(6)
    z = (rng.standard_normal(3000) * 0.5).astype(np.float32)
    tied = rng.choice(3000, 100, replace=False)
    z[tied] = 6.0
    for top_p in (0.3, 0.5, 0.62):
        want = reference_probs(z, 1.0, top_p=top_p)
        got = Sampler(temperature=1.0, top_p=top_p).probs(z)
        assert np.array_equal(np.flatnonzero(got), np.flatnonzero(want)), top_p
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-12)
