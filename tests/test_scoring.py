import pytest
import torch

from adafuse.scoring import combine_scores, normalised_score


def test_normalisations():
    lp = torch.tensor([-1.0, -2.0, -3.0])
    assert normalised_score(lp, "abcdef", "sum") == -6.0
    assert normalised_score(lp, "abcdef", "token") == -2.0
    assert normalised_score(lp, "abcdef", "byte") == -1.0
    assert normalised_score(lp, "äbc", "byte") == -1.5  # 4 UTF-8 bytes
    assert normalised_score(lp, "äbc", "char") == -2.0
    with pytest.raises(ValueError):
        normalised_score(lp, "x", "bits")


def test_combine_scores_weights():
    s = torch.tensor([[0.0, -2.0], [-4.0, 0.0]])
    torch.testing.assert_close(combine_scores(s), torch.tensor([-2.0, -1.0]))
    torch.testing.assert_close(combine_scores(s, [3, 1]), torch.tensor([-1.0, -1.5]))
    with pytest.raises(ValueError):
        combine_scores(s, [1.0])
