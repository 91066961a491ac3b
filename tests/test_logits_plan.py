"""LogitsPlan: the positions a forward keeps, and reading them back from a full or a compacted head."""
import pytest
import torch

from runtime.logits_plan import LogitsPlan
from runtime.tree_mask import pad_forest

V = 5


def model_output(plan, full):
    """What the model returns for `plan` from full logits [B, N, V]: the kept positions [B, K, V],
    and the packed head's compacted form [1, n, V] (wanted pairs, row-major)."""
    keep = plan.logits_to_keep
    kept = full if isinstance(keep, int) and keep == 0 else (
        full[:, -keep:] if isinstance(keep, int) else full[:, keep])
    return kept, kept[plan.head][None]


def test_at_and_last_read_the_same_from_full_and_compacted_heads():
    tokens = [[1, 2, 3, 4], [5], [6, 7], []]
    _, _, valid = pad_forest(tokens, [[-1, 0, 1, 0], [-1], [-1, -1], []])
    full = torch.randn(4, 4, V, generator=torch.Generator().manual_seed(0))
    at = [[3, 1], [0], [], []]
    plan = LogitsPlan.make("at", tokens, valid, at)
    assert plan.compact and plan.logits_to_keep.tolist() == [0, 1, 3]
    kept, packed = model_output(plan, full)
    got = plan.read(kept, compacted=False)
    assert torch.equal(got[:2], plan.read(packed, compacted=True)[:2])  # (row 2 wants none: filler)
    assert torch.equal(got[0], full[0, [3, 1]]) and torch.equal(got[1], full[1, [0, 0]])
    assert got.shape == (4, 2, V)

    plan = LogitsPlan.make("last", tokens, valid)
    assert plan.logits_to_keep.tolist() == [0, 1, 3]
    kept, packed = model_output(plan, full)
    got = plan.read(kept, compacted=False)
    assert torch.equal(got[:3], plan.read(packed, compacted=True)[:3])  # (row 3 has no tokens: filler)
    assert torch.equal(got[:3], full[[0, 1, 2], [3, 0, 1]]) and got.shape == (4, V)


def test_all_and_none():
    tokens = [[1, 2], [3]]
    _, _, valid = pad_forest(tokens, [[-1, 0], [-1]])
    full = torch.randn(2, 2, V).to(torch.bfloat16)
    plan = LogitsPlan.make("all", tokens, valid)
    assert plan.logits_to_keep == 0 and torch.equal(plan.head, valid) and not plan.compact
    assert plan.read(full, compacted=False).dtype == torch.float32
    plan = LogitsPlan.make("none", tokens, valid)
    assert plan.logits_to_keep == 1 and not plan.head.any() and plan.read(full[:, -1:], False) is None
    with pytest.raises(ValueError, match="keep='first' is invalid"):
        LogitsPlan.make("first", tokens, valid)
