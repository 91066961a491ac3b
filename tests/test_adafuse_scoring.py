"""Gate margin, score fusion (self-preference) and the candidate choice: pure functions."""
import pytest
import torch

from adafuse.gate import gate_decision, is_confident, top2_margin
from adafuse.scoring import choose, fuse_scores


def test_top2_margin():
    probs = torch.tensor([[0.8, 0.1, 0.1], [0.4, 0.35, 0.25]])
    torch.testing.assert_close(top2_margin(probs), torch.tensor([0.7, 0.05]))
    assert is_confident(0.7, 0.7) and not is_confident(0.69, 0.7)


def test_gate_decision_is_the_one_rule():
    assert gate_decision(0.9, 0, 0.7, 3) == "confident"
    assert gate_decision(0.69, 0, 0.7, 3) == "uncertain"
    assert gate_decision(0.9, 3, 0.7, 3) == "forced" and gate_decision(0.9, 2, 0.7, 3) == "confident"
    assert gate_decision(0.2, 5, 0.7, 3) == "uncertain"  # uncertainty first, then the span
    assert gate_decision(0.99, 0, 0.7, 3, gate=False) == "off"
    assert gate_decision(0.9, 0, 0.7, 0) == "forced"  # span 0: every word ensembled


def test_softmax_calibration_resists_a_self_confident_member():
    # candidates: [A's word, B's word]. Member 0 proposed A's word and rates it extremely high and the
    # other word extremely low; members 1 and 2 mildly prefer B's word.
    scores = torch.tensor([[0.0, -10.0], [-3.0, -0.2], [-1.5, -1.0]])
    assert int(fuse_scores(scores, None, "none").argmax()) == 0      # plain mean: the extreme member wins
    assert int(fuse_scores(scores, None, "softmax").argmax()) == 1   # mixture: the majority wins
    # weights still act under calibration
    assert int(fuse_scores(scores, [10, 1, 1], "softmax").argmax()) == 0
    with pytest.raises(ValueError):
        fuse_scores(scores, None, "rank")


def test_choose_greedy_and_seeded_sampling():
    fused = torch.tensor([-1.0, -0.5, -3.0])
    assert choose(fused, 0.0) == 1
    draws = [choose(fused, 1.0, torch.Generator().manual_seed(s)) for s in range(40)]
    again = [choose(fused, 1.0, torch.Generator().manual_seed(s)) for s in range(40)]
    assert draws == again and len(set(draws)) > 1
