"""The bucketed α* (specdec.bound) against the previous full-sort implementation (benchmarks/bound_reference.py)
to 1e-9, and against exact oracles where the reference itself loses precision."""
from __future__ import annotations

import itertools
import math
import sys
from fractions import Fraction
from pathlib import Path

import pytest
import torch

from specdec import bound_without
from specdec.bound import optimal_acceptance
from specdec.bound_buckets import NUM_BUCKETS, ratio_buckets, window
from specdec.drafts import to_float64
from specdec.lp import brute_force_acceptance

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))  # research code, not the library
from bound_reference import _sorted_support, reference_optimal_acceptance  # noqa: E402

SCHEMES = ("with", "without", "greedy")


def _norm(x: torch.Tensor) -> torch.Tensor:
    return x / x.sum()


def _pairs(v: int, seed: int) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Random pairs and the edge cases: identical, disjoint supports, ties, zeros, truncated, float32."""
    g = torch.Generator().manual_seed(seed)
    scale = [1.0, 3.0, 8.0][seed % 3]
    base = torch.randn(v, generator=g, dtype=torch.float64)
    p = torch.softmax(scale * base, 0)
    q = torch.softmax(scale * torch.randn(v, generator=g, dtype=torch.float64), 0)
    half = torch.arange(v) % 2 == 0
    out = {
        "independent": (p, q),
        "related": (p, torch.softmax(scale * base + torch.randn(v, generator=g, dtype=torch.float64), 0)),
        "identical": (p, p.clone()),
        "disjoint": (_norm(p * half), _norm(q * ~half)),
        "ties": (_norm(torch.randint(0, 4, (v,), generator=g).double() + (torch.arange(v) == 0).double()),
                 _norm(torch.randint(1, 4, (v,), generator=g).double())),
        "float32": (p.float(), q.float()),
    }
    keep_p, keep_q = torch.rand(v, generator=g) > 0.3, torch.rand(v, generator=g) > 0.3
    keep_p[0] = keep_q[-1] = True  # some mass left on each side
    out["zeros"] = (_norm(p * keep_p), _norm(q * keep_q))
    k = max(1, v // 50)
    out["top-k target"] = (_norm(torch.where(p >= p.topk(k).values[-1], p, 0.0)), q)
    out["top-k draft"] = (p, _norm(torch.where(q >= q.topk(min(v, k + 8)).values[-1], q, 0.0)))
    return out


def _check_against_reference(v: int, seed: int, ns: tuple[int, ...]) -> None:
    for name, (p, q) in _pairs(v, seed).items():
        support = int((q > 0).sum())
        for n, scheme in itertools.product(ns, SCHEMES):
            if scheme != "with" and n > support:
                continue
            new = optimal_acceptance(p, q, n, scheme)
            old = reference_optimal_acceptance(p, q, n, scheme)
            assert abs(new - old) < 1e-9, (name, v, n, scheme, new, old)


@pytest.mark.parametrize("v,seed", [(2, 0), (3, 1), (5, 2), (8, 3), (17, 4), (100, 5), (1000, 6), (5000, 7)])
def test_same_values_as_the_reference(v, seed):
    _check_against_reference(v, seed, (1, 2, 3, 8))


def test_same_values_as_the_reference_at_full_vocabulary():
    """V = 262,144 (gemma3's vocabulary), the benchmark's n = 8, an independent softmax(3·randn) pair."""
    g = torch.Generator().manual_seed(11)
    v = 262_144
    p = torch.softmax(3 * torch.randn(v, generator=g, dtype=torch.float64), 0)
    q = torch.softmax(3 * torch.randn(v, generator=g, dtype=torch.float64), 0)
    for scheme in SCHEMES:
        new, old = optimal_acceptance(p, q, 8, scheme), reference_optimal_acceptance(p, q, 8, scheme)
        assert abs(new - old) < 1e-9, (scheme, new, old)


def test_only_a_small_window_is_sorted_and_scanned(monkeypatch):
    """The point of the buckets: on an LLM-like pair the scanned window is a small part of V."""
    from specdec import bound

    seen = []
    real_window = bound.window
    monkeypatch.setattr(bound, "window", lambda *a: seen.append(real_window(*a)) or seen[-1])
    g = torch.Generator().manual_seed(3)
    v = 50_000
    p = torch.softmax(3 * torch.randn(v, generator=g, dtype=torch.float64), 0)
    q = torch.softmax(3 * torch.randn(v, generator=g, dtype=torch.float64), 0)
    for scheme in ("with", "without"):
        optimal_acceptance(p, q, 8, scheme)
    assert seen and all(w.tokens.numel() < v // 5 for w in seen), [w.tokens.numel() for w in seen]


def test_window_reproduces_the_full_sort_order():
    """Tokens of a bucket range come out in the stable p/q order of the full sort, masses to 1e-14."""
    g = torch.Generator().manual_seed(0)
    v = 5000
    p = _norm(torch.randint(0, 5, (v,), generator=g).double() * torch.rand(v, generator=g, dtype=torch.float64).round())
    q = _norm(torch.rand(v, generator=g, dtype=torch.float64) * (torch.rand(v, generator=g) > 0.1))
    p[3] = -0.0  # a negative zero ratio belongs to the first bucket
    p, q = to_float64(p), to_float64(q)
    buckets = ratio_buckets(p, q)
    assert int((buckets.bucket == NUM_BUCKETS).sum()) == int((q == 0).sum())  # q = 0: never in any prefix
    p_s, q_s, r = _sorted_support(p, q)
    w = window(buckets, p, q, 0, NUM_BUCKETS - 1)
    assert torch.equal(q[w.tokens], q_s) and torch.equal(p[w.tokens], p_s)
    assert torch.allclose(w.r, r, atol=1e-14, rtol=0)
    assert torch.allclose(w.p_prefix[1:], torch.cumsum(p_s, 0), atol=1e-14, rtol=0)


def test_base_law_matches_the_product_of_the_clocks():
    """log P(N_A(t) = j) from the moment series + few big tokens = the product of A's clock polynomials."""
    g = torch.Generator().manual_seed(1)
    v, n = 3000, 8
    q = torch.softmax(4 * torch.randn(v, generator=g, dtype=torch.float64), 0)
    in_base = torch.rand(v, generator=g) < 0.6
    t = torch.exp(torch.linspace(-2.0, 7.0, 9, dtype=torch.float64))
    got = bound_without.base_law(q, in_base, t, n).exp()
    want = torch.zeros(n, t.shape[0], dtype=torch.float64)
    want[0] = 1.0
    for qi in q[in_base]:  # c_j <- c_j e^{-q t} + c_{j-1} (1 - e^{-q t}), truncated at n
        stay = torch.exp(-qi * t)
        want = torch.cat([want[:1] * stay, want[1:] * stay + want[:-1] * (1 - stay)])
    assert torch.allclose(got, want, atol=1e-12, rtol=0), (got - want).abs().max()


def _exact_alpha_all_but_one(p: torch.Tensor, q: torch.Tensor) -> float:
    """α*(without) for n = |support| - 1 in exact rationals: only H = Σ∖{x} has Q(H) > 0 besides Σ, and
    Q(Σ∖{x}) = P(x drawn last) = Σ_S (-1)^|S| q_x / (q_x + q(S)) over S ⊆ Σ∖{x} (inclusion–exclusion)."""
    pf = [Fraction(float(a)) for a in p.tolist()]
    qf = [Fraction(float(a)) for a in q.tolist()]
    pf, qf = [a / sum(pf) for a in pf], [a / sum(qf) for a in qf]
    best = Fraction(0)
    for x in range(len(qf)):
        others = [qf[i] for i in range(len(qf)) if i != x]
        last = sum((-1) ** len(s) * qf[x] / (qf[x] + sum(s))
                   for k in range(len(others) + 1) for s in itertools.combinations(others, k))
        best = min(best, 1 - pf[x] - last)
    return float(1 + best)


@pytest.mark.parametrize("seed", range(3))
def test_without_exact_where_the_reference_loses_precision(seed):
    """Draft probabilities spanning ~1e-50..1 with n = support - 1 (a draft must reach the rarest tokens):
    the log-domain scan takes its weights from the tail masses, so it stays exact; the reference does not."""
    g = torch.Generator().manual_seed(seed)
    v = 9
    logits = torch.randn(v, generator=g, dtype=torch.float64) * 40
    p = torch.softmax(logits, 0)
    q = torch.softmax(-logits + torch.randn(v, generator=g, dtype=torch.float64), 0)
    exact = _exact_alpha_all_but_one(p, q)
    got = optimal_acceptance(p, q, v - 1, "without")
    assert got == pytest.approx(exact, abs=1e-9, rel=1e-6), (got, exact)


def test_without_exact_on_a_tiny_extreme_pair():
    """V = 3, n = 2 with q spanning 1e-45..1: brute force over subsets and draft tuples agrees."""
    p = torch.tensor([1.29e-08, 1.0 - 1.29e-08, 2.4e-45], dtype=torch.float64)
    q = torch.tensor([2.6e-37, 6.6e-45, 1.0], dtype=torch.float64)
    got = optimal_acceptance(p, q, 2, "without")
    assert got == pytest.approx(brute_force_acceptance(p, q, 2, "without"), rel=1e-9)
    assert math.isfinite(got) and 0.0 < got < 1e-6


@pytest.mark.parametrize("n", [3, 4])
def test_without_exact_with_a_dominant_draft_token_and_a_tiny_tail(n):
    """q ≈ 0.99 on one token and ~1e-11 on a tail: the integral reaches t ~ 1e12, where the law of the
    clocks before the window must be built without subtracting exponents of size q t (brute force)."""
    p = _norm(torch.tensor([8.121179284179418e-10, 8.399024990227342e-10, 3.6760957627860535e-08, 0.0, 0.0,
                            1.2776718448577304e-09, 0.9999999603093499, 0.0], dtype=torch.float64))
    q = _norm(torch.tensor([0.004879870568937808, 2.0593041232306238e-12, 0.0, 0.9897772180612575,
                            0.005342911330556315, 7.477525239086094e-12, 1.5047887814486288e-12,
                            2.8206779278528903e-11], dtype=torch.float64))
    got = optimal_acceptance(p, q, n, "without")
    assert got == pytest.approx(brute_force_acceptance(p, q, n, "without"), abs=1e-9)


def _without_over_every_prefix(p: torch.Tensor, q: torch.Tensor, n: int) -> float:
    """α*(without) with no bucket pruning: Q on every prefix of the full sort, by the same scan."""
    p, q = to_float64(p), to_float64(q)
    buckets = ratio_buckets(p, q)
    w = window(buckets, p, q, 0, NUM_BUCKETS - 1)
    rest = q.clone()
    rest[torch.topk(q, n - 1).indices] = 0.0
    q_pre = bound_without.q_without_window(q, buckets.bucket < 0, w.q, w.r, n, float(rest.sum()))
    return 1.0 + min(0.0, float((w.p_prefix - q_pre).min()))


@pytest.mark.parametrize("seed", [0, 4])
def test_without_bounds_never_prune_the_minimum(seed):
    """A draft with logits of std 20 (top token ~1 − 1e-6, tail down to 1e-40), an independent target:
    the bucket bounds must stay valid in float64 (they are computed from tail masses, never 1 − tiny);
    pruned or not, the minimum is the same."""
    g = torch.Generator().manual_seed(seed)
    v = 100
    for scale in (3.0, 6.0):
        q = torch.softmax(torch.randn(v, generator=g, dtype=torch.float64) * 20, 0)
        p = torch.softmax(scale * torch.randn(v, generator=g, dtype=torch.float64), 0)
        for n in (8, 16):
            got = optimal_acceptance(p, q, n, "without")
            assert got == pytest.approx(_without_over_every_prefix(p, q, n), abs=1e-9), (seed, scale, n)
