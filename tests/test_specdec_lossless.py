"""Every verifier is lossless: exact output law by enumeration, plus a vLLM-style statistical test."""
from __future__ import annotations

import pytest
import torch

from specdec import sample_drafts, verify
from specdec.lp import draft_law
from specdec.verifiers import METHOD_SCHEMES, output_law

CASES = [(m, s) for m, schemes in METHOD_SCHEMES.items() for s in schemes]


def _pair(v: int, seed: int, scale: float, same: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(v, generator=g, dtype=torch.float64) * scale, 0)
    q = p.clone() if same else torch.softmax(torch.randn(v, generator=g, dtype=torch.float64) * scale, 0)
    return p, q


def _exact_law(p, q, n, scheme, method):
    tuples, probs = draft_law(q, n, scheme)
    law = torch.zeros_like(p)
    for tup, pr in zip(tuples.tolist(), probs.tolist()):
        law += pr * output_law(p, q, tup, method, scheme=scheme)
    return law


@pytest.mark.parametrize("method,scheme", CASES)
@pytest.mark.parametrize("v,seed,scale,same", [(3, 0, 1.0, False), (5, 1, 1.5, False), (4, 2, 9.0, False), (4, 3, 1.0, True)])
def test_exact_output_law_equals_target(method, scheme, v, seed, scale, same):
    p, q = _pair(v, seed, scale, same)
    for n in ((2,) if method == "spechub" else (1, 2, 3)):
        law = _exact_law(p, q, n, scheme, method)
        assert torch.allclose(law, p, atol=1e-9, rtol=0), (method, scheme, n, law, p)


def test_exact_law_with_disjoint_and_zero_draft_mass():
    p = torch.tensor([0.5, 0.5, 0.0, 0.0], dtype=torch.float64)
    q = torch.tensor([0.0, 0.1, 0.6, 0.3], dtype=torch.float64)  # q misses token 0 entirely
    for method, scheme in CASES:
        law = _exact_law(p, q, 2, scheme, method)
        assert torch.allclose(law, p, atol=1e-9, rtol=0), (method, scheme)


def _l1(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().sum())


@pytest.mark.parametrize("method,scheme", CASES)
@pytest.mark.parametrize("same", [False, True])
def test_empirical_law_converges_to_target(method, scheme, same):
    """Like vLLM's rejection-sampler test: with more samples the empirical law gets closer to the
    target, and it is much closer to the target than to random reference distributions."""
    v, n, total = 5, 2, 6000
    p, q = _pair(v, 7, 1.2, same)
    gen = torch.Generator().manual_seed(11)
    q_rows = q.expand(total, v).contiguous()
    drafts = sample_drafts(q_rows, n, scheme, generator=gen)
    out = verify(p.expand(total, v), q_rows, drafts, method, generator=gen, scheme=scheme)
    assert out.token.shape == (total,) and out.accepted_index.shape == (total,)
    hit = out.accepted_index >= 0
    assert torch.equal(drafts[hit, out.accepted_index[hit]], out.token[hit])
    refs = [torch.softmax(torch.randn(v, generator=gen, dtype=torch.float64), 0) for _ in range(5)]
    dists = []
    for count in (375, 1500, 6000):
        emp = torch.bincount(out.token[:count], minlength=v).double() / count
        d_target = _l1(emp, p)
        d_ref = min(_l1(emp, r) for r in refs)
        dists.append(d_target)
        assert d_ref > 2.5 * d_target or count == 375, (count, d_target, d_ref)
    assert dists[-1] < 0.06 and dists[-1] < dists[0], dists


def test_batched_verify_matches_per_row_with_seeded_generators():
    p, q = _pair(6, 5, 1.0)
    drafts = sample_drafts(q.expand(4, 6), 3, "without", generator=torch.Generator().manual_seed(0))
    batched = verify(p.expand(4, 6), q.expand(4, 6), drafts, "rrs-without", generator=torch.Generator().manual_seed(3))
    gen = torch.Generator().manual_seed(3)
    rows = [verify(p, q, drafts[i], "rrs-without", generator=gen) for i in range(4)]
    assert batched.token.tolist() == [int(r.token) for r in rows]
    assert batched.accepted_index.tolist() == [int(r.accepted_index) for r in rows]


def test_sample_drafts_shapes_and_laws():
    p, q = _pair(5, 9, 1.0)
    gen = torch.Generator().manual_seed(0)
    for scheme in ("with", "without", "greedy"):
        d = sample_drafts(q.expand(2, 3, 5), 3, scheme, generator=gen)
        assert d.shape == (2, 3, 3) and d.dtype == torch.long
    # without: the first draft is q-distributed and ordered pairs follow successive sampling
    d = sample_drafts(q.expand(20000, 5), 2, "without", generator=gen)
    assert all(len(set(r)) == 2 for r in d.tolist()[:200])
    tuples, probs = draft_law(q, 2, "without")
    emp = {}
    for a, b in d.tolist():
        emp[(a, b)] = emp.get((a, b), 0) + 1
    for tup, pr in zip(tuples.tolist(), probs.tolist()):
        assert abs(emp.get(tuple(tup), 0) / 20000 - pr) < 0.01
    g = sample_drafts(q.expand(100, 5), 3, "greedy", generator=gen)
    top2 = torch.sort(q, descending=True).indices[:2].tolist()
    assert all(r[:2] == top2 and r[2] not in top2 for r in g.tolist())


def test_greedy_set_matches_a_stable_full_sort():
    """The top-k fast path returns exactly what a stable descending sort returns, ties included."""
    from specdec.drafts import greedy_set

    g = torch.Generator().manual_seed(0)
    for trial in range(200):
        V = int(torch.randint(2, 12, (1,), generator=g))
        q = torch.randint(0, 4, (3, V), generator=g).double()  # many ties, zeros too
        q[:, 0] += 1e-3 * (trial % 2)
        q = q + 1e-9
        q = q / q.sum(-1, keepdim=True)
        for n in range(1, V + 2):
            ref = torch.sort(q, dim=-1, descending=True, stable=True).indices[..., : n - 1]
            assert torch.equal(greedy_set(q, n), ref), (q, n)
