"""α* against the primal LP and brute-force subsets; known facts; expected acceptance vs enumeration."""
from __future__ import annotations

import math

import pytest
import torch

from specdec import expected_acceptance, optimal_acceptance
from specdec.lp import brute_force_acceptance, draft_law, lp_optimal_acceptance
from specdec.verifiers import METHOD_SCHEMES, output_law


def _pair(v: int, seed: int, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(v, generator=g, dtype=torch.float64) * scale, 0)
    q = torch.softmax(torch.randn(v, generator=g, dtype=torch.float64) * scale, 0)
    return p, q


# (V, seed, scale): scale 10-14 gives peaked distributions with probabilities far below 1e-6
RANDOM_CASES = [(v, seed, scale) for seed, (v, scale) in enumerate([(3, 1.0), (4, 1.5), (5, 2.0), (6, 1.0), (7, 12.0),
                                                                    (8, 1.5), (5, 14.0), (6, 10.0), (8, 3.0)])]


@pytest.mark.parametrize("v,seed,scale", RANDOM_CASES)
@pytest.mark.parametrize("scheme", ["with", "without", "greedy"])
def test_alpha_star_matches_brute_force_and_lp(v, seed, scale, scheme):
    p, q = _pair(v, seed, scale)
    for n in (1, 2, 3):
        fast = optimal_acceptance(p, q, n, scheme)
        brute = brute_force_acceptance(p, q, n, scheme)
        assert abs(fast - brute) < 1e-6, (n, fast, brute)
        if v <= 6 or n <= 2:  # the LP is the slowest oracle: skip the largest tuple spaces
            lp = lp_optimal_acceptance(p, q, n, scheme)
            assert abs(fast - lp) < 1e-6, (n, fast, lp)


def test_greedy_counterexample_from_algorithms_md():
    p = torch.tensor([0.65, 0.1, 0.1, 0.15], dtype=torch.float64)
    q = torch.tensor([0.3, 0.3, 0.3, 0.1], dtype=torch.float64)
    a = optimal_acceptance(p, q, 2, "greedy")
    assert a == pytest.approx(0.992857142857, abs=1e-9)
    assert lp_optimal_acceptance(p, q, 2, "greedy") == pytest.approx(a, abs=1e-7)
    assert expected_acceptance(p, q, 2, "greedy", "greedy").value == pytest.approx(a, abs=1e-12)


@pytest.mark.parametrize("seed", range(6))
def test_known_facts(seed):
    p, q = _pair(40, 100 + seed, 2.0)
    tv = 0.5 * float((p - q).abs().sum())
    for scheme in ("with", "without", "greedy"):
        assert optimal_acceptance(p, q, 1, scheme) == pytest.approx(1 - tv, abs=1e-9)
    for n in (2, 3, 5):
        a_with = optimal_acceptance(p, q, n, "with")
        a_without = optimal_acceptance(p, q, n, "without")
        assert a_without >= a_with - 1e-9
        assert expected_acceptance(p, q, n, "greedy", "greedy").value == pytest.approx(
            optimal_acceptance(p, q, n, "greedy"), abs=1e-12)
        for method in ("rrs", "k-seq"):
            assert expected_acceptance(p, q, n, "with", method).value <= a_with + 1e-9


def test_alpha_star_identical_distributions_and_batch():
    p, _ = _pair(30, 3, 1.0)
    for scheme in ("with", "without", "greedy"):
        assert optimal_acceptance(p, p, 3, scheme) == pytest.approx(1.0, abs=1e-9)
    ps = torch.stack([_pair(6, s, 1.0)[0] for s in range(3)])
    qs = torch.stack([_pair(6, s, 1.0)[1] for s in range(3)])
    batch = optimal_acceptance(ps, qs, 2, "without")
    assert batch.shape == (3,)
    for i in range(3):
        assert float(batch[i]) == pytest.approx(optimal_acceptance(ps[i], qs[i], 2, "without"), abs=1e-12)


def test_without_peaked_large_vocab_is_sane():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5000, generator=g, dtype=torch.float64) * 4
    logits[7] += 30  # one token holds ~all the mass
    p = torch.softmax(logits + torch.randn(5000, generator=g, dtype=torch.float64), 0)
    q = torch.softmax(logits, 0)
    with_, without = optimal_acceptance(p, q, 4, "with"), optimal_acceptance(p, q, 4, "without")
    assert 0.0 <= with_ <= without <= 1.0
    assert optimal_acceptance(p, q, 1, "without") == pytest.approx(1 - 0.5 * float((p - q).abs().sum()), abs=1e-9)


def _enumerated_acceptance(p, q, n, scheme, method):
    tuples, probs = draft_law(q, n, scheme)
    total = 0.0
    for tup, pr in zip(tuples.tolist(), probs.tolist()):
        law = output_law(p, q, tup, method, scheme=scheme)
        total += pr * float(law[list(set(tup))].sum())
    return total


@pytest.mark.parametrize("v,seed,scale", [(4, 0, 1.0), (5, 1, 2.0), (4, 2, 8.0)])
def test_expected_acceptance_closed_forms_match_enumeration(v, seed, scale):
    p, q = _pair(v, seed, scale)
    for method, schemes in METHOD_SCHEMES.items():
        for scheme in schemes:
            for n in ((2,) if method == "spechub" else (1, 2, 3)):
                got = expected_acceptance(p, q, n, scheme, method)
                assert got.exact and got.stderr == 0.0
                if method != "rrs-without":  # its exact value IS this enumeration: checked by simulation below
                    want = _enumerated_acceptance(p, q, n, scheme, method)
                    assert got.value == pytest.approx(want, abs=1e-6), (method, scheme, n)
                assert got.value <= optimal_acceptance(p, q, n, scheme) + 1e-6


def _simulated_rrs_without(p: torch.Tensor, q: torch.Tensor, n: int, draws: int, seed: int) -> tuple[float, float]:
    """RRS without replacement run by hand, as docs/algorithms.md states it (no library code): draw n
    drafts from q without replacement; for each, accept with min(1, p'(x)/q'(x)); on rejection
    p' <- norm((p' - q')+) and q' <- q' without x, renormalised. Returns (acceptance rate, its stderr)."""
    rng = torch.Generator().manual_seed(seed)
    hits = 0
    for _ in range(draws):
        left, drafts = q.clone(), []
        for _ in range(n):  # successive sampling without replacement
            x = int(torch.multinomial(left / left.sum(), 1, generator=rng))
            drafts.append(x)
            left[x] = 0.0
        p_cur, q_cur = p.clone(), q.clone()
        for x in drafts:
            if float(torch.rand(1, generator=rng)) < min(1.0, float(p_cur[x] / q_cur[x])):
                hits += 1
                break
            p_cur = (p_cur - q_cur).clamp(min=0.0)
            p_cur = p_cur / p_cur.sum()
            q_cur = q_cur.clone()
            q_cur[x] = 0.0
            q_cur = q_cur / q_cur.sum()
    rate = hits / draws
    return rate, math.sqrt(max(rate * (1 - rate), 1e-12) / draws)


@pytest.mark.parametrize("v,seed,scale,n", [(5, 1, 2.0, 2), (6, 3, 1.0, 3), (4, 2, 1.5, 2)])
def test_rrs_without_exact_value_matches_a_hand_simulation(v, seed, scale, n):
    p, q = _pair(v, seed, scale)
    exact = expected_acceptance(p, q, n, "without", "rrs-without")
    rate, stderr = _simulated_rrs_without(p, q, n, draws=4000, seed=seed)
    assert abs(exact.value - rate) < 4 * stderr + 2e-3, (exact.value, rate, stderr)


def test_rrs_without_monte_carlo_agrees_with_exact():
    p, q = _pair(9, 4, 1.5)
    for n in (2, 4):
        exact = expected_acceptance(p, q, n, "without", "rrs-without")
        assert exact.exact
        mc = expected_acceptance(p, q, n, "without", "rrs-without", exact_limit=0, num_samples=20000,
                                 generator=torch.Generator().manual_seed(0))
        assert not mc.exact and mc.stderr > 0
        assert abs(mc.value - exact.value) < 4 * mc.stderr + 1e-4, (n, mc, exact)


def test_rrs_without_monte_carlo_runs_at_real_vocab_size():
    g = torch.Generator().manual_seed(1)
    base = torch.randn(151_936, generator=g) * 3
    p = torch.softmax(base + torch.randn(151_936, generator=g), 0)
    q = torch.softmax(base, 0)
    est = expected_acceptance(p, q, 4, "without", "rrs-without", num_samples=512, generator=g)
    assert 0.0 < est.value <= optimal_acceptance(p, q, 4, "without") + 4 * est.stderr
    assert math.isfinite(est.stderr)


@pytest.mark.parametrize("seed", range(4))
def test_spechub_attains_the_greedy_bound_at_n2(seed):
    """SpecHub's pairs are the greedy scheme's sets at n = 2, and its transport is optimal for them:
    Σ_i min(p_i, q_i) + min((p_i − q_i)+, q(a) q'_i) = Σ_i min(p_i, q'_i), and the hub gets all of p(a)."""
    p, q = _pair(50, 200 + seed, 2.0)
    assert expected_acceptance(p, q, 2, "greedy", "spechub").value == pytest.approx(
        optimal_acceptance(p, q, 2, "greedy"), abs=1e-12)


def test_without_quadrature_step_is_converged(monkeypatch):
    """The default n-dependent step agrees with a much finer trapezoid step (flat LLM-like q, large n)."""
    from specdec import bound_without

    g = torch.Generator().manual_seed(5)
    base = torch.randn(3000, generator=g, dtype=torch.float64) * 2.5
    p = torch.softmax(base + torch.randn(3000, generator=g, dtype=torch.float64), 0)
    q = torch.softmax(base + torch.randn(3000, generator=g, dtype=torch.float64), 0)
    default = [optimal_acceptance(p, q, n, "without") for n in (4, 16)]
    monkeypatch.setattr(bound_without, "_STEP", 0.12)
    fine = [optimal_acceptance(p, q, n, "without") for n in (4, 16)]
    assert all(abs(a - b) < 1e-7 for a, b in zip(default, fine)), (default, fine)
