"""Draft-tree builders and forward layout on hand-written trees."""
import pytest
import torch

from specdec.tree import DraftTree, add_children, forward_inputs, node_depths, tree_from_sequences

# root 0 -> 1 -> (3, 4); root -> 2 -> 5 -> 6
PARENTS = [-1, 0, 0, 1, 1, 2, 5]


def test_depths():
    assert node_depths(PARENTS) == [0, 1, 1, 2, 2, 2, 3]
    with pytest.raises(ValueError):
        node_depths([-1, 2, 0])


def test_add_children_merges_duplicate_draws():
    tree = DraftTree()
    q = torch.tensor([0.5, 0.3, 0.2])
    idx = add_children(tree, 0, [1, 0, 1], q, [0.3, 0.5, 0.3])
    assert idx == [1, 2, 1]
    assert tree.tokens == [-1, 1, 0] and tree.parents == [-1, 0, 0]
    assert tree.drafts[0] == [1, 0, 1] and tree.draft_probs[0] is q
    assert tree.children(0) == {1: 1, 0: 2}
    kid = add_children(tree, 1, [2], q, [0.2])
    assert tree.parents[kid[0]] == 1 and tree.path_prob[kid[0]] == pytest.approx(0.3 * 0.2)
    assert tree.depths() == [0, 1, 1, 2]
    with pytest.raises(ValueError):
        add_children(tree, 0, [2], q)


def test_trie_from_sequences():
    tree = tree_from_sequences([[5, 6, 7], [5, 8], [9], [5, 6]])
    assert tree.tokens == [-1, 5, 6, 7, 8, 9]
    assert tree.parents == [-1, 0, 1, 2, 1, 0]
    assert tree.drafts[0] == [5, 9] and tree.drafts[1] == [6, 8] and tree.drafts[3] is None
    assert all(tree.is_deterministic(i) for i in (0, 1, 2))
    assert tree_from_sequences([]).num_drafted == 0


def test_forward_inputs_with_and_without_pending():
    tree = tree_from_sequences([[5, 6], [9]])
    toks, pars, index = forward_inputs(tree, pending=None)
    assert toks == [5, 6, 9] and pars == [-1, 0, -1] and index == [-1, 0, 1, 2]
    toks, pars, index = forward_inputs(tree, pending=4)
    assert toks == [4, 5, 6, 9] and pars == [-1, 0, 1, 0] and index == [0, 1, 2, 3]
    toks, pars, index = forward_inputs(DraftTree(), pending=None)
    assert toks == [] and index == [-1]
