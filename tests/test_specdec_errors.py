"""ValueError cases of the specdec math layer."""
from __future__ import annotations

import pytest
import torch

from specdec import expected_acceptance, optimal_acceptance, residual, sample_drafts, verify

P = torch.tensor([0.4, 0.3, 0.2, 0.1], dtype=torch.float64)
Q = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)
D = torch.tensor([2, 3])


@pytest.mark.parametrize("bad", [
    torch.tensor([0.5, 0.5, 0.5, 0.5], dtype=torch.float64),  # not normalised
    torch.tensor([1.2, -0.2, 0.0, 0.0], dtype=torch.float64),  # negative
    torch.tensor([float("nan"), 0.5, 0.5, 0.0], dtype=torch.float64),
    torch.tensor([1, 0, 0, 0]),  # integer
])
def test_invalid_probs(bad):
    with pytest.raises(ValueError):
        optimal_acceptance(bad, Q, 2, "with")
    with pytest.raises(ValueError):
        optimal_acceptance(P, bad, 2, "with")
    with pytest.raises(ValueError):
        verify(P, bad, D, "rrs")
    with pytest.raises(ValueError):
        sample_drafts(bad, 2, "with")


def test_mismatched_shapes():
    with pytest.raises(ValueError, match="same shape"):
        optimal_acceptance(P, torch.full((5,), 0.2, dtype=torch.float64), 2, "with")
    with pytest.raises(ValueError, match="shape"):
        verify(P, Q, torch.tensor([[1, 2]]), "rrs")


def test_n_larger_than_support():
    q = torch.tensor([0.5, 0.5, 0.0, 0.0], dtype=torch.float64)
    for scheme in ("without", "greedy"):
        with pytest.raises(ValueError, match="support"):
            sample_drafts(q, 3, scheme)
        with pytest.raises(ValueError, match="support"):
            optimal_acceptance(P, q, 3, scheme)
    with pytest.raises(ValueError):
        optimal_acceptance(P, Q, 0, "with")


def test_method_scheme_mismatch():
    with pytest.raises(ValueError, match="greedy"):
        verify(P, Q, D, "greedy", scheme="with")
    with pytest.raises(ValueError, match="n = 2"):
        verify(P, Q, torch.tensor([3, 2, 1]), "spechub")
    with pytest.raises(ValueError, match="rrs-without"):
        expected_acceptance(P, Q, 2, "with", "rrs-without")
    with pytest.raises(ValueError, match="unknown verifier"):
        verify(P, Q, D, "magic")
    with pytest.raises(ValueError, match="unknown draft scheme"):
        sample_drafts(Q, 2, "sideways")
    with pytest.raises(ValueError, match="scheme="):
        verify(P, Q, D, "lp-optimal")


def test_drafts_inconsistent_with_scheme():
    with pytest.raises(ValueError, match="distinct"):
        verify(P, Q, torch.tensor([2, 2]), "rrs-without")
    with pytest.raises(ValueError, match="top"):
        verify(P, Q, torch.tensor([0, 3]), "greedy")  # the top-1 of q is token 3
    q0 = torch.tensor([0.5, 0.5, 0.0, 0.0], dtype=torch.float64)
    with pytest.raises(ValueError, match="probability 0"):
        verify(P, q0, torch.tensor([0, 3]), "rrs")
    with pytest.raises(ValueError, match="k-seq rho"):
        verify(P, Q, D, "k-seq", rho=5.0)


def test_residual_is_a_distribution():
    r = residual(P, Q)
    assert torch.allclose(r, torch.tensor([0.75, 0.25, 0.0, 0.0], dtype=torch.float64))
    assert torch.equal(residual(P, P), P)  # zero-mass residual falls back to p


def test_underscore_alias_and_repr():
    out = verify(P, Q, torch.tensor([0, 1]), "rrs_without", generator=torch.Generator().manual_seed(0))
    ref = verify(P, Q, torch.tensor([0, 1]), "rrs-without", generator=torch.Generator().manual_seed(0))
    assert int(out.token) == int(ref.token) and int(out.accepted_index) == int(ref.accepted_index)
    assert repr(out) == "VerifyResult(token=(), accepted_index=())"


def test_speculative_options_name_every_keyword_of_the_generator():
    """`SPECULATIVE_OPTIONS` (what configs may set on a speculative member) is the constructor's
    keywords besides target / drafter / shape, plus k-seq's `rho`: the list cannot drift from it."""
    import inspect

    from specdec.engine import SPECULATIVE_OPTIONS, SpeculativeGenerator

    params = inspect.signature(SpeculativeGenerator).parameters
    keywords = [n for n, p in params.items() if p.kind is p.KEYWORD_ONLY]
    assert set(SPECULATIVE_OPTIONS) == set(keywords) | {"rho"}
