"""The sampler's distribution (lowbit.sampling.Sampler.probs / candidates / sample) against the
rules written out here in float64 over the whole vocabulary (llama.cpp's order: penalty, top-k,
softmax with temperature, min-p, top-p; ties at the k-th value kept, top-p's ties broken by the lower
id), and its draws against that distribution (chi-square)."""
import math

import numpy as np
import pytest

from lowbit.sampling import Sampler


def reference(z, temperature, top_k=0, top_p=1.0, min_p=0.0):
    z = np.asarray(z, np.float64) / temperature
    if top_k and top_k < z.size:
        kth = np.sort(z)[-top_k]
        z = np.where(z >= kth, z, -np.inf)
    p = np.exp(z - z.max())
    p /= p.sum()
    if min_p > 0:
        p = np.where(p >= min_p * p.max(), p, 0.0)
        p /= p.sum()
    if top_p < 1:
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


FILTERS = [dict(temperature=1.0), dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05),
           dict(temperature=0.5, top_k=7), dict(temperature=1.3, top_p=0.5), dict(temperature=0.9, min_p=0.2),
           dict(temperature=0.7, top_k=1)]


@pytest.mark.parametrize("filters", FILTERS)
def test_probs_are_the_rules(filters):
    rng = np.random.default_rng(1)
    for trial in range(20):
        z = (rng.standard_normal(3000) * 2.5).astype(np.float32)
        if trial % 4 == 0:  # ties around the k-th value and the top-p edge
            z[rng.integers(0, z.size, 30)] = np.sort(z)[-5]
        want = reference(z, **filters)
        got = Sampler(**filters).probs(z)
        assert np.array_equal(got > 0, want > 0), f"{filters}: different tokens kept"
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-12)
        ids, q = Sampler(**filters).candidates(z)
        assert np.array_equal(ids, np.flatnonzero(want > 0)) and abs(q.sum() - 1.0) < 1e-12


@pytest.mark.parametrize("filters", [FILTERS[1], FILTERS[3]])
def test_draws_follow_the_distribution(filters):
    z = (np.random.default_rng(2).standard_normal(500) * 2.0).astype(np.float32)
    p = reference(z, **filters)
    s = Sampler(seed=7, **filters)
    n = 20000
    counts = np.bincount([s.sample(z) for _ in range(n)], minlength=z.size)
    assert counts[p == 0].sum() == 0
    keep = p * n >= 5
    e = p[keep] * n
    chi2 = float(((counts[keep] - e) ** 2 / e).sum())
    dof = int(keep.sum()) - 1
    # a generous bound: mean dof, sd sqrt(2 dof); 6 sd
    assert chi2 < dof + 6 * math.sqrt(2 * dof), f"chi2 {chi2:.1f} for {dof} degrees of freedom"


def test_same_seed_same_draws_and_greedy():
    z = (np.random.default_rng(3).standard_normal(1000)).astype(np.float32)
    a = [Sampler(seed=11, temperature=0.9, top_k=20).sample(z) for _ in range(3)]
    assert len(set(a)) == 1
    assert Sampler(temperature=0).sample(z) == int(np.argmax(z))
