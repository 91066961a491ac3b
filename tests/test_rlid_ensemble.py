"""Decision-plane ensembles: the fused law is a law over the menu, mixture/product match hand cases,
and the margin gate consults the others exactly below its threshold."""
import math

import pytest
import torch

from rlid.ensemble import DecisionEnsemble, fuse_log_probs
from rlid.types import DecisionState, OptionLaw


def law(*p):
    return torch.tensor(p, dtype=torch.float64).log()


def test_mixture_and_product_hand_case():
    a, b = law(0.7, 0.2, 0.1), law(0.1, 0.6, 0.3)
    mix = fuse_log_probs([a, b], [3, 1]).exp()
    assert torch.allclose(mix, torch.tensor([0.55, 0.3, 0.15], dtype=torch.float64))
    prod = fuse_log_probs([a, b], [1, 1], "product").exp()
    raw = torch.tensor([math.sqrt(0.07), math.sqrt(0.12), math.sqrt(0.03)], dtype=torch.float64)
    assert torch.allclose(prod, raw / raw.sum())
    assert abs(float(prod.sum()) - 1) < 1e-12


def test_zero_weight_member_is_ignored_and_bad_weights_rejected():
    a, b = law(0.7, 0.3), law(0.0 + 1e-300, 1.0)
    assert torch.allclose(fuse_log_probs([a, b], [1, 0]).exp(), a.exp())
    with pytest.raises(ValueError, match="weights"):
        fuse_log_probs([a, b], [0, 0])
    with pytest.raises(ValueError, match="rule"):
        fuse_log_probs([a, b], [1, 1], "vote")


class FixedPolicy:
    def __init__(self, probs):
        self.probs, self.calls = probs, []

    def laws(self, states):
        self.calls.append(len(states))
        return [OptionLaw(law(*self.probs[s.observation]), ("A", "B")) for s in states]


def test_gate_consults_only_uncertain_states():
    states = [DecisionState("sure", ("x", "y")), DecisionState("unsure", ("x", "y"))]
    lead = FixedPolicy({"sure": (0.9, 0.1), "unsure": (0.55, 0.45)})
    other = FixedPolicy({"sure": (0.1, 0.9), "unsure": (0.05, 0.95)})
    ens = DecisionEnsemble([lead, other], threshold=0.5)
    out = ens.laws(states)
    assert other.calls == [1]                                    # only the uncertain state, one batch
    assert torch.allclose(out[0].probs, torch.tensor([0.9, 0.1], dtype=torch.float64))
    assert torch.allclose(out[1].probs, torch.tensor([0.3, 0.7], dtype=torch.float64))
    assert (ens.counts.decisions, ens.counts.consulted) == (2, 1)
    never = DecisionEnsemble([lead, other], threshold=0.0)
    assert never.laws(states)[1].probs.argmax() == 0 and never.counts.consulted == 0


def test_wilson_and_paired_difference_hand_cases():
    from rlid.evaluate import paired_difference, wilson_interval

    lo, hi = wilson_interval(0, 10)
    assert lo == 0.0 and abs(hi - 0.2775) < 1e-3                # the textbook value for 0/10
    lo, hi = wilson_interval(5, 10)
    assert abs(lo - 0.2366) < 1e-3 and abs(hi - 0.7634) < 1e-3
    mean, lo, hi = paired_difference([1, 1, 1, 1], [0, 0, 0, 0])
    assert (mean, lo, hi) == (1.0, 1.0, 1.0)
    mean, lo, hi = paired_difference([1, 0, 1, 0, 1, 0], [0, 1, 0, 1, 0, 1])
    assert mean == 0.0 and lo < 0 < hi
