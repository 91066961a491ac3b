"""tree_inputs on hand-written trees: a node's mask row is its parent's row plus itself, its position
is the row's committed length + its depth; several rows, holes in the past, sliding windows, roots
below an earlier forward's nodes."""
import pytest
import torch

from runtime.tree_mask import FULL, SLIDING, eye_pad, pad_forest, tree_inputs

T, F = True, False


def past(*rows):
    """past_pos [B, S] from per-row position lists (None: a free slot)."""
    return torch.tensor([[-1 if p is None else p for p in r] for r in rows], dtype=torch.long)


def bools(rows):
    return torch.tensor(rows, dtype=torch.bool)


def test_chain_without_past_is_causal():
    got = tree_inputs([[7, 8, 9]], [[-1, 0, 1]], torch.empty(1, 0, dtype=torch.long), [0])
    assert got.tokens.tolist() == [[7, 8, 9]] and got.valid.all()
    assert got.position_ids.tolist() == [[0, 1, 2]]
    assert torch.equal(got.masks[FULL][0], torch.tril(torch.ones(3, 3, dtype=torch.bool)))
    assert set(got.masks) == {FULL}


def test_chain_after_committed_tokens():
    got = tree_inputs([[5, 6]], [[-1, 0]], past([0, 1, 2]), [3])
    assert got.position_ids.tolist() == [[3, 4]]
    assert torch.equal(got.masks[FULL][0], bools([[T, T, T, T, F],
                                                  [T, T, T, T, T]]))


def test_branching_tree_sees_ancestors_only():
    #   past -> 0 -> 1 -> 3
    #                 \-> 4
    #   past -> 2
    got = tree_inputs([[10, 11, 12, 13, 14]], [[-1, 0, -1, 1, 1]], past([0, 1]), [2])
    assert got.position_ids.tolist() == [[2, 3, 2, 4, 4]]
    new = got.masks[FULL][0, :, 2:]
    assert torch.equal(new, bools([[T, F, F, F, F],
                                   [T, T, F, F, F],
                                   [F, F, T, F, F],
                                   [T, T, F, T, F],
                                   [T, T, F, F, T]]))
    assert got.masks[FULL][0, :, :2].all()  # every node sees the whole committed past
    # a node's row is its parent's row plus itself
    parents = [-1, 0, -1, 1, 1]
    for i, p in enumerate(parents):
        if p >= 0:
            expect = got.masks[FULL][0, p].clone()
            expect[2 + i] = True
            assert torch.equal(got.masks[FULL][0, i], expect)


def test_rows_of_different_lengths_with_holes_and_padding():
    # row 0: 3 committed tokens, slot 2 free (a rolled-back token); a chain of 3 new nodes
    # row 1: 1 committed token in slot 0; one new node
    # row 2: 2 committed tokens; no new nodes (all padding)
    pp = past([0, 1, None, 2], [0, None, None, None], [0, 1, None, None])
    got = tree_inputs([[4, 5, 6], [7], []], [[-1, 0, 1], [-1], []], pp, [3, 1, 2])
    assert got.tokens.tolist() == [[4, 5, 6], [7, 0, 0], [0, 0, 0]]
    assert got.valid.tolist() == [[T, T, T], [T, F, F], [F, F, F]]
    assert got.position_ids.tolist() == [[3, 4, 5], [1, 0, 0], [0, 0, 0]]
    m = got.masks[FULL]
    assert m.shape == (3, 3, 7)
    assert torch.equal(m[0], bools([[T, T, F, T, T, F, F],
                                    [T, T, F, T, T, T, F],
                                    [T, T, F, T, T, T, T]]))
    # padding nodes see the past and themselves only
    assert torch.equal(m[1], bools([[T, F, F, F, T, F, F],
                                    [T, F, F, F, F, T, F],
                                    [T, F, F, F, F, F, T]]))
    assert torch.equal(m[2], bools([[T, T, F, F, T, F, F],
                                    [T, T, F, F, F, T, F],
                                    [T, T, F, F, F, F, T]]))


def test_sliding_window_hides_old_keys():
    # window 2: a query at position p sees keys at positions p-1 and p
    pp = past([0, 1, 2, 3])
    got = tree_inputs([[1, 2, 3]], [[-1, 0, -1]], pp, [4], sliding_window=2)
    assert got.position_ids.tolist() == [[4, 5, 4]]
    full, sliding = got.masks[FULL][0], got.masks[SLIDING][0]
    assert torch.equal(full, bools([[T, T, T, T, T, F, F],
                                    [T, T, T, T, T, T, F],
                                    [T, T, T, T, F, F, T]]))
    assert torch.equal(sliding, bools([[F, F, F, T, T, F, F],
                                       [F, F, F, F, T, T, F],
                                       [F, F, F, T, F, F, T]]))
    assert torch.equal(sliding, full & sliding)


def test_sliding_window_with_holes_and_padding_rows():
    pp = past([0, None, 1, 2], [0, 1, 2, 3])
    got = tree_inputs([[9], [8, 7]], [[-1], [-1, 0]], pp, [3, 4], sliding_window=3)
    s = got.masks[SLIDING]
    assert got.position_ids.tolist() == [[3, 0], [4, 5]]
    assert torch.equal(s[0], bools([[F, F, T, T, T, F],      # sees positions 1, 2 and itself (3)
                                    [T, F, T, T, F, T]]))    # padding at position 0: itself (+ past)
    assert torch.equal(s[1], bools([[F, F, T, T, T, F],
                                    [F, F, F, T, T, T]]))


def test_roots_below_earlier_nodes():
    # committed: slots 0..2 (positions 0..2); slots 3, 4: an open chain a -> b at positions 3, 4
    # (not committed); new nodes: x below b, y below a, z child of x
    pp = past([0, 1, 2, 3, 4])
    seen = bools([[[T, T, T, T, T],    # x: committed + a + b
                   [T, T, T, T, F],    # y: committed + a
                   [T, T, T, F, F]]])  # z: (not a root: inherits x's row)
    depth = torch.tensor([[2, 1, 0]])
    got = tree_inputs([[20, 21, 22]], [[-1, -1, 0]], pp, [3], seen=seen, root_depth=depth)
    assert got.position_ids.tolist() == [[5, 4, 6]]
    assert torch.equal(got.masks[FULL][0], bools([[T, T, T, T, T, T, F, F],
                                                  [T, T, T, T, F, F, T, F],
                                                  [T, T, T, T, T, T, F, T]]))
    assert torch.equal(seen[0, 2], bools([T, T, T, F, F]))  # the input is not modified


def test_attention_mask_is_additive_in_the_model_dtype():
    got = tree_inputs([[1, 2]], [[-1, -1]], past([0]), [1])
    am = got.attention_mask(torch.bfloat16, "cpu")
    assert am.shape == (1, 1, 2, 3) and am.dtype == torch.bfloat16
    neg = torch.finfo(torch.bfloat16).min
    assert am[0, 0].tolist() == [[0, 0, neg], [0, neg, 0]]
    sl = tree_inputs([[1]], [[-1]], past([0]), [1], sliding_window=4).attention_mask(torch.float32, "cpu")
    assert set(sl) == {FULL, SLIDING}


def test_bad_trees_are_refused():
    with pytest.raises(ValueError, match="parents\\[i\\] < i"):
        tree_inputs([[1, 2]], [[-1, 1]], past([0]), [1])
    with pytest.raises(ValueError, match="same length"):
        tree_inputs([[1, 2]], [[-1]], past([0]), [1])


def test_helpers():
    tok, par, valid = pad_forest([[3, 4], []], [[-1, 0], []])
    assert tok.tolist() == [[3, 4], [0, 0]] and par.tolist() == [[-1, 0], [-1, -1]]
    assert valid.tolist() == [[T, T], [F, F]]
    assert eye_pad(2, 1).tolist() == [[F, T, F], [F, F, T]]


def test_no_mask_row_is_ever_empty_and_additive_masks_stay_finite():
    # issue 23's numerical guard: an all-masked attention row would be a softmax over nothing (NaN);
    # every node — padding included, with holes in the past, empty pasts, narrowed `seen`, sliding
    # windows of 1 — attends at least to itself, and the additive mask uses the dtype's minimum, not -inf
    import random

    rng = random.Random(0)
    for _ in range(200):
        B, S = rng.randint(1, 4), rng.randint(0, 6)
        tokens, parents = [], []
        for _b in range(B):
            n = rng.randint(0, 5)
            tokens.append([rng.randint(1, 50) for _ in range(n)])
            parents.append([rng.randint(-1, i - 1) for i in range(n)])
        if not any(tokens):
            continue
        past_pos = torch.tensor([[p if rng.random() < 0.7 else -1 for p in range(S)] for _b in range(B)],
                                dtype=torch.long).reshape(B, S)
        n_new = max(len(t) for t in tokens)
        seen = torch.rand(B, n_new, S) < 0.3 if rng.random() < 0.5 else None
        got = tree_inputs(tokens, parents, past_pos, [S] * B, seen=seen, sliding_window=rng.choice([None, 1, 2, 4]))
        for kind, mask in got.masks.items():
            assert mask.any(dim=-1).all(), kind
        for dtype in (torch.float32, torch.bfloat16):
            add = got.attention_mask(dtype, "cpu")
            for m in (add.values() if isinstance(add, dict) else [add]):
                assert torch.isfinite(m).all()
